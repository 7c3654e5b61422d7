// Native steps: what a compiled program's step becomes once a signature's first call has shown its inputs
// (ep/step_binding.py binds them), run by the program's C++ loop (step_loop.cc) without the step's Python kernel.
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

class NativeStep {
 public:
  virtual ~NativeStep() = default;
  // The step's outputs (a new reference to a tuple) for `args` (the step's input tuple); nullptr with no Python
  // error set when these inputs are not the ones the step was bound for (the loop then runs the Python kernel);
  // nullptr with an error set when the step failed.
  virtual PyObject* Run(PyObject* args) = 0;
};

void RegisterNativeSteps(pybind11::module_& m);

}  // namespace npu_ep
