// A compiled program's loop in C++ (ep/program.py): the walk over prepared steps and numbered value slots that
// every call of a program runs. A known signature's call (`__call__`) runs each step's native step when it has one
// (native_steps.h: bound after the signature's first call) and that step accepts the inputs, else its Python
// kernel. A signature's first call and recording calls (`observe`) walk the same way while the program's observer
// chooses the native step to try for each step and sees every step's inputs and outputs (Program._observe: it
// records shapes and binds native steps). The GIL is held: kernels release it themselves around native work.
#include "step_loop.h"

#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "native_steps.h"

namespace py = pybind11;

namespace npu_ep {
namespace {

struct LoopStep {
  py::object run;       // run(prepared, args_tuple) -> sequence of outputs
  py::object prepared;
  std::vector<int> in;  // value slots; -1 reads None (a constant folded into prepared, or an omitted input)
  std::vector<std::pair<Py_ssize_t, int>> out;  // (output index, slot)
  std::vector<int> release;                     // slots whose last reader is this step
  py::object native_owner;                      // the NativeStep (None: the kernel always runs)
  NativeStep* native = nullptr;
  bool numpy_free = false;  // its native step does no numpy arithmetic (NativeStep::NumpyFree)
  bool ensures_quiet = false;  // its native step ensures the error state itself (NativeStep::EnsuresQuiet)
  // The step's argument tuple of an earlier call, emptied, that nothing else held when the step was done: the next
  // call fills it instead of making one. Taken while a call uses it (another thread's call makes its own).
  mutable py::object spare_args;
};

// Owns one call's slot table (strong references), cleared on every exit path; a small program's table lives in the
// object (no allocation per call).
class Slots {
 public:
  explicit Slots(size_t n) : n_(n) {
    if (n_ > kInline) heap_.assign(n_, nullptr);
  }
  ~Slots() {
    PyObject** v = data();
    for (size_t i = 0; i < n_; ++i) Py_XDECREF(v[i]);
  }
  Slots(const Slots&) = delete;
  Slots& operator=(const Slots&) = delete;
  PyObject*& operator[](size_t i) { return data()[i]; }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kInline = 16;
  PyObject** data() { return n_ > kInline ? heap_.data() : inline_; }
  size_t n_;
  PyObject* inline_[kInline] = {};
  std::vector<PyObject*> heap_;
};

// The hot path's choices: each step's own native step, counted.
struct BoundSteps {
  static constexpr bool kSeesOutputs = false;  // Saw ignores the outputs (a one-output step's array is not wrapped)
  uint64_t& runs;
  uint64_t& declines;
  NativeStep* Choose(size_t, const LoopStep& s, PyObject*) { return s.native; }
  void Ran(NativeStep* native, bool ran) {
    if (native != nullptr) ++(ran ? runs : declines);
  }
  bool Saw(size_t, PyObject*, PyObject*, bool) { return true; }
};

// A first call that only looks (`scout`): each step's own native step as on the hot path, with each step's input
// shapes kept for the cost model and the steps whose native step declined their inputs kept with those inputs and
// the outputs their kernel gave (so the program can bind a native step for them). A step's shapes are one bytes
// object of native int64s (its input count, then per input its rank, -1 for a value that is not an array, and its
// dims), the very object of the loop's previous scout when they did not change: a decoder's every token is a
// scouted call in which only the steps reading the past see new shapes, and the cost model's memo then finds the
// others by an object whose hash is kept.
struct Scout {
  static constexpr bool kSeesOutputs = true;
  uint64_t& runs;
  uint64_t& declines;
  std::vector<py::object>& previous;  // per step: its shapes in the loop's previous scout
  py::tuple shapes;                   // per step: its shapes (bytes)
  py::list declined;                  // [(step index, args, outs)]
  std::vector<int64_t> scratch;
  bool last_declined = false;
  NativeStep* Choose(size_t, const LoopStep& s, PyObject*) { return s.native; }
  void Ran(NativeStep* native, bool ran) {
    last_declined = native != nullptr && !ran;
    if (native != nullptr) ++(ran ? runs : declines);
  }
  bool Saw(size_t j, PyObject* args, PyObject* outs, bool) {
    auto& api = py::detail::npy_api::get();
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    scratch.assign(1, n);
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* a = PyTuple_GET_ITEM(args, k);
      if (!api.PyArray_Check_(a)) {
        scratch.push_back(-1);
        continue;
      }
      const auto* proxy = py::detail::array_proxy(a);
      scratch.push_back(proxy->nd);
      scratch.insert(scratch.end(), proxy->dimensions, proxy->dimensions + proxy->nd);
    }
    const char* data = reinterpret_cast<const char*>(scratch.data());
    const auto size = static_cast<Py_ssize_t>(scratch.size() * sizeof(int64_t));
    py::object& prev = previous[j];
    if (!prev || PyBytes_GET_SIZE(prev.ptr()) != size || std::memcmp(PyBytes_AS_STRING(prev.ptr()), data, size) != 0)
      prev = py::bytes(data, size);
    PyTuple_SET_ITEM(shapes.ptr(), static_cast<Py_ssize_t>(j), prev.inc_ref().ptr());
    if (last_declined)
      declined.append(
          py::make_tuple(j, py::reinterpret_borrow<py::object>(args), py::reinterpret_borrow<py::object>(outs)));
    return true;
  }
};

// An observing call's choices: before(j, args) names the native step to try (None: the kernel), after(j, args,
// outs, ran_native) sees each step's result. An error they raise fails the call as it is.
class Observer {
 public:
  static constexpr bool kSeesOutputs = true;
  Observer(py::object before, py::object after) : before_(std::move(before)), after_(std::move(after)) {}

