// The native steps ep/step_binding.py binds (see native_steps.h): a memoized step (its inputs are shapes or small
// values that repeat from call to call), a shape step (Shape of any input), a view step (a reshape-like op on a
// contiguous input) and a call step (a native kernel with the arguments its Python kernel would pass). Each checks the
// inputs it was bound for on every call and declines anything else, so a data-dependent shape never gets a stale
// answer.
#include "native_steps.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "output_buffers.h"

namespace py = pybind11;

namespace npu_ep {

bool SameShape(const py::array& a, const std::vector<py::ssize_t>& dims) {
  if (a.ndim() != static_cast<py::ssize_t>(dims.size())) return false;
  const py::ssize_t* shape = a.shape();
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] >= 0 && shape[i] != dims[i]) return false;  // a negative bound dim takes any extent
  return true;
}

namespace {

// SameShape on numpy's own fields.
bool SameDims(const py::detail::PyArray_Proxy* a, const std::vector<py::ssize_t>& dims) {
  if (a->nd != static_cast<int>(dims.size())) return false;
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] >= 0 && a->dimensions[i] != dims[i]) return false;  // a negative bound dim takes any extent
  return true;
}

// A function this extension defines with pybind11 (m.def): a builtin function whose self is its function record.
bool IsCppFunction(const py::handle& fn) {
  return PyCFunction_Check(fn.ptr()) && PyCFunction_GET_SELF(fn.ptr()) != nullptr &&
         py::detail::function_record_ptr_from_PyObject(PyCFunction_GET_SELF(fn.ptr())) != nullptr;
}

// C++ code of this extension's: a pybind11 function, a method of one of its classes bound to an instance
// (BoundNBits.half), or an instance whose __call__ is one (a BoundNBits step).
bool IsCppCallable(const py::handle& fn) {
  if (IsCppFunction(fn)) return true;
  if (PyMethod_Check(fn.ptr())) return IsCppFunction(PyMethod_GET_FUNCTION(fn.ptr()));
  const py::object call = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(fn.ptr())), "__call__"));
  if (!call) {
    PyErr_Clear();
    return false;
  }
  return PyInstanceMethod_Check(call.ptr()) && IsCppFunction(PyInstanceMethod_GET_FUNCTION(call.ptr()));
}

// What one input must be for a bound step to apply.
struct Expected {
  enum Kind { kNone, kShape, kValue } kind = kNone;
  int dtype = -1;
  std::vector<py::ssize_t> dims;
  std::string bytes;  // kValue: the C-order data
};

