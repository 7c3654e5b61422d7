// If's native step (kernels/ops/control_flow.py binds it): the step's input 0 is the condition, a one-element bool
// array; the chosen branch either forwards some of the If's inputs (an exporter's pass-through branch) or is a
// compiled program called through its ProgramCall with the If inputs it reads, in its own order. Anything else
// (a condition of another dtype or size, an omitted input) declines, and the If's Python kernel runs, which
// raises the error the user should see.
#include "branch_step.h"

#include <pybind11/stl.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "native_steps.h"
#include "program_call.h"

namespace py = pybind11;

namespace npu_ep {

namespace {

struct Branch {
  py::object call;                  // the branch program's ProgramCall (kept alive); None for a forwarding branch
  ProgramCall* program = nullptr;   // nullptr: the branch forwards `take` as its outputs
  std::vector<Py_ssize_t> take;     // If input per program input, or per output when forwarding
};

class BranchStep : public NativeStep {
 public:
  BranchStep(const py::tuple& branches, const py::list& guards) : guards_(guards) {
    if (branches.size() != 2) throw py::value_error("BranchStep: two branches (then, else)");
    for (size_t b = 0; b < 2; ++b) {
      auto t = branches[b].cast<py::tuple>();  // (ProgramCall | None, [If input per program input/output])
      Branch& branch = branches_[b];
      branch.call = t[0];
      branch.take = t[1].cast<std::vector<Py_ssize_t>>();
      if (!branch.call.is_none()) {
        branch.program = AsProgramCall(branch.call);
        if (branch.program == nullptr) throw py::type_error("BranchStep: a branch is not a ProgramCall or None");
      }
    }
  }

  PyObject* Run(PyObject* args) override {
    if (!guards_.Hold()) return nullptr;
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject* cond = n > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None;
    if (!py::isinstance<py::array>(cond)) return nullptr;
    auto c = py::reinterpret_borrow<py::array>(cond);
    if (c.size() != 1 || c.dtype().num() != py::dtype::of<bool>().num()) return nullptr;
    const Branch& branch = branches_[*static_cast<const bool*>(c.data()) ? 0 : 1];
    PyObject* picked = PyTuple_New(static_cast<Py_ssize_t>(branch.take.size()));
    if (picked == nullptr) return nullptr;
    for (size_t k = 0; k < branch.take.size(); ++k) {
      const Py_ssize_t i = branch.take[k];
      PyObject* v = i < n ? PyTuple_GET_ITEM(args, i) : Py_None;
      if (v == Py_None) {  // an input the branch reads was omitted: the Python kernel names it
        Py_DECREF(picked);
        return nullptr;
      }
      Py_INCREF(v);
      PyTuple_SET_ITEM(picked, static_cast<Py_ssize_t>(k), v);
    }
    if (branch.program == nullptr) return picked;
    PyObject* outs = CallProgram(*branch.program, picked);
    Py_DECREF(picked);
    return outs;
  }

 private:
  Branch branches_[2];
  Guards guards_;
};

}  // namespace

void RegisterBranchStep(py::module_& m) {
  py::class_<BranchStep, NativeStep>(m, "BranchStep",
                                     "If: input 0 (a one-element bool array) picks branches[0] (then) or [1] "
                                     "(else), each (ProgramCall | None, [If input index]): the program called with "
                                     "those inputs, or with None those inputs forwarded as the outputs; guards as "
                                     "CallStep's")
      .def(py::init<const py::tuple&, const py::list&>(), py::arg("branches"), py::arg("guards"));
}

}  // namespace npu_ep