  NativeStep* Choose(size_t j, const LoopStep&, PyObject* args) {
    offered_ = py::reinterpret_steal<py::object>(PyObject_CallFunction(before_.ptr(), "nO", j, args));
    if (!offered_) throw py::error_already_set();
    return offered_.is_none() ? nullptr : offered_.cast<NativeStep*>();
  }
  void Ran(NativeStep*, bool) {}
  bool Saw(size_t j, PyObject* args, PyObject* outs, bool ran) {
    PyObject* r = PyObject_CallFunction(after_.ptr(), "nOOO", j, args, outs, ran ? Py_True : Py_False);
    Py_XDECREF(r);
    return r != nullptr;
  }

 private:
  py::object before_, after_, offered_;  // offered_: keeps the chosen step alive while it runs
};

}  // namespace

class StepLoop {
 public:
  StepLoop(const py::list& steps, int n_slots, const py::tuple& output_slots, py::object fail)
      : n_slots_(n_slots), fail_(std::move(fail)) {
    for (const py::handle h : steps) {
      auto t = h.cast<py::tuple>();
      if (t.size() != 5 && t.size() != 6)
        throw py::value_error("a step is (run, prepared, in_slots, out_pairs, release[, native step])");
      LoopStep s{t[0].cast<py::object>(), t[1].cast<py::object>(), {}, {}, {}, py::none(), nullptr};
      if (t.size() == 6 && !t[5].is_none()) {
        s.native = t[5].cast<NativeStep*>();
        s.native_owner = t[5].cast<py::object>();
        s.numpy_free = s.native->NumpyFree();
        s.ensures_quiet = s.native->EnsuresQuiet();
      }
      for (const py::handle v : t[2]) s.in.push_back(CheckSlot(v.cast<int>(), true));
      for (const py::handle v : t[3]) {
        auto pair = v.cast<py::tuple>();
        s.out.emplace_back(pair[0].cast<Py_ssize_t>(), CheckSlot(pair[1].cast<int>(), false));
      }
      for (const py::handle v : t[4]) s.release.push_back(CheckSlot(v.cast<int>(), false));
      steps_.push_back(std::move(s));
    }
    for (const py::handle v : output_slots) outputs_.push_back(CheckSlot(v.cast<int>(), false));
    scout_shapes_.resize(steps_.size());
  }

