// A float conv's fused element-wise tail (kernels/fusion/conv_tail.py) as the conv kernels apply it to their
// output runs while in cache, and the same instructions as an element-wise engine (conv_tail.cc).
#pragma once

#include <cstdint>

#include "conv_tail_registers.h"

namespace pybind11 {
class module_;
}

namespace npu_ep::kern {

// Instruction codes and 2 floats per instruction, applied in place to each finished output run. Empty: nothing
// to do.
// A per-output-channel operand (a PRelu's slopes): instruction channel_at's first constant is
// channel_consts[channel] on the outputs of channel `channel` (ApplyChannelTail); channel_consts nullptr: none.
struct ConvTail {
  const int32_t* codes = nullptr;
  const float* consts = nullptr;
  int64_t n = 0;
  const float* channel_consts = nullptr;
  int64_t channel_at = -1;
};
void ApplyTail(const ConvTail& tail, float* v, int64_t n);
constexpr int64_t kMaxChannelTail = 64;  // instructions of a tail with a per-channel operand (checked by its caller)

// ApplyTail on n outputs of output channel `channel`: a per-channel operand takes that channel's constant.
inline void ApplyChannelTail(const ConvTail& tail, float* v, int64_t n, int64_t channel) {
  if (tail.channel_consts == nullptr) return ApplyTail(tail, v, n);
  float consts[2 * kMaxChannelTail];
  for (int64_t k = 0; k < 2 * tail.n; ++k) consts[k] = tail.consts[k];
  consts[2 * tail.channel_at] = tail.channel_consts[channel];
  ConvTail one = tail;
  one.consts = consts;
  one.channel_consts = nullptr;
  ApplyTail(one, v, n);
}
// Whether the tail is HardSwish's program (save; mul a; add b; clip lo hi with lo <= hi; mul_saved) with no
// per-channel operand; then hs = {a, b, lo, hi}, for a kernel that applies it in its registers as
// v * max(lo, min(hi, v * a + b)): the register interpreter's operations in its order (conv_tail_registers.cc).
inline bool HardSwishTail(const ConvTail& tail, float* hs) {
  return tail.channel_consts == nullptr && tail_code::HardSwishProgram(tail.codes, tail.consts, tail.n, hs);
}
constexpr int32_t kTailCodes = 28;  // codes are 0 .. kTailCodes - 1
constexpr int32_t kTailClip = 6;    // clip lo hi (Clip, Relu)

// Python bindings (conv_tail, tail_of, prelu_rows, sigmoid, ...), added to the `kernels` submodule.
void BindConvTail(pybind11::module_& m);

}  // namespace npu_ep::kern
