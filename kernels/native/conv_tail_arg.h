#pragma once

// The optional fused tail of a float conv binding's call (conv_bindings.cc, conv_nhwc_bindings.cc), checked.

#include <pybind11/numpy.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "conv_tail.h"

namespace npu_ep::kern {
// Tail codes and their constants (both or neither given): 2 floats per code, codes known; the arrays stay the
// caller's (the tail points into them).
inline ConvTail TailArg(const std::optional<pybind11::array_t<int32_t, pybind11::array::c_style>>& codes,
                        const std::optional<pybind11::array_t<float, pybind11::array::c_style>>& consts,
                        const char* op) {
  ConvTail t;
  if (!codes && !consts) return t;
  if (!codes || !consts) throw std::invalid_argument(std::string(op) + ": tail_codes and tail_consts go together");
  if (consts->size() != 2 * codes->size())
    throw std::invalid_argument(std::string(op) + ": tail_consts must hold 2 floats per tail code");
  for (int64_t k = 0; k < codes->size(); ++k)
    if (codes->data()[k] < 0 || codes->data()[k] >= kTailCodes)
      throw std::invalid_argument(std::string(op) + ": unknown tail code " + std::to_string(codes->data()[k]));
  t.codes = codes->data();
  t.consts = consts->data();
  t.n = codes->size();
  return t;
}
}  // namespace npu_ep::kern
