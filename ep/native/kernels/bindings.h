#pragma once

#include <pybind11/pybind11.h>

namespace npu_ep::kern {
// Adds the submodule `kernels` (MatMulNBits, int8 GEMM, ISA control) to the extension module.
void RegisterKernels(pybind11::module_& m);
}  // namespace npu_ep::kern