bool Matches(const Expected& e, PyObject* v) {
  if (e.kind == Expected::kNone) return v == Py_None;
  if (!py::detail::npy_api::get().PyArray_Check_(v)) return false;
  const auto* a = py::detail::array_proxy(v);  // read in place: no dtype object per input
  const auto* descr = py::detail::array_descriptor_proxy(a->descr);
  if (descr->type_num != e.dtype || !SameDims(a, e.dims)) return false;
  if (e.kind == Expected::kShape) return true;
  if (!(a->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) return false;
  return static_cast<size_t>(py::reinterpret_borrow<py::array>(v).nbytes()) == e.bytes.size() &&
         std::memcmp(a->data, e.bytes.data(), e.bytes.size()) == 0;
}

Expected ParseExpected(const py::handle& h) {
  Expected e;
  if (h.is_none()) return e;
  auto t = h.cast<py::tuple>();  // ("shape", dtype, dims) or ("value", array)
  auto kind = t[0].cast<std::string>();
  if (kind == "shape" && t.size() == 3) {
    e.kind = Expected::kShape;
    e.dtype = py::dtype::from_args(t[1]).num();
    e.dims = t[2].cast<std::vector<py::ssize_t>>();
    return e;
  }
  if (kind != "value" || t.size() != 2)
    throw py::value_error("expected input: ('shape', dtype, dims) or ('value', array)");
  auto a = py::array::ensure(t[1], py::array::c_style);
  if (!a) throw py::value_error("expected input: not an array");
  e.kind = Expected::kValue;
  e.dtype = a.dtype().num();
  e.dims.assign(a.shape(), a.shape() + a.ndim());
  e.bytes.assign(static_cast<const char*>(a.data()), static_cast<size_t>(a.nbytes()));
  return e;
}

// Outputs computed once: while every input is what it was (same dtype and shape; same bytes for "value" inputs),
// the step's outputs are the kept ones. The kept arrays are read-only, so no consumer can change them.
class MemoStep : public NativeStep {
 public:
  MemoStep(const py::list& expected, py::tuple outputs) : outputs_(std::move(outputs)) {
    for (const py::handle h : expected) expected_.push_back(ParseExpected(h));
    for (const py::handle o : outputs_) {
      if (!py::isinstance<py::array>(o) || (py::reinterpret_borrow<py::array>(o).writeable()))
        throw py::value_error("a memoized output must be a read-only array");
    }
  }

  PyObject* Run(PyObject* args) override {
    if (PyTuple_GET_SIZE(args) != static_cast<Py_ssize_t>(expected_.size())) return nullptr;
    for (size_t k = 0; k < expected_.size(); ++k)
      if (!Matches(expected_[k], PyTuple_GET_ITEM(args, static_cast<Py_ssize_t>(k)))) return nullptr;
    return outputs_.inc_ref().ptr();
  }
  bool NumpyFree() const override { return true; }

 private:
  std::vector<Expected> expected_;
  py::tuple outputs_;
};

// Step inputs that must hold the small values a step was bound for (a shape or axes computed from shapes), given
// as [(input index, array)]; with `omitted_from`, every other input from that index on must be omitted (None).
class FixedInputs {
 public:
  FixedInputs(const py::list& fixed, size_t omitted_from = SIZE_MAX) : omitted_from_(omitted_from) {
    for (const py::handle h : fixed) {
      auto t = h.cast<py::tuple>();
      fixed_.emplace_back(t[0].cast<size_t>(), ParseExpected(py::make_tuple("value", t[1])));
    }
  }
  bool Hold(PyObject* args) const {
    const auto n = static_cast<size_t>(PyTuple_GET_SIZE(args));
    for (const auto& [k, e] : fixed_)
      if (k >= n || !Matches(e, PyTuple_GET_ITEM(args, static_cast<Py_ssize_t>(k)))) return false;
    for (size_t k = omitted_from_; k < n; ++k) {
      if (PyTuple_GET_ITEM(args, static_cast<Py_ssize_t>(k)) == Py_None) continue;
      bool is_fixed = false;
      for (const auto& f : fixed_) is_fixed = is_fixed || f.first == k;
      if (!is_fixed) return false;
    }
    return true;
  }

 private:
  std::vector<std::pair<size_t, Expected>> fixed_;
  size_t omitted_from_;
};

// Input 0 reshaped (Reshape/Squeeze/Unsqueeze/Flatten, Identity) when it has the bound shape: numpy's reshape, a
// view where the layout allows one, else a copy, as the kernels' own; the other inputs are omitted or hold the
// bound values (FixedInputs).
class ViewStep : public NativeStep {
 public:
  ViewStep(std::vector<py::ssize_t> in_dims, std::vector<py::ssize_t> out_dims, size_t n_inputs, const py::list& fixed)
      : in_dims_(std::move(in_dims)), out_dims_(std::move(out_dims)), n_inputs_(n_inputs), fixed_(fixed, 1) {}

  PyObject* Run(PyObject* args) override {
    if (PyTuple_GET_SIZE(args) != static_cast<Py_ssize_t>(n_inputs_) || !fixed_.Hold(args)) return nullptr;
    PyObject* x = PyTuple_GET_ITEM(args, 0);
    if (!py::isinstance<py::array>(x)) return nullptr;
    auto a = py::reinterpret_borrow<py::array>(x);
    if (!SameShape(a, in_dims_)) return nullptr;
    PyObject* view = CView(x);
    if (view == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      try {
        view = a.reshape(out_dims_).release().ptr();
      } catch (py::error_already_set& e) {
        e.restore();
        return nullptr;
      }
    }
    return view;  // the one output as itself
  }
  bool NumpyFree() const override { return true; }  // a reshape (a copy at most): no arithmetic

 private:
  // What numpy's reshape makes of an exact, C-contiguous ndarray (its C strides, its flags, base = x, collapsed
  // as numpy collapses it), built without numpy's reshape; nullptr without an error for any other x (reshape takes it).
  PyObject* CView(PyObject* x) const {
    auto& api = py::detail::npy_api::get();
    if (Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) return nullptr;  // a subclass: its own
    const auto* a = py::detail::array_proxy(x);
    if (!(a->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) return nullptr;
    Py_INCREF(a->descr);  // NewFromDescr steals it
    PyObject* view =
        api.PyArray_NewFromDescr_(api.PyArray_Type_, a->descr, static_cast<int>(out_dims_.size()), out_dims_.data(),
                                  nullptr, a->data, a->flags & ~py::detail::npy_api::NPY_ARRAY_OWNDATA_, nullptr);
    if (view == nullptr) return nullptr;
    Py_INCREF(x);
    if (api.PyArray_SetBaseObject_(view, x) < 0) {  // steals x
      Py_DECREF(view);
      return nullptr;
    }
    return view;
  }

  std::vector<py::ssize_t> in_dims_, out_dims_;
  size_t n_inputs_;
  FixedInputs fixed_;
};

}  // namespace

Guards::Guards(const py::list& guards) {
  for (const py::handle h : guards) {
    auto t = h.cast<py::tuple>();
    if (t.size() == 2) {
      auto counter = t[0].cast<py::array>();
      if (counter.dtype().num() != py::dtype::of<int64_t>().num() || counter.size() != 1)
        throw py::value_error("a generation guard's counter is an int64 array of one element");
      const auto* now = static_cast<const int64_t*>(counter.data());
      generations_.push_back({std::move(counter), now, t[1].cast<int64_t>()});
    } else {
      entries_.push_back({t[0].cast<py::dict>(), t[1].cast<py::object>(), t[2].cast<py::object>()});
    }
  }
}

bool Guards::Hold() const {
  for (const Generation& g : generations_)
    if (*g.now != g.expected) return false;
  for (const DictEntry& g : entries_) {
    PyObject* now = PyDict_GetItemWithError(g.dict.ptr(), g.key.ptr());
    if (now == nullptr && PyErr_Occurred()) return false;
    if ((now == nullptr ? Py_None : now) != g.expected.ptr()) return false;
  }
  return true;
}

namespace {

// One call's arguments as a vectorcall array (no tuple built per call): the template's items borrowed (the step
// holds the template), the step inputs borrowed (the loop's args tuple holds them), and what is made per call (a
// reshaped view, ORT's output buffer) kept alive here until the call returns.
class CallArgs {
 public:
  explicit CallArgs(const py::tuple& fixed) : n_(fixed.size()) {
    if (n_ > kInline) {
      heap_.resize(n_);
      owned_heap_.resize(n_);
    }
    PyObject** v = slots();
    for (size_t i = 0; i < n_; ++i) v[i] = PyTuple_GET_ITEM(fixed.ptr(), static_cast<Py_ssize_t>(i));
  }
  void Borrow(size_t i, PyObject* o) { slots()[i] = o; }
  void Own(size_t i, py::object o) {
    slots()[i] = o.ptr();
    (n_ > kInline ? owned_heap_[i] : owned_inline_[i]) = std::move(o);
  }
  PyObject* const* data() { return slots(); }

 private:
  PyObject** slots() { return n_ > kInline ? heap_.data() : inline_; }
  static constexpr size_t kInline = 10;
  size_t n_;
  PyObject* inline_[kInline] = {};
  py::object owned_inline_[kInline];
  std::vector<PyObject*> heap_;
  std::vector<py::object> owned_heap_;
};

// numpy's ufunc call info (`ufunc._resolve_dtypes_and_context` / `_get_strided_loop`, the capsule named
// "numpy_1.24_ufunc_call_info"), as numpy documents its layout: the strided loop numpy's own call runs for the
// resolved dtypes and strides, its context and data.
struct UfuncCallInfo {
  int (*strided_loop)(void* context, char* const* data, const Py_ssize_t* dimensions, const Py_ssize_t* strides,
                      void* auxdata);
  void* context;
  void* auxdata;
  unsigned char requires_pyapi;
  unsigned char no_floatingpoint_errors;
};

// numpy releases the GIL around a ufunc's loop from this many elements on (NPY_BEGIN_THREADS_THRESHOLDED).
constexpr Py_ssize_t kLoopWithoutGil = 500;

// A native kernel called straight from the loop with the arguments its Python kernel would pass for the bound
// shapes: a template of fixed arguments with the step's inputs put in (checked: dtype, shape, C order; viewed with
// another shape where the kernel wants one), the result's parts reshaped to the outputs' shapes (and sliced along
// the last axis where the outputs are a group's column slices). A kernel returning None declines values it cannot
// take exactly (the Python kernel runs); Guards keep the step to its setting. An output that is also an output of
// the partition can be passed in as ORT's own buffer (PartitionOutput: None outside a partition call), so the
// kernel writes it in place and the bridge copies nothing. The last len(keywords) arguments go by those keyword
// names (a ufunc's out=, which np.maximum/np.minimum no longer take by position), so no Python wrapper is needed.
class CallStep : public NativeStep {
 public:
  CallStep(py::object fn, py::tuple args, const py::list& inputs, const py::list& outputs, const py::list& guards,
           const py::list& ort_outputs, const py::list& fixed, const py::tuple& keywords)
      : fn_(std::move(fn)), args_(std::move(args)), fixed_(fixed), guards_(guards) {
    if (keywords.size() > args_.size()) throw py::value_error("more keywords than arguments");
    for (const py::handle k : keywords)
      if (!PyUnicode_Check(k.ptr())) throw py::type_error("a keyword is a str");
    if (keywords.size() > 0) kwnames_ = keywords;
    for (const py::handle h : ort_outputs) {  // (argument index, ORT output index, dims)
      auto t = h.cast<py::tuple>();
      OrtOut o{t[0].cast<Py_ssize_t>(), t[1].cast<size_t>(), t[2].cast<std::vector<int64_t>>()};
      if (o.arg < 0 || o.arg >= static_cast<Py_ssize_t>(args_.size())) throw py::value_error("output argument index");
      ort_outputs_.push_back(std::move(o));
    }
    // (argument index, step input index, dtype, shape, view shape | None[, any layout])
    for (const py::handle h : inputs) {
      auto t = h.cast<py::tuple>();
      In in;
      in.arg = t[0].cast<Py_ssize_t>();
      in.input = t[1].cast<Py_ssize_t>();
      in.dtype = py::dtype::from_args(t[2]).num();
      in.dims = t[3].cast<std::vector<py::ssize_t>>();
      if (!t[4].is_none()) in.view = t[4].cast<std::vector<py::ssize_t>>();
      in.any_layout = t.size() > 5 && t[5].cast<bool>();
      if (in.any_layout && !in.view.empty()) throw py::value_error("a viewed input must be C-contiguous");
      if (in.arg < 0 || in.arg >= static_cast<Py_ssize_t>(args_.size())) throw py::value_error("input argument index");
      inputs_.push_back(std::move(in));
    }
    for (const py::handle h : outputs) {  // (result index | -1 for the whole result, shape | None[, (start, stop)])
      auto t = h.cast<py::tuple>();
      Out out;
      out.index = t[0].cast<Py_ssize_t>();
      if (!t[1].is_none()) out.dims = t[1].cast<std::vector<py::ssize_t>>();
      if (t.size() > 2) {  // a column slice of the last axis (a group's outputs are slices of one product)
        auto cols = t[2].cast<std::pair<py::ssize_t, py::ssize_t>>();
        out.columns = py::make_tuple(py::ellipsis(), py::slice(cols.first, cols.second, 1));
      }
      outputs_.push_back(std::move(out));
    }
    whole_ = outputs_.size() == 1 && outputs_[0].index < 0 && outputs_[0].dims.empty() && outputs_[0].columns.is_none();
    numpy_free_ = IsCppCallable(fn_);
    for (const py::handle a : args_) numpy_free_ = numpy_free_ && !PyCallable_Check(a.ptr());
    FindUfuncLoop();
  }

  // fn is a C++ kernel (IsCppCallable) given no callable (a ufunc it would call): it does no numpy arithmetic.
  bool NumpyFree() const override { return numpy_free_; }
  bool RunsUfuncLoop() const { return loop_ != nullptr; }
  // With numpy's loop, a call that runs it needs no error state: it is ensured only before calling the ufunc.
  bool EnsuresQuiet() const override { return loop_ != nullptr; }

  PyObject* Run(PyObject* step_args) override { return RunQuiet(step_args, nullptr); }

  PyObject* RunQuiet(PyObject* step_args, NumpyQuiet* quiet) override {
    if (!guards_.Hold() || !fixed_.Hold(step_args)) return nullptr;
    auto& api = py::detail::npy_api::get();
    CallArgs call(args_);
    for (const In& in : inputs_) {
      if (in.input >= PyTuple_GET_SIZE(step_args)) return nullptr;
      PyObject* x = PyTuple_GET_ITEM(step_args, in.input);
      if (!api.PyArray_Check_(x)) return nullptr;
      const auto* p = py::detail::array_proxy(x);  // read in place: no dtype object per input
      if (py::detail::array_descriptor_proxy(p->descr)->type_num != in.dtype || !SameDims(p, in.dims)) return nullptr;
      if (!in.any_layout && !(p->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) return nullptr;
      if (in.view.empty()) {
        call.Borrow(static_cast<size_t>(in.arg), x);
      } else {
        call.Own(static_cast<size_t>(in.arg), py::reinterpret_borrow<py::array>(x).reshape(in.view));
      }
    }
    for (const OrtOut& o : ort_outputs_) call.Own(static_cast<size_t>(o.arg), PartitionOutput(o.index, o.dims));
    if (loop_ != nullptr) {
      if (PyObject* outs = RunUfuncLoop(call.data())) return outs;
      if (PyErr_Occurred()) return nullptr;
    }
    if (quiet != nullptr && !NumpyFree() && !quiet->Ensure()) return nullptr;
    const size_t n_keywords = kwnames_ ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames_.ptr())) : 0;
    PyObject* result =
        PyObject_Vectorcall(fn_.ptr(), call.data(), args_.size() - n_keywords, kwnames_ ? kwnames_.ptr() : nullptr);
    if (result == nullptr) return nullptr;  // the kernel's error: the loop names the node
    auto res = py::reinterpret_steal<py::object>(result);
    if (res.is_none()) return nullptr;  // the kernel declines these values (the Python kernel runs)
    if (whole_) return PyTuple_Check(res.ptr()) ? PyTuple_Pack(1, res.ptr()) : res.release().ptr();
    try {
      py::tuple outs(outputs_.size());
      for (size_t i = 0; i < outputs_.size(); ++i) {
        const Out& o = outputs_[i];
        py::object part = o.index < 0 ? res : py::reinterpret_borrow<py::object>(res[py::int_(o.index)]);
        if (!o.dims.empty()) part = py::reinterpret_borrow<py::array>(part).reshape(o.dims);
        outs[i] = o.columns.is_none() ? part : part[o.columns];
      }
      return outs.release().ptr();
    } catch (py::error_already_set& e) {
      e.restore();
      return nullptr;
    }
  }

 private:
  struct In {
    Py_ssize_t arg = 0, input = 0;
    int dtype = -1;
    std::vector<py::ssize_t> dims, view;
    bool any_layout = false;  // fn takes strided arrays (a ufunc, a view): no C-contiguity required
  };
  struct OrtOut {
    Py_ssize_t arg;
    size_t index;
    std::vector<int64_t> dims;
  };
  struct Out {
    Py_ssize_t index = -1;
    std::vector<py::ssize_t> dims;
    py::object columns = py::none();  // (Ellipsis, slice) or None
  };
  // A ufunc called as fn(*operands, out=ORT's buffer) on step inputs of one shape (no broadcasting) and constant
  // 0-d arrays of the template (stride 0, as numpy passes them): numpy's own strided loop for their dtypes, found
  // once, so a call whose operands and ORT's buffer are C-order and aligned runs it over all elements (what numpy's
  // call does for such operands: one loop call, no cast, no buffering) without numpy's dispatch. Anything else (no
  // buffer lent, another layout, overlapping memory) calls the ufunc.
  void FindUfuncLoop() {
    if (std::strcmp(Py_TYPE(fn_.ptr())->tp_name, "numpy.ufunc") != 0 || !kwnames_ || !whole_) return;
    if (PyTuple_GET_SIZE(kwnames_.ptr()) != 1 ||
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames_.ptr(), 0), "out") != 0)
      return;
    const auto nin = static_cast<Py_ssize_t>(args_.size()) - 1;
    if (nin < 1 || nin + 1 > kMaxLoopArgs || ort_outputs_.size() != 1 || ort_outputs_[0].arg != nin ||
        inputs_.empty() || static_cast<Py_ssize_t>(inputs_.size()) > nin)
      return;
    const std::vector<int64_t>& dims = ort_outputs_[0].dims;
    std::vector<int> types(static_cast<size_t>(nin), -1);
    for (int64_t d : dims)
      if (d < 0) return;
    for (const In& in : inputs_) {
      if (in.arg < 0 || in.arg >= nin || types[static_cast<size_t>(in.arg)] >= 0 || !in.view.empty()) return;
      if (!SameFlat(in.dims.data(), in.dims.size(), dims)) return;
      types[static_cast<size_t>(in.arg)] = in.dtype;
    }
    loop_kind_.assign(static_cast<size_t>(nin), kStepInput);
    for (Py_ssize_t k = 0; k < nin; ++k) {  // the other operands: the template's arrays
      if (types[static_cast<size_t>(k)] >= 0) continue;
      PyObject* c = PyTuple_GET_ITEM(args_.ptr(), k);
      const bool zero_dim = ZeroDim(c, -1);
      if (!zero_dim && !FullConstant(c, -1, dims)) return;
      types[static_cast<size_t>(k)] = py::detail::array_descriptor_proxy(py::detail::array_proxy(c)->descr)->type_num;
      loop_kind_[static_cast<size_t>(k)] = zero_dim ? kZeroDim : kFullConstant;
    }
    loop_types_ = types;
    loop_count_ = 1;
    for (int64_t d : dims) loop_count_ *= d;
    if (loop_count_ < 2) return;  // numpy passes a one-element call other strides
    try {
      py::tuple dtypes(nin + 1);
      for (Py_ssize_t k = 0; k < nin; ++k) dtypes[k] = py::dtype(types[static_cast<size_t>(k)]);
      dtypes[nin] = py::none();
      if (fn_.attr("nin").cast<Py_ssize_t>() != nin || fn_.attr("nout").cast<int>() != 1) return;
      auto resolved = fn_.attr("_resolve_dtypes_and_context")(dtypes).cast<py::tuple>();
      auto chosen = resolved[0].cast<py::tuple>();
      py::tuple strides(nin + 1);
      for (Py_ssize_t k = 0; k <= nin; ++k) {
        auto dt = chosen[k].cast<py::dtype>();
        if (k < nin && dt.num() != types[static_cast<size_t>(k)]) return;  // numpy would cast
        const bool constant = k < nin && loop_kind_[static_cast<size_t>(k)] == kZeroDim;
        strides[k] = constant ? 0 : dt.itemsize();
        loop_strides_.push_back(constant ? 0 : dt.itemsize());
        loop_itemsizes_.push_back(dt.itemsize());
      }
      loop_out_type_ = chosen[nin].cast<py::dtype>().num();
      py::object info = resolved[1];
      fn_.attr("_get_strided_loop")(info, py::arg("fixed_strides") = strides);
      auto* call_info = static_cast<const UfuncCallInfo*>(PyCapsule_GetPointer(info.ptr(), kUfuncCallInfo));
      if (call_info == nullptr) throw py::error_already_set();
      if (call_info->strided_loop == nullptr || call_info->requires_pyapi) return;
      loop_info_ = std::move(info);
      loop_ = call_info;
    } catch (py::error_already_set&) {
      PyErr_Clear();  // a numpy without this interface: the ufunc is called
      loop_strides_.clear();
      loop_itemsizes_.clear();
    }
  }

  // An exact, aligned ndarray of no dimensions in the machine's byte order (of dtype number `type`, unless < 0):
  // an operand numpy's one loop call reads with stride 0.
  static bool ZeroDim(PyObject* o, int type) {
    auto& api = py::detail::npy_api::get();
    constexpr int kAligned = py::detail::npy_api::NPY_ARRAY_ALIGNED_;
    if (Py_TYPE(o) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) return false;
    const auto* a = py::detail::array_proxy(o);
    return a->nd == 0 && (a->flags & kAligned) && NativeOrder(a->descr) &&
           (type < 0 || py::detail::array_descriptor_proxy(a->descr)->type_num == type);
  }

  // An operand's shape `a` whose elements numpy pairs one to one in C order with an output of shape `b`: no higher
  // rank, and equal once leading 1s are dropped (broadcasting that only prepends axes of 1, such as a [C] bias with a
  // [1, C] input, runs one loop over all elements).
  static bool SameFlat(const py::ssize_t* a, size_t na, const std::vector<int64_t>& b) {
    if (na > b.size()) return false;  // numpy's result would have a's rank: `out` of b's does not broadcast
    size_t i = 0, j = 0;
    while (i < na && a[i] == 1) ++i;
    while (j < b.size() && b[j] == 1) ++j;
    if (na - i != b.size() - j) return false;
    for (; i < na; ++i, ++j)
      if (a[i] != b[j]) return false;
    return true;
  }

  // An exact, aligned, C-contiguous ndarray in the machine's byte order (of dtype number `type`, unless < 0) whose
  // elements pair one to one with the output's `dims` (SameFlat): an operand of the template read with the output's
  // strides.
  static bool FullConstant(PyObject* o, int type, const std::vector<int64_t>& dims) {
    auto& api = py::detail::npy_api::get();
    constexpr int kLayout = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
    if (Py_TYPE(o) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) return false;
    const auto* a = py::detail::array_proxy(o);
    return (a->flags & kLayout) == kLayout && NativeOrder(a->descr) &&
           (type < 0 || py::detail::array_descriptor_proxy(a->descr)->type_num == type) &&
           SameFlat(a->dimensions, static_cast<size_t>(a->nd), dims);
  }

  // The step's outputs by numpy's strided loop on argv (the operands, then ORT's buffer), or nullptr: with a Python
  // error when the loop failed, else when these arrays are not ones numpy would run in one loop call.
  PyObject* RunUfuncLoop(PyObject* const* argv) const {
    auto& api = py::detail::npy_api::get();
    constexpr int kAligned = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
    constexpr int kWritten = kAligned | py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    const size_t nin = loop_strides_.size() - 1;
    PyObject* out = argv[nin];
    // exact arrays only: a subclass's __array_ufunc__ or __array_wrap__ would change the call
    if (Py_TYPE(out) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) return nullptr;  // None: no buffer lent
    const auto* o = py::detail::array_proxy(out);
    if (!NativeOrder(o->descr) || py::detail::array_descriptor_proxy(o->descr)->type_num != loop_out_type_ ||
        (o->flags & kWritten) != kWritten)
      return nullptr;
    Py_ssize_t n = 1;
    for (int d = 0; d < o->nd; ++d) n *= o->dimensions[d];
    if (n != loop_count_) return nullptr;
    char* data[kMaxLoopArgs];
    const char* out_begin = o->data;
    const char* out_end = out_begin + n * loop_itemsizes_[nin];
    for (size_t k = 0; k < nin; ++k) {
      const int kind = loop_kind_[k];
      const bool constant = kind == kZeroDim;
      // the template's arrays checked again (their dtype or shape may be reassigned); a step input's dtype and shape
      // were checked by Run
      if (kind == kZeroDim        ? !ZeroDim(argv[k], loop_types_[k])
          : kind == kFullConstant ? !FullConstant(argv[k], loop_types_[k], ort_outputs_[0].dims)
                                  : Py_TYPE(argv[k]) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_))
        return nullptr;
      const auto* a = py::detail::array_proxy(argv[k]);  // checked by Run: the bound dtype number and shape
      if ((a->flags & kAligned) != kAligned || !NativeOrder(a->descr)) return nullptr;
      const char* begin = a->data;
      const char* end = begin + (constant ? 1 : n) * loop_itemsizes_[k];
      const bool apart = end <= out_begin || out_end <= begin;
      if (!apart && !(begin == out_begin && kind == kStepInput && loop_strides_[k] == loop_strides_[nin]))
        return nullptr;
      data[k] = a->data;
    }
    data[nin] = o->data;
    int status = 0;
    if (n >= kLoopWithoutGil) {
      py::gil_scoped_release nogil;
      status = loop_->strided_loop(loop_->context, data, &n, loop_strides_.data(), loop_->auxdata);
    } else {
      status = loop_->strided_loop(loop_->context, data, &n, loop_strides_.data(), loop_->auxdata);
    }
    if (status < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "a numpy ufunc loop failed");
      return nullptr;
    }
    Py_INCREF(out);
    return out;  // the one output as itself
  }

  // A dtype in the machine's byte order (numpy would swap another one's bytes around the loop).
  static bool NativeOrder(PyObject* descr) {
    const char order = py::detail::array_descriptor_proxy(descr)->byteorder;
    constexpr char kNative = PY_LITTLE_ENDIAN ? '<' : '>';
    return order == '=' || order == '|' || order == kNative;
  }

  static constexpr const char* kUfuncCallInfo = "numpy_1.24_ufunc_call_info";
  static constexpr Py_ssize_t kMaxLoopArgs = 4;  // operands and the output of a ufunc taken

  py::object fn_;
  py::tuple args_;
  py::object kwnames_;  // the last arguments' keyword names (a tuple), or null
  bool whole_ = false;  // the one output is the whole result, as it is
  bool numpy_free_ = false;
  std::vector<In> inputs_;
  std::vector<Out> outputs_;
  std::vector<OrtOut> ort_outputs_;
  py::object loop_info_;  // numpy's call info of the ufunc's loop (it owns the loop's data), or null
  const UfuncCallInfo* loop_ = nullptr;  // in loop_info_; null: the ufunc is called
  std::vector<Py_ssize_t> loop_strides_;  // per operand, then the output: its itemsize, 0 for a constant operand
  std::vector<Py_ssize_t> loop_itemsizes_;  // per operand, then the output
  enum LoopKind : char { kStepInput, kZeroDim, kFullConstant };
  std::vector<char> loop_kind_;  // per operand: a step input, or the template's 0-d array (stride 0) or full array
  std::vector<int> loop_types_;  // per operand: its dtype number
  Py_ssize_t loop_count_ = 0;  // elements per call
  int loop_out_type_ = -1;  // the output's dtype number
  FixedInputs fixed_;
  Guards guards_;
};

