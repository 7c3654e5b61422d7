// If's and Loop's native steps (kernels/ops/control_flow.py and loop.py bind them). Each calls its sub-programs
// through their ProgramCalls (program_call.h). Whatever the step was not built for (a condition or trip count of
// another dtype or size, an omitted input, zero iterations, a scan output whose shape changes) declines before or
// instead of returning, and the op's Python kernel runs, which gives the result or raises the error users see.
#include "control_flow_steps.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "native_steps.h"
#include "program_call.h"

namespace py = pybind11;

namespace npu_ep {

namespace {

// A one-element array of this dtype, or nullptr.
const void* Scalar(PyObject* v, const py::dtype& dtype) {
  if (!py::isinstance<py::array>(v)) return nullptr;
  auto a = py::reinterpret_borrow<py::array>(v);
  if (a.size() != 1 || a.dtype().num() != dtype.num()) return nullptr;
  return a.data();
}

bool TrueScalar(PyObject* v, bool* out) {
  const void* data = Scalar(v, py::dtype::of<bool>());
  if (data == nullptr) return false;
  *out = *static_cast<const bool*>(data);
  return true;
}

ProgramCall* ProgramOf(const py::object& call) {
  ProgramCall* program = AsProgramCall(call);
  if (program == nullptr) throw py::type_error("a sub-program's call must be a ProgramCall");
  return program;
}

// The items of `args` at `take` (borrowed, then owned by the returned list), or false when one is omitted.
bool Take(PyObject* args, const std::vector<Py_ssize_t>& take, std::vector<py::object>* out) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  for (const Py_ssize_t i : take) {
    PyObject* v = i < n ? PyTuple_GET_ITEM(args, i) : Py_None;
    if (v == Py_None) return false;
    out->push_back(py::reinterpret_borrow<py::object>(v));
  }
  return true;
}

py::tuple AsTuple(const std::vector<py::object>& items) {
  py::tuple t(items.size());
  for (size_t k = 0; k < items.size(); ++k) t[k] = items[k];
  return t;
}

struct Branch {
  py::object call;                // the branch program's ProgramCall (kept alive); None for a forwarding branch
  ProgramCall* program = nullptr;  // nullptr: the branch forwards `take` as its outputs
  std::vector<Py_ssize_t> take;    // If input per program input, or per output when forwarding
};

// If: input 0, a one-element bool array, picks the then (0) or else (1) branch.
class BranchStep : public NativeStep {
 public:
  BranchStep(const py::tuple& branches, const py::list& guards) : guards_(guards) {
    if (branches.size() != 2) throw py::value_error("BranchStep: two branches (then, else)");
    for (size_t b = 0; b < 2; ++b) {
      auto t = branches[b].cast<py::tuple>();  // (ProgramCall | None, [If input per program input/output])
      Branch& branch = branches_[b];
      branch.call = t[0];
      branch.take = t[1].cast<std::vector<Py_ssize_t>>();
      if (!branch.call.is_none()) branch.program = ProgramOf(branch.call);
    }
  }

  PyObject* Run(PyObject* args) override {
    bool cond = false;
    if (!guards_.Hold() || PyTuple_GET_SIZE(args) == 0 || !TrueScalar(PyTuple_GET_ITEM(args, 0), &cond)) return nullptr;
    const Branch& branch = branches_[cond ? 0 : 1];
    std::vector<py::object> picked;
    if (!Take(args, branch.take, &picked)) return nullptr;  // an input the branch reads was omitted
    py::tuple inputs = AsTuple(picked);
    if (branch.program == nullptr) return inputs.release().ptr();
    return CallProgram(*branch.program, inputs.ptr());
  }

 private:
  Branch branches_[2];
  Guards guards_;
};

// Loop: inputs M (optional int64 trip limit), cond (optional bool), the N carried values, then outer-scope values;
// the body program takes (iteration, condition, carried..., outer values at `outer`) and returns (condition,
// carried..., scan values...); the step returns the final carried values and each scan output's values stacked.
class LoopStep : public NativeStep {
 public:
  LoopStep(const py::object& body, size_t n_carried, std::vector<Py_ssize_t> outer, const py::list& guards)
      : body_(body), program_(ProgramOf(body)), n_carried_(n_carried), outer_(std::move(outer)), guards_(guards) {}

