#include "program_call.h"

#include <Python.h>
#include <pybind11/numpy.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "step_loop.h"

namespace py = pybind11;

namespace npu_ep {
namespace {

using Key = std::vector<int64_t>;  // per input: its rank, then its dims

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    size_t h = k.size();
    for (int64_t v : k) h = (h * 1000003u) ^ static_cast<size_t>(v);
    return h;
  }
};

// A signature whose first call has run: what its later calls run, and their count and time (under the GIL).
struct Signature {
  py::object shapes;      // the Python signature, a tuple of shape tuples (the key of Program's stats)
  py::object bound;       // its own StepLoop (with native steps), or None: the program's default loop
  StepLoop* bound_ptr = nullptr;
  uint64_t calls = 0, ns = 0;
  uint64_t last_use = 0;  // the ProgramCall's clock at its latest call: the least recently used one is evicted
  bool evicted = false;   // dropped while a call of it was running: that call counts in late_calls_/late_ns_
  bool observe = false;   // its next call goes to observe (a first call that could not bind everything)
};

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Appends a numpy array's rank and dims to `key`; false for anything else (the Python side then handles it).
bool AppendShape(PyObject* a, Key& key) {
  auto& api = py::detail::npy_api::get();
  if (!api.PyArray_Check_(a)) return false;
  const auto* proxy = py::detail::array_proxy(a);
  key.push_back(proxy->nd);
  key.insert(key.end(), proxy->dimensions, proxy->dimensions + proxy->nd);
  return true;
}

Key KeyOf(const py::tuple& shapes) {
  Key key;
  for (const py::handle shape : shapes) {
    auto dims = shape.cast<py::tuple>();
    key.push_back(static_cast<int64_t>(dims.size()));
    for (const py::handle d : dims) key.push_back(d.cast<int64_t>());
  }
  return key;
}

}  // namespace

class ProgramCall {
 public:
  // observe(inputs) runs a call on the Python side; errstate/quiet: numpy's error-state context variable and its
  // "ignore all" value; loop: the program's default StepLoop.
  // capacity: the signatures kept at most (the least recently used one is dropped to make room).
  ProgramCall(py::object observe, py::object errstate, py::object quiet, py::object loop, size_t capacity)
      : observe_(std::move(observe)), errstate_(std::move(errstate)), quiet_(std::move(quiet)), capacity_(capacity) {
    if (!PyContextVar_CheckExact(errstate_.ptr())) throw py::type_error("errstate must be a contextvars.ContextVar");
    if (capacity_ == 0) throw py::value_error("capacity must be at least 1");
    SetLoop(std::move(loop));
  }

  // elapsed_ns (optional): the call's wall time, so a caller timing it too needs no clock reads of its own.
  PyObject* Call(PyObject* inputs, uint64_t* elapsed_ns = nullptr) {
    const uint64_t t0 = NowNs();
    uint64_t t1 = 0;
    PyObject* out = Dispatch(inputs, t0, t1);
    if (elapsed_ns != nullptr) *elapsed_ns = (t1 != 0 ? t1 : NowNs()) - t0;
    return out;
  }

