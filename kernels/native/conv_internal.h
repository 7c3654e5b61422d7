// Helpers shared by the conv-net kernels (conv.cc, qlinear_conv.cc, pool.cc); not part of their interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "conv.h"
#include "scratch.h"
#include "thread_pool.h"

namespace npu_ep::kern::conv_detail {

// fn(i) for the items i in [0, n), run in tasks of consecutive items that carry at least kMinParallelWork element
// operations each: ORT's pool hands tasks out one at a time, and a small task costs more to hand out than it
// saves (measured: a QDQ detector ran 2x slower on two threads than on one with a task per channel plane). The
// grouping depends on the shape only, so the bits never depend on the thread count.
template <typename Fn>
void ParallelItems(int threads, int64_t n, int64_t work_per_item, const Fn& fn) {
  if (n <= 0) return;
  const int64_t per = std::clamp<int64_t>(kMinParallelWork / std::max<int64_t>(work_per_item, 1), 1, n);
  const int64_t tasks = (n + per - 1) / per;
  ParallelFor(tasks > 1 ? threads : 1, tasks, [&](int64_t t) {
    for (int64_t i = t * per; i < std::min(n, (t + 1) * per); ++i) fn(i);
  });
}

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

// The patch matrix [Cg*kh*kw, cols] of output pixels [p0, p0 + cols) over one image's group planes (rows ordered
// (c, i, j), zeros where padded): B of the dense conv's GEMM.
void PatchMatrix(const ConvShape& s, const float* planes, int64_t p0, int64_t cols, float* patch);

}  // namespace npu_ep::kern::conv_detail
