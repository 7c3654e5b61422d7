// What every conv-net kernel (conv.cc, conv_gemm.cc, qlinear_conv.cc, pool.cc) shares: a conv's geometry, the
// output ranges a tap reads inside the input, the patch matrix of a block of output pixels, and how a kernel's
// items are grouped into tasks. Below all of them: it includes none of their headers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "thread_pool.h"

namespace npu_ep::kern {

struct ConvShape {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input [N, C, H, W]
  int64_t M = 0, group = 1;            // output channels, groups
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;  // pads: top, left, bottom, right
  int64_t OH = 0, OW = 0;                  // derived by Finish()
  int64_t Cg() const { return C / group; }
  int64_t Mg() const { return M / group; }
  int64_t P() const { return OH * OW; }
  // Derives OH/OW; throws std::invalid_argument naming the problem when the geometry is inconsistent.
  void Finish();
};

namespace conv_detail {

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
// (c, i, j), zeros where padded): B of the dense conv's GEMM, on the BLAS (conv.cc) or our own (conv_gemm.cc).
void PatchMatrix(const ConvShape& s, const float* planes, int64_t p0, int64_t cols, float* patch);

}  // namespace conv_detail
}  // namespace npu_ep::kern