// Shape of any input: its dims from `start` to `end` (ONNX's clamping) as a fresh int64 array, read per call, so
// an input whose shape changes every call (a decoder's attention mask) needs no memo per shape.
class ShapeStep : public NativeStep {
 public:
  ShapeStep(int64_t start, std::optional<int64_t> end) : start_(start), end_(end) {}

  PyObject* Run(PyObject* args) override {
    if (PyTuple_GET_SIZE(args) != 1 || !py::isinstance<py::array>(PyTuple_GET_ITEM(args, 0))) return nullptr;
    auto a = py::reinterpret_borrow<py::array>(PyTuple_GET_ITEM(args, 0));
    const auto rank = static_cast<int64_t>(a.ndim());
    const int64_t first = Clamp(start_, rank), last = std::max(first, Clamp(end_.value_or(rank), rank));
    py::array_t<int64_t> dims(std::vector<py::ssize_t>{static_cast<py::ssize_t>(last - first)});
    for (int64_t i = first; i < last; ++i) dims.mutable_data()[i - first] = static_cast<int64_t>(a.shape(i));
    return dims.release().ptr();  // the one output as itself
  }
  bool NumpyFree() const override { return true; }

 private:
  static int64_t Clamp(int64_t axis, int64_t rank) {
    return std::clamp(axis < 0 ? axis + rank : axis, int64_t{0}, rank);
  }
  int64_t start_;
  std::optional<int64_t> end_;
};