  // inputs fill slots 0..n-1; returns the outputs as a tuple. A failing step's exception is replaced by
  // fail(step index, args tuple, exception) (the Python side names the node), chained to the original.
  // quiet (optional): ensured before a step that may reach numpy's arithmetic (NumpyQuiet).
  py::object Call(const py::tuple& inputs, NumpyQuiet* quiet = nullptr) {
    BoundSteps bound{native_runs_, native_declines_};
    return Walk(inputs, bound, !step_ns_.empty(), quiet);
  }

  // Call, with observer's before(j, args) -> NativeStep | None and after(j, args, outs, ran_native) around each
  // step instead of the steps' own native steps.
  py::object Observe(const py::tuple& inputs, py::object before, py::object after) {
    Observer observer(std::move(before), std::move(after));
    return Walk(inputs, observer, false);
  }

  // Call, also returning what a first call needs to know without observing: (outputs, each step's input shapes
  // (Scout), [(step index, args, outs)] of the steps whose native step declined its inputs).
  py::tuple ScoutCall(const py::tuple& inputs) {
    Scout scout{native_runs_, native_declines_, scout_shapes_, py::tuple(steps_.size()), py::list(), {}};
    py::object outs = Walk(inputs, scout, false);
    return py::make_tuple(std::move(outs), std::move(scout.shapes), std::move(scout.declined));
  }

  size_t size() const { return steps_.size(); }
  size_t native_steps() const {
    size_t n = 0;
    for (const LoopStep& s : steps_) n += s.native != nullptr;
    return n;
  }
  // (runs of native steps, inputs a native step declined) over every call so far
  std::pair<uint64_t, uint64_t> native_counts() const { return {native_runs_, native_declines_}; }

  // Per-step wall time summed over the calls since profiling was switched on (empty when off): what each step
  // costs inside the real hot path (ORT's threads, the bound native steps), which a replay in Python cannot show.
  void set_profile(bool on) { step_ns_.assign(on ? steps_.size() : 0, 0); }
  const std::vector<uint64_t>& step_ns() const { return step_ns_; }

