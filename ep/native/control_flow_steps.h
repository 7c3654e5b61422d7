// If and Loop as bound native steps (control_flow_steps.cc): the condition picks an If's branch program, and a
// Loop's iterations call its body program, each through the sub-program's own ProgramCall, so neither costs a
// Python frame. Registered on the extension module.
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

void RegisterControlFlowSteps(pybind11::module_& m);

}  // namespace npu_ep
