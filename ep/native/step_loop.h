// The compiled program's loop (step_loop.cc), exposed to ep/program.py as `_native.StepLoop`: every call of a
// program walks its steps here, a signature's first call with the program's observer (`StepLoop.observe`).
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

class StepLoop;

// The loop behind a `_native.StepLoop` object; nullptr when `obj` is not one.
StepLoop* AsStepLoop(pybind11::handle obj);
// The loop's outputs for `inputs` (a tuple) as a new reference, or nullptr with a Python error set. GIL held.
PyObject* RunStepLoop(StepLoop& loop, PyObject* inputs);

void RegisterStepLoop(pybind11::module_& m);

}  // namespace npu_ep