 private:
  template <typename Choices>
  py::object Walk(const py::tuple& inputs, Choices& choices, bool timed, NumpyQuiet* quiet = nullptr) {
    const Py_ssize_t n_in = PyTuple_GET_SIZE(inputs.ptr());
    if (n_in > n_slots_) throw py::value_error("more inputs than value slots");
    Slots env(static_cast<size_t>(n_slots_));
    for (Py_ssize_t i = 0; i < n_in; ++i) {
      PyObject* v = PyTuple_GET_ITEM(inputs.ptr(), i);
      Py_INCREF(v);
      env[static_cast<size_t>(i)] = v;
    }
    for (size_t j = 0; j < steps_.size(); ++j) {
      const LoopStep& s = steps_[j];
      const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      PyObject* args = TakeArgs(s);
      if (args == nullptr) throw py::error_already_set();
      for (size_t k = 0; k < s.in.size(); ++k) {
        PyObject* v =
            s.in[k] >= 0 && env[static_cast<size_t>(s.in[k])] != nullptr ? env[static_cast<size_t>(s.in[k])] : Py_None;
        Py_INCREF(v);
        PyTuple_SET_ITEM(args, static_cast<Py_ssize_t>(k), v);
      }
      NativeStep* native = nullptr;
      try {
        native = choices.Choose(j, s, args);
      } catch (...) {
        Py_DECREF(args);
        throw;
      }
      const bool own = native != nullptr && native == s.native;
      if (quiet != nullptr && !(own && (s.numpy_free || s.ensures_quiet)) && !quiet->Ensure()) {
        Py_DECREF(args);
        throw py::error_already_set();
      }
      PyObject* outs = native == nullptr        ? nullptr
                       : own && s.ensures_quiet ? native->RunQuiet(args, quiet)
                                                : native->Run(args);
      const bool ran_native = outs != nullptr;
      choices.Ran(native, ran_native);
      if (outs == nullptr && !PyErr_Occurred()) {
        if (quiet != nullptr && !quiet->Ensure()) {
          Py_DECREF(args);
          throw py::error_already_set();
        }
        PyObject* call_args[2] = {s.prepared.ptr(), args};
        outs = PyObject_Vectorcall(s.run.ptr(), call_args, 2, nullptr);
      }
      // a native step's one output may come as itself (NativeStep::Run); those who see the outputs get a tuple
      const bool single = ran_native && !PyTuple_Check(outs);
      if (single && Choices::kSeesOutputs) {
        PyObject* packed = PyTuple_Pack(1, outs);
        Py_DECREF(outs);
        outs = packed;
      }
      if (outs == nullptr || !(single && !Choices::kSeesOutputs ? StoreOne(s, outs, env) : Store(s, outs, env))) {
        Py_XDECREF(outs);
        Fail(j, args);  // sets the Python error
        Py_DECREF(args);
        throw py::error_already_set();
      }
      if (!choices.Saw(j, args, outs, ran_native)) {
        Py_DECREF(outs);
        Py_DECREF(args);
        throw py::error_already_set();
      }
      Py_DECREF(outs);
      KeepArgs(s, args);
      for (int slot : s.release) Py_CLEAR(env[static_cast<size_t>(slot)]);
      if (timed) {
        const auto dt = std::chrono::steady_clock::now() - t0;
        step_ns_[j] += std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count();
      }
    }
    PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(outputs_.size()));
    if (result == nullptr) throw py::error_already_set();
    for (size_t i = 0; i < outputs_.size(); ++i) {
      PyObject* v = env[static_cast<size_t>(outputs_[i])];
      v = v != nullptr ? v : Py_None;
      Py_INCREF(v);
      PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(i), v);
    }
    return py::reinterpret_steal<py::object>(result);
  }

  int CheckSlot(int slot, bool allow_none) const {
    if (slot >= n_slots_ || slot < (allow_none ? -1 : 0))
      throw py::value_error("slot " + std::to_string(slot) + " outside the program's " + std::to_string(n_slots_));
    return slot;
  }

  // A tuple for the step's arguments (items unset): its spare one, else a new one; nullptr with a Python error set.
  static PyObject* TakeArgs(const LoopStep& s) {
    if (s.spare_args) return s.spare_args.release().ptr();
    return PyTuple_New(static_cast<Py_ssize_t>(s.in.size()));
  }

  // Done with the step's arguments: emptied and kept as its spare when nothing else holds the tuple (a kernel may
  // keep its args), else dropped.
  static void KeepArgs(const LoopStep& s, PyObject* args) {
    if (Py_REFCNT(args) != 1 || s.spare_args || PyTuple_GET_SIZE(args) == 0) {
      Py_DECREF(args);
      return;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args); ++k) Py_CLEAR(PyTuple_GET_ITEM(args, k));
    s.spare_args = py::reinterpret_steal<py::object>(args);
  }

  // A native step's one output (not a tuple) in the slots of the step's output 0.
  static bool StoreOne(const LoopStep& s, PyObject* out, Slots& env) {
    for (const auto& [i, slot] : s.out) {
      if (i != 0) {
        PyErr_Format(PyExc_ValueError, "the native step returned 1 output, the node's output %zd is used", i);
        return false;
      }
      Py_INCREF(out);
      Py_XSETREF(env[static_cast<size_t>(slot)], out);
    }
    return true;
  }

  // Keeps the step's outputs in their slots; false with a Python error set when the kernel returned too few.
  static bool Store(const LoopStep& s, PyObject* outs, Slots& env) {
    PyObject* seq = PySequence_Fast(outs, "a kernel must return a sequence of outputs");
    if (seq == nullptr) return false;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (const auto& [i, slot] : s.out) {
      if (i >= n) {
        PyErr_Format(PyExc_ValueError, "the kernel returned %zd outputs, the node's output %zd is used", n, i);
        Py_DECREF(seq);
        return false;
      }
      Py_INCREF(items[i]);
      Py_XSETREF(env[static_cast<size_t>(slot)], items[i]);
    }
    Py_DECREF(seq);
    return true;
  }

  // Replaces the pending exception by fail(j, args, exc) chained from it (as `raise ... from exc`); a
  // BaseException that is not an Exception (KeyboardInterrupt, SystemExit) passes unchanged, as in Python.
  void Fail(size_t j, PyObject* args) const {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != nullptr) PyException_SetTraceback(value, tb);
    if (!PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
      PyErr_Restore(type, value, tb);
      return;
    }
    PyObject* err = PyObject_CallFunction(fail_.ptr(), "nOO", static_cast<Py_ssize_t>(j), args, value);
    if (err == nullptr) {  // the message builder itself failed: keep the kernel's own error
      PyErr_Clear();
      PyErr_Restore(type, value, tb);
      return;
    }
    Py_INCREF(value);
    PyException_SetContext(err, value);  // steals
    PyException_SetCause(err, value);    // steals; also sets __suppress_context__
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err)), err);
    Py_DECREF(err);
    Py_XDECREF(type);
    Py_XDECREF(tb);
  }

  int n_slots_;
  py::object fail_;
  std::vector<LoopStep> steps_;
  std::vector<int> outputs_;
  uint64_t native_runs_ = 0, native_declines_ = 0;  // under the GIL
  std::vector<py::object> scout_shapes_;             // per step: its shapes in the latest scout (Scout::previous)
  std::vector<uint64_t> step_ns_;                    // per step, while profiling
};

