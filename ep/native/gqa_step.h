// GroupQueryAttention as a bound native step (gqa_step.cc), registered on the extension module.
#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep {

void RegisterGqaStep(pybind11::module_& m);

}  // namespace npu_ep
