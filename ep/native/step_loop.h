// The compiled program's loop (step_loop.cc), exposed to ep/program.py as `_native.StepLoop`: every call of a
// program walks its steps here, a signature's first call with the program's observer (`StepLoop.observe`).
#pragma once

#include <pybind11/pybind11.h>

#include "native_steps.h"  // NumpyQuiet

namespace npu_ep {

class StepLoop;

// The loop behind a `_native.StepLoop` object; nullptr when `obj` is not one.
StepLoop* AsStepLoop(pybind11::handle obj);
// The loop's outputs for `inputs` (a tuple) as a new reference, or nullptr with a Python error set. GIL held.
// quiet: ensured before a step that needs numpy's error state (nullptr: the caller set it).
PyObject* RunStepLoop(StepLoop& loop, PyObject* inputs, NumpyQuiet* quiet = nullptr);

void RegisterStepLoop(pybind11::module_& m);

}  // namespace npu_ep