  PyObject* Run(PyObject* args) override {
    if (!guards_.Hold() || PyTuple_GET_SIZE(args) < static_cast<Py_ssize_t>(2 + n_carried_)) return nullptr;
    PyObject* m = PyTuple_GET_ITEM(args, 0);
    PyObject* c = PyTuple_GET_ITEM(args, 1);
    const bool bounded = m != Py_None;
    int64_t limit = 0;
    if (bounded) {
      const void* data = Scalar(m, py::dtype::of<int64_t>());
      if (data == nullptr) return nullptr;
      limit = *static_cast<const int64_t*>(data);
    }
    bool keep_going = true;
    if (c != Py_None && !TrueScalar(c, &keep_going)) return nullptr;
    if (!keep_going || (bounded && limit <= 0)) return nullptr;  // no iteration: the kernel shapes empty scans
    std::vector<Py_ssize_t> carried_at(n_carried_);
    for (size_t j = 0; j < n_carried_; ++j) carried_at[j] = static_cast<Py_ssize_t>(2 + j);
    std::vector<py::object> carried, outer;
    if (!Take(args, carried_at, &carried) || !Take(args, outer_, &outer)) return nullptr;

    py::object cond_value = py::array(py::dtype::of<bool>(), std::vector<py::ssize_t>{});
    *static_cast<bool*>(py::reinterpret_borrow<py::array>(cond_value).mutable_data()) = true;
    std::vector<std::vector<py::object>> scans;
    for (int64_t i = 0; keep_going && (!bounded || i < limit); ++i) {
      py::array_t<int64_t> iteration(std::vector<py::ssize_t>{});
      *iteration.mutable_data() = i;
      py::tuple inputs(2 + n_carried_ + outer.size());  // a new tuple per call: the body may keep its inputs
      inputs[0] = iteration;
      inputs[1] = cond_value;
      for (size_t j = 0; j < n_carried_; ++j) inputs[2 + j] = carried[j];
      for (size_t k = 0; k < outer.size(); ++k) inputs[2 + n_carried_ + k] = outer[k];
      PyObject* raw = CallProgram(*program_, inputs.ptr());
      if (raw == nullptr) return nullptr;
      auto outs = py::reinterpret_steal<py::object>(raw);
      if (!PyTuple_Check(raw) || PyTuple_GET_SIZE(raw) < static_cast<Py_ssize_t>(1 + n_carried_)) return nullptr;
      cond_value = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(raw, 0));
      if (!TrueScalar(cond_value.ptr(), &keep_going)) return nullptr;  // the kernel names the bad condition
      for (size_t j = 0; j < n_carried_; ++j)
        carried[j] = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(raw, static_cast<Py_ssize_t>(1 + j)));
      const size_t n_scan = static_cast<size_t>(PyTuple_GET_SIZE(raw)) - 1 - n_carried_;
      scans.resize(n_scan);
      for (size_t k = 0; k < n_scan; ++k)
        scans[k].push_back(
            py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(raw, static_cast<Py_ssize_t>(1 + n_carried_ + k))));
    }
    std::vector<py::object> results = std::move(carried);
    for (const auto& values : scans) {
      py::object stacked = Stack(values);
      if (stacked.is_none()) return nullptr;  // a scan value changed shape or dtype: the kernel raises
      results.push_back(std::move(stacked));
    }
    return AsTuple(results).release().ptr();
  }

 private:
  // The values stacked on a new leading axis (numpy's stack), or None when their shapes or dtypes differ.
  static py::object Stack(const std::vector<py::object>& values) {
    std::vector<py::array> rows;
    for (const py::object& v : values) {
      auto row = py::array::ensure(v, py::array::c_style);
      if (!row) {
        PyErr_Clear();
        return py::none();
      }
      if (!rows.empty() && (row.dtype().num() != rows[0].dtype().num() || row.ndim() != rows[0].ndim() ||
                            !std::equal(row.shape(), row.shape() + row.ndim(), rows[0].shape())))
        return py::none();
      rows.push_back(std::move(row));
    }
    std::vector<py::ssize_t> dims{static_cast<py::ssize_t>(rows.size())};
    dims.insert(dims.end(), rows[0].shape(), rows[0].shape() + rows[0].ndim());
    py::array out(rows[0].dtype(), dims);
    auto* dst = static_cast<char*>(out.mutable_data());
    const auto row_bytes = static_cast<size_t>(rows[0].nbytes());
    for (size_t k = 0; k < rows.size(); ++k) std::memcpy(dst + k * row_bytes, rows[k].data(), row_bytes);
    return out;
  }

  py::object body_;  // keeps program_ alive
  ProgramCall* program_;
  size_t n_carried_;
  std::vector<Py_ssize_t> outer_;
  Guards guards_;
};

}  // namespace

void RegisterControlFlowSteps(py::module_& m) {
  py::class_<BranchStep, NativeStep>(m, "BranchStep",
                                     "If: input 0 (a one-element bool array) picks branches[0] (then) or [1] "
                                     "(else), each (ProgramCall | None, [If input index]): the program called with "
                                     "those inputs, or with None those inputs forwarded as the outputs; guards as "
                                     "CallStep's")
      .def(py::init<const py::tuple&, const py::list&>(), py::arg("branches"), py::arg("guards"));
  py::class_<LoopStep, NativeStep>(m, "LoopStep",
                                   "Loop: the body's ProgramCall run per iteration with (i, cond, n_carried values, "
                                   "the Loop inputs at `outer`); returns the carried values and the scan outputs "
                                   "stacked; guards as CallStep's")
      .def(py::init<const py::object&, size_t, std::vector<Py_ssize_t>, const py::list&>(), py::arg("body"),
           py::arg("n_carried"), py::arg("outer"), py::arg("guards"));
}

}  // namespace npu_ep
