#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "tile_dma.h"

namespace npu_ep::kern {
// "[d0, d1, ...]": an array's shape for error messages.
inline std::string Dims(const pybind11::array& a) {
  std::string s = "[";
  for (pybind11::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

// Adds the submodule `kernels` (MatMulNBits, int8 GEMM, ISA control) to the extension module.
void RegisterKernels(pybind11::module_& m);

// A matrix kernel's `plan` argument (kernels/ops/_matrix.py native_plan_args: a 9-tuple) as the kernels take it;
// None: no plan. Raises ValueError naming `op` on a malformed tuple.
std::optional<TilePlanArgs> PlanArgs(const std::optional<pybind11::tuple>& t, const char* op);
// A kernel's result, or (result, {"a", "b", "scales", "out": half-bytes, "transfers": n}) when `count`.
pybind11::object WithDma(pybind11::object y, bool count, const DmaCount& c);
}  // namespace npu_ep::kern
