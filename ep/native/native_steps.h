// Native steps: what a compiled program's step becomes once a signature's first call has shown its inputs
// (ep/step_binding.py binds them), run by the program's C++ loop (step_loop.cc) without the step's Python kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace npu_ep {

// The numpy error state a program's steps run under ("ignore all"), ensured by the loop before the first step that may
// reach numpy's arithmetic (a Python kernel, a native step that is not NumpyFree), so a call whose steps are all C++
// kernels sets nothing. Ensure: false with a Python error set when it could not be set.
class NumpyQuiet {
 public:
  virtual bool Ensure() = 0;

 protected:
  ~NumpyQuiet() = default;
};

class NativeStep {
 public:
  virtual ~NativeStep() = default;
  // The step's outputs (a new reference to a tuple, or to the one output itself when that is not a tuple: no tuple
  // per call for a one-output step) for `args` (the step's input tuple); nullptr with no Python error set when these
  // inputs are not the ones the step was bound for (the loop then runs the Python kernel); nullptr with an error set
  // when the step failed.
  virtual PyObject* Run(PyObject* args) = 0;
  // Whether Run never reaches numpy's arithmetic loops (a C++ kernel, a view, kept values), so a program whose steps
  // all run such steps needs no numpy error state set around its call (ProgramCall sets it before any other step).
  virtual bool NumpyFree() const { return false; }
  // Whether the step ensures numpy's error state itself (RunQuiet) only on the calls that reach numpy's arithmetic,
  // so the loop need not ensure it before the step.
  virtual bool EnsuresQuiet() const { return false; }
  // Run, ensuring `quiet` (nullptr: the caller set the state) before anything that may reach numpy's arithmetic.
  virtual PyObject* RunQuiet(PyObject* args, NumpyQuiet* quiet) {
    if (quiet != nullptr && !NumpyFree() && !quiet->Ensure()) return nullptr;
    return Run(args);
  }
};

// Whether a's shape is dims.
bool SameShape(const pybind11::array& a, const std::vector<pybind11::ssize_t>& dims);

// What keeps a bound step to the setting it was bound under. A guard is a (counter, generation) pair: the
// step's runtime record (kernels.registry.StepRuntime) bumps its counter, an int64 array of one element, whenever
// it changes what a native step depends on (kernel choice, threads, partition outputs, DMA counting), and the step
// declines once the counter is not the generation it was bound under; the check is one load, no Python call.
// A (dict, key, expected object) triple, for state not on the record yet, declines once dict[key] is not that very
// object (an absent key is expected as None).
class Guards {
 public:
  explicit Guards(const pybind11::list& guards);
  // true while every guard holds; false (the step declines) otherwise, with a Python error set if reading failed
  bool Hold() const;

 private:
  struct Generation {
    pybind11::array counter;  // keeps `now` alive
    const int64_t* now;
    int64_t expected;
  };
  struct DictEntry {
    pybind11::dict dict;
    pybind11::object key, expected;
  };
  std::vector<Generation> generations_;
  std::vector<DictEntry> entries_;
};

void RegisterNativeSteps(pybind11::module_& m);

}  // namespace npu_ep
