// A float conv's fused element-wise tail (kernels/fusion/conv_tail.py) as the conv kernels apply it to their
// output runs while in cache, and the same instructions as an element-wise engine (conv_tail.cc).
#pragma once

#include <cstdint>

namespace pybind11 {
class module_;
}

namespace npu_ep::kern {

// Instruction codes and 2 floats per instruction, applied in place to each finished output run. Empty: nothing
// to do.
struct ConvTail {
  const int32_t* codes = nullptr;
  const float* consts = nullptr;
  int64_t n = 0;
};
void ApplyTail(const ConvTail& tail, float* v, int64_t n);
constexpr int32_t kTailCodes = 27;  // codes are 0 .. kTailCodes - 1
constexpr int32_t kTailClip = 6;    // clip lo hi (Clip, Relu)

// Python bindings (conv_tail, tail_of, prelu_rows, sigmoid, ...), added to the `kernels` submodule.
void BindConvTail(pybind11::module_& m);

}  // namespace npu_ep::kern
