// If as a bound native step (branch_step.cc): the condition picks a branch program, which runs on its own
// ProgramCall, so choosing a branch costs no Python frame. Registered on the extension module.
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

void RegisterBranchStep(pybind11::module_& m);

}  // namespace npu_ep