// The first of several native steps that takes the inputs (a step whose inputs alternate between a few shapes:
// a decoder's prefill and decode); declines when none does.
class FirstOfSteps : public NativeStep {
 public:
  explicit FirstOfSteps(const py::list& steps) {
    for (const py::handle h : steps) {
      owners_.push_back(py::reinterpret_borrow<py::object>(h));
      steps_.push_back(h.cast<NativeStep*>());
    }
  }

  PyObject* Run(PyObject* args) override {
    for (NativeStep* step : steps_) {
      PyObject* outs = step->Run(args);
      if (outs != nullptr || PyErr_Occurred()) return outs;
    }
    return nullptr;
  }
  bool NumpyFree() const override {
    for (const NativeStep* step : steps_)
      if (!step->NumpyFree()) return false;
    return true;
  }

 private:
  std::vector<py::object> owners_;
  std::vector<NativeStep*> steps_;
};

}  // namespace

void RegisterNativeSteps(py::module_& m) {
  py::class_<NativeStep>(m, "NativeStep", "A step the program's C++ loop runs without its Python kernel")
      .def(
          "run",
          [](NativeStep& step, const py::tuple& args) -> py::object {
            PyObject* outs = step.Run(args.ptr());
            if (outs == nullptr) {
              if (PyErr_Occurred()) throw py::error_already_set();
              return py::none();
            }
            auto result = py::reinterpret_steal<py::object>(outs);
            return PyTuple_Check(outs) ? result : py::make_tuple(result);  // a one-output step's output as a tuple
          },
          py::arg("args"),
          "The step's outputs for the step inputs `args` (a tuple), as the loop runs it; None when it declines "
          "them (the Python kernel runs then)")
      .def_property_readonly("numpy_free", &NativeStep::NumpyFree,
                             "whether it never reaches numpy's arithmetic (a C++ kernel, a view, kept values): a "
                             "program call sets numpy's error state only before a step that is not");
  py::class_<FirstOfSteps, NativeStep>(m, "FirstOfSteps",
                                       "the outputs of the first of `steps` (native steps) that takes the inputs; "
                                       "declines when none does")
      .def(py::init<const py::list&>(), py::arg("steps"));
  py::class_<MemoStep, NativeStep>(m, "MemoStep",
                                   "Kept outputs, returned while each input is as expected: None (omitted), "
                                   "('shape', dtype, dims), or ('value', array): also the same bytes")
      .def(py::init<const py::list&, py::tuple>(), py::arg("expected"), py::arg("outputs"));
  py::class_<ShapeStep, NativeStep>(m, "ShapeStep",
                                    "Shape's output for any input: its dims from start to end (None: the rank; "
                                    "negative and out-of-range values clamped as ONNX says) as an int64 array")
      .def(py::init<int64_t, std::optional<int64_t>>(), py::arg("start") = 0, py::arg("end") = py::none());
  py::class_<ViewStep, NativeStep>(m, "ViewStep",
                                   "Input 0 of shape in_shape reshaped to out_shape (a view where its layout "
                                   "allows); the node's "
                                   "other n_inputs - 1 inputs must be omitted, or equal the arrays in fixed "
                                   "[(input index, array)]")
      .def(py::init<std::vector<py::ssize_t>, std::vector<py::ssize_t>, size_t, const py::list&>(), py::arg("in_shape"),
           py::arg("out_shape"), py::arg("n_inputs"), py::arg("fixed") = py::list());
  py::class_<CallStep, NativeStep>(
      m, "CallStep",
      "fn(*args) with step inputs put in: inputs [(argument index, input index, dtype, "
      "shape (a dim < 0: any extent), view shape | None[, any layout])]; outputs [(result index | -1, shape | "
      "None[, (start, stop) of the last axis])]; guards [(counter, generation) | (dict, "
      "key, expected object | None)]; ort_outputs [(argument index, ORT output index, "
      "dims)]: ORT's buffer or None; fixed [(input index, array)]: step inputs that must "
      "hold these values; keywords: the names the last arguments go by")
      .def(py::init<py::object, py::tuple, const py::list&, const py::list&, const py::list&, const py::list&,
                    const py::list&, const py::tuple&>(),
           py::arg("fn"), py::arg("args"), py::arg("inputs"), py::arg("outputs"), py::arg("guards"),
           py::arg("ort_outputs") = py::list(), py::arg("fixed") = py::list(), py::arg("keywords") = py::tuple())
      .def_property_readonly("ufunc_loop", &CallStep::RunsUfuncLoop,
                             "whether fn is a ufunc whose own strided loop it runs on C-order operands and ORT's "
                             "buffer (numpy's dispatch skipped; other calls call fn)");
}

}  // namespace npu_ep
