// The compiled program's hot loop (step_loop.cc), exposed to ep/program.py as `_native.StepLoop`.
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

void RegisterStepLoop(pybind11::module_& m);

}  // namespace npu_ep