 private:
  // Call's work: the signature's loop, or observe for a signature that has none yet. t1: the clock when a
  // signature's loop returned (read once for its count and the caller's), else left 0.
  PyObject* Dispatch(PyObject* inputs, uint64_t t0, uint64_t& t1) {
    py::object ordered = Ordered(inputs);
    if (!ordered) return nullptr;
    if (record_) return PyObject_CallOneArg(observe_.ptr(), ordered.ptr());
    Key& key = key_scratch_;  // no allocation per call; only read before anything here can run Python
    key.clear();
    const Py_ssize_t n = PyTuple_GET_SIZE(ordered.ptr());
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!AppendShape(PyTuple_GET_ITEM(ordered.ptr(), i), key))
        return PyObject_CallOneArg(observe_.ptr(), ordered.ptr());
    // Held for the call: kernels release the GIL, and another thread may re-bind or forget this signature.
    std::shared_ptr<Signature> sig;
    if (last_ && key == last_key_) {  // the same shapes as the latest call: no hash and lookup
      sig = last_;
    } else {
      auto it = signatures_.find(key);
      if (it == signatures_.end()) return PyObject_CallOneArg(observe_.ptr(), ordered.ptr());
      sig = it->second;
      last_ = sig;
      last_key_ = key;
    }
    sig->last_use = ++clock_;
    if (sig->observe) return PyObject_CallOneArg(observe_.ptr(), ordered.ptr());
    py::object owner = sig->bound.is_none() ? loop_ : sig->bound;
    StepLoop* loop = sig->bound.is_none() ? loop_ptr_ : sig->bound_ptr;
    PyObject* out = RunQuietly(*loop, ordered.ptr());
    if (out != nullptr) {
      uint64_t& calls = sig->evicted ? late_calls_ : sig->calls;
      uint64_t& ns = sig->evicted ? late_ns_ : sig->ns;
      calls += 1;
      t1 = NowNs();
      ns += t1 - t0;
    }
    return out;
  }

  // numpy's "ignore all" error state for one loop call, from the first step that needs it (NumpyQuiet) to the end,
  // unless it is the state already (a sub-program called from a running program's step: an If branch, a Loop body).
  // It enters a context of the program's own that holds that state (PyContext_Enter swaps the thread's context, no
  // allocation) rather than setting the caller's variable and resetting it (a new mapping each, and a token); so
  // the steps from there on see the caller's other context variables' defaults. Idle contexts are kept per program
  // (under the GIL: a call whose kernel released it may overlap another thread's, which takes another context).
  class LazyQuiet : public NumpyQuiet {
   public:
    explicit LazyQuiet(ProgramCall& call) : call_(call) {}
    bool Ensure() override {
      if (checked_) return true;
      checked_ = true;
      PyObject* now = nullptr;
      if (PyContextVar_Get(call_.errstate_.ptr(), nullptr, &now) < 0) return false;
      const bool already = now == call_.quiet_.ptr();
      Py_XDECREF(now);
      if (already) return true;
      entered_ = call_.QuietContext();
      if (entered_ && PyContext_Enter(entered_.ptr()) == 0) return true;
      entered_ = py::object();
      return false;
    }
    // Leaves the context Ensure entered, keeping it for later calls while it still holds the state; a failed call's
    // error survives. Returns `out`, or nullptr when leaving failed.
    PyObject* Reset(PyObject* out) {
      if (!entered_) return out;
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyObject* now = nullptr;
      const bool keep = PyContextVar_Get(call_.errstate_.ptr(), nullptr, &now) == 0 && now == call_.quiet_.ptr();
      Py_XDECREF(now);
      PyErr_Clear();  // a failed read only drops the context
      if (PyContext_Exit(entered_.ptr()) < 0) {
        Py_XDECREF(out);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return nullptr;
      }
      if (keep) call_.idle_contexts_.push_back(std::move(entered_));
      PyErr_Restore(type, value, tb);
      return out;
    }

   private:
    ProgramCall& call_;
    py::object entered_;
    bool checked_ = false;
  };

  // An idle context holding the program's error state, made when none is (nullptr with a Python error set).
  py::object QuietContext() {
    if (!idle_contexts_.empty()) {
      py::object ctx = std::move(idle_contexts_.back());
      idle_contexts_.pop_back();
      return ctx;
    }
    auto ctx = py::reinterpret_steal<py::object>(PyContext_New());
    if (!ctx || PyContext_Enter(ctx.ptr()) < 0) return py::object();
    PyObject* token = PyContextVar_Set(errstate_.ptr(), quiet_.ptr());
    Py_XDECREF(token);
    if (PyContext_Exit(ctx.ptr()) < 0 || token == nullptr) return py::object();
    return ctx;
  }

  // The loop run with numpy's error state set only if a step needs it, restored afterwards.
  PyObject* RunQuietly(StepLoop& loop, PyObject* ordered) {
    LazyQuiet quiet(*this);
    return quiet.Reset(RunStepLoop(loop, ordered, &quiet));
  }

 public:
  // From now on calls with these input shapes run here, with `bound` (a StepLoop) or, for None, the default loop
  // (a new signature counts as just used); with `observe`, its next call goes to observe instead. A new one beyond the
  // capacity evicts the least recently used other one, returned as [(signature, calls, ns)] so that the caller folds
  // its counts and drops what it keeps for it.
  py::list Track(const py::tuple& shapes, py::object bound, bool observe) {
    StepLoop* ptr = bound.is_none() ? nullptr : AsStepLoop(bound);
    if (!bound.is_none() && ptr == nullptr) throw py::type_error("bound must be a StepLoop or None");
    Key key = KeyOf(shapes);
    auto& slot = signatures_[key];
    if (!slot) {
      slot = std::make_shared<Signature>(Signature{shapes, py::none()});
      slot->last_use = ++clock_;
    }
    slot->bound = std::move(bound);
    slot->bound_ptr = ptr;
    slot->observe = observe;
    py::list evicted;
    while (signatures_.size() > capacity_) evicted.append(EvictLeastRecent(key));
    return evicted;
  }

  size_t size() const { return signatures_.size(); }
  size_t capacity() const { return capacity_; }
  // (calls, ns) of calls that finished after their signature was evicted (they were running meanwhile)
  py::tuple LateCounts() const { return py::make_tuple(late_calls_, late_ns_); }

  void SetLoop(py::object loop) {
    StepLoop* ptr = AsStepLoop(loop);
    if (ptr == nullptr) throw py::type_error("loop must be a StepLoop");
    loop_ = std::move(loop);
    loop_ptr_ = ptr;
  }

  // perm[i]: the position among the partition's inputs of the program's input i; None: the same order.
  void SetPerm(const py::object& perm) {
    perm_.clear();
    if (!perm.is_none())
      for (const py::handle i : perm) perm_.push_back(i.cast<Py_ssize_t>());
  }

  bool record() const { return record_; }
  void set_record(bool on) { record_ = on; }

  // {signature: (calls, ns)} of the calls made here
  py::dict Counts() const {
    py::dict out;
    for (const auto& [key, sig] : signatures_)
      if (sig->calls) out[sig->shapes] = py::make_tuple(sig->calls, sig->ns);
    return out;
  }

 private:
  py::object Ordered(PyObject* inputs) const {
    if (perm_.empty()) return py::reinterpret_borrow<py::object>(inputs);
    const Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    if (n != static_cast<Py_ssize_t>(perm_.size())) {
      PyErr_Format(PyExc_ValueError, "the program takes %zd inputs, the call passed %zd",
                   static_cast<Py_ssize_t>(perm_.size()), n);
      return py::object();
    }
    PyObject* out = PyTuple_New(n);
    if (out == nullptr) return py::object();
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* v = PyTuple_GET_ITEM(inputs, perm_[static_cast<size_t>(i)]);
      Py_INCREF(v);
      PyTuple_SET_ITEM(out, i, v);
    }
    return py::reinterpret_steal<py::object>(out);
  }

  // Removes the least recently used signature other than `keep` (one just tracked); returns (shapes, calls, ns).
  py::tuple EvictLeastRecent(const Key& keep) {
    auto victim = signatures_.end();
    for (auto it = signatures_.begin(); it != signatures_.end(); ++it)
      if (it->first != keep && (victim == signatures_.end() || it->second->last_use < victim->second->last_use))
        victim = it;
    std::shared_ptr<Signature> sig = victim->second;
    if (sig == last_) last_.reset();
    signatures_.erase(victim);
    sig->evicted = true;  // a call of it still running counts in late_calls_
    return py::make_tuple(sig->shapes, sig->calls, sig->ns);
  }

  py::object observe_, errstate_, quiet_, loop_;
  std::vector<py::object> idle_contexts_;  // contexts holding quiet_ (LazyQuiet), not entered
  size_t capacity_;
  uint64_t clock_ = 0;                    // uses so far (Signature::last_use)
  uint64_t late_calls_ = 0, late_ns_ = 0;  // see LateCounts
  StepLoop* loop_ptr_ = nullptr;  // loop_'s
  std::vector<Py_ssize_t> perm_;
  bool record_ = false;
  std::unordered_map<Key, std::shared_ptr<Signature>, KeyHash> signatures_;
  Key key_scratch_;  // the signature key Dispatch builds, kept for its capacity
  std::shared_ptr<Signature> last_;  // the latest call's tracked signature (null once evicted), and its key
  Key last_key_;
};