StepLoop* AsStepLoop(py::handle obj) { return py::isinstance<StepLoop>(obj) ? obj.cast<StepLoop*>() : nullptr; }

PyObject* RunStepLoop(StepLoop& loop, PyObject* inputs, NumpyQuiet* quiet) {
  try {
    return loop.Call(py::reinterpret_borrow<py::tuple>(inputs), quiet).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void RegisterStepLoop(py::module_& m) {
  py::class_<StepLoop>(m, "StepLoop",
                       "A compiled program's hot loop: steps (run, prepared, in_slots, out_pairs, release) over "
                       "n_slots value slots; fail(step index, args, exc) builds the error a failing step raises")
      .def(py::init<const py::list&, int, const py::tuple&, py::object>(), py::arg("steps"), py::arg("n_slots"),
           py::arg("output_slots"), py::arg("fail"))
      .def(
          "__call__", [](StepLoop& self, const py::tuple& inputs) { return self.Call(inputs); }, py::arg("inputs"))
      .def("observe", &StepLoop::Observe, py::arg("inputs"), py::arg("before"), py::arg("after"),
           "a call in which before(j, args) names the native step to try for step j (None: its kernel) and "
           "after(j, args, outs, ran_native) sees each step's result (a signature's first call)")
      .def("scout", &StepLoop::ScoutCall, py::arg("inputs"),
           "a call on the steps' own native steps that also returns each step's input shapes and the steps whose "
           "native step declined, with their inputs and outputs: (outputs, shapes, [(step index, args, outs)]); "
           "shapes: per step a bytes of native int64s, its input count, then per input its rank (-1: not an array) "
           "and dims, the previous scout's object when equal")
      .def("__len__", &StepLoop::size)
      .def_property_readonly("native_steps", &StepLoop::native_steps, "steps bound to a native step")
      .def_property_readonly("native_counts", &StepLoop::native_counts,
                             "(native step runs, declined inputs that ran the Python kernel instead)")
      .def("set_profile", &StepLoop::set_profile, py::arg("on"),
           "time every step of every call from now on (on), or stop (off); either clears the sums")
      .def_property_readonly("step_ns", &StepLoop::step_ns,
                             "per step, the wall time summed over the calls since set_profile(True) (empty: off)");
}

}  // namespace npu_ep
