// Helpers shared by the convolution kernels (conv.cc, qlinear_conv.cc); not part of the kernels' interface.
#pragma once

#include <algorithm>
#include <cstdint>

namespace npu_ep::kern::conv_detail {

// Work (element operations) below which a kernel runs on the calling thread alone: handing tasks to other
// threads costs more than it saves there, and on a loaded host a helper that is descheduled mid-task stalls the
// whole op. The split itself never changes the bits.
constexpr int64_t kMinParallelWork = int64_t{1} << 20;
inline int ThreadsFor(int threads, int64_t work) { return work < kMinParallelWork ? 1 : threads; }

// Outputs o in [lo, hi) read inside the input: 0 <= o * stride + off < in.
struct Span {
  int64_t lo, hi;
};
inline Span Valid(int64_t off, int64_t stride, int64_t in, int64_t out) {
  int64_t lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t hi = in - off <= 0 ? 0 : (in - off - 1) / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
  return {lo, hi};
}

}  // namespace npu_ep::kern::conv_detail