ProgramCall* AsProgramCall(py::handle obj) {
  return py::isinstance<ProgramCall>(obj) ? obj.cast<ProgramCall*>() : nullptr;
}

PyObject* CallProgram(ProgramCall& call, PyObject* inputs, uint64_t* elapsed_ns) {
  return call.Call(inputs, elapsed_ns);
}

void RegisterProgramCall(py::module_& m) {
  py::class_<ProgramCall>(m, "ProgramCall",
                          "A compiled program's call: known input-shape signatures run their StepLoop here, the "
                          "rest go to observe(inputs)")
      .def(py::init<py::object, py::object, py::object, py::object, size_t>(), py::arg("observe"), py::arg("errstate"),
           py::arg("quiet"), py::arg("loop"), py::arg("capacity"))
      .def(
          "__call__",
          [](ProgramCall& self, const py::tuple& inputs) {
            PyObject* out = self.Call(inputs.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
          },
          py::arg("inputs"))
      .def("track", &ProgramCall::Track, py::arg("signature"), py::arg("bound"), py::arg("observe") = false,
           "calls with this signature run here, on `bound` (a StepLoop) or the default loop (None), its next call "
           "going to observe with `observe`; returns the signatures evicted to stay within capacity, "
           "[(signature, calls, ns)]")
      .def("__len__", &ProgramCall::size, "signatures tracked")
      .def_property_readonly("capacity", &ProgramCall::capacity)
      .def("late_counts", &ProgramCall::LateCounts,
           "(calls, ns) of calls that finished after their signature was evicted")
      .def("set_loop", &ProgramCall::SetLoop, py::arg("loop"))
      .def("set_perm", &ProgramCall::SetPerm, py::arg("perm"))
      .def_property("record", &ProgramCall::record, &ProgramCall::set_record,
                    "while true every call goes to observe (recording keeps every intermediate)")
      .def("counts", &ProgramCall::Counts, "{signature: (calls, ns)} of the calls run here");
}

}  // namespace npu_ep
