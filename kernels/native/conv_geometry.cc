// A conv's geometry checked and completed, and the patch matrix a dense conv's GEMM multiplies (conv_geometry.h).
#include "conv_geometry.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace npu_ep::kern {

void ConvShape::Finish() {
  auto bad = [](const std::string& why) { throw std::invalid_argument("conv: " + why); };
  if (N < 0 || C <= 0 || H <= 0 || W <= 0) bad("input must be [N, C > 0, H > 0, W > 0]");
  if (group <= 0 || M <= 0 || C % group || M % group)
    bad("group " + std::to_string(group) + " must divide C=" + std::to_string(C) + " and M=" + std::to_string(M));
  if (kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0)
    bad("kernel, strides and dilations must be positive");
  if (pt < 0 || pl < 0 || pb < 0 || pr < 0) bad("pads must be >= 0");
  const int64_t ekh = (kh - 1) * dh + 1, ekw = (kw - 1) * dw + 1;
  if (H + pt + pb < ekh || W + pl + pr < ekw)
    bad("the padded input " + std::to_string(H + pt + pb) + "x" + std::to_string(W + pl + pr) +
        " is smaller than the dilated kernel " + std::to_string(ekh) + "x" + std::to_string(ekw));
  OH = (H + pt + pb - ekh) / sh + 1;
  OW = (W + pl + pr - ekw) / sw + 1;
}

namespace {

// d[0, n) = s[0, n) as moves of a constant size (inlined, no libc call): 8 floats at a time and a last 8 (or, below
// 8, two 4s) overlapping the ones before; elementwise below 4. The segments of a small map's patch rows are a few
// floats each (an 8x8 map: 7 or 8), where a memcpy/memset call per segment cost more than the copy.
inline void Move(float* d, const float* s, int64_t n) {
  if (n >= 8) {
    for (int64_t o = 0; o + 8 <= n; o += 8) std::memcpy(d + o, s + o, 8 * sizeof(float));
    std::memcpy(d + n - 8, s + n - 8, 8 * sizeof(float));
  } else if (n >= 4) {
    std::memcpy(d, s, 4 * sizeof(float));
    std::memcpy(d + n - 4, s + n - 4, 4 * sizeof(float));
  } else {
    for (int64_t o = 0; o < n; ++o) d[o] = s[o];
  }
}

constexpr float kZeros[64] = {};

inline void Zeros(float* d, int64_t n) {
  for (; n > 64; n -= 64, d += 64) Move(d, kZeros, 64);
  Move(d, kZeros, n);
}

// GCC would turn the segment loops back into memcpy/memset calls, the per-call cost they avoid; clang keeps them
// (and knows no optimize attribute).
#if defined(__GNUC__) && !defined(__clang__)
#define NPU_EP_KEEP_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NPU_EP_KEEP_LOOPS
#endif

// A patch row segment: n0 zeros, n values of r (stride sw), n1 zeros.
NPU_EP_KEEP_LOOPS inline void Segment(float* d, const float* r, int64_t sw, int64_t n0, int64_t n, int64_t n1) {
  Zeros(d, n0);
  d += n0;
  if (sw == 1) {
    Move(d, r, n);
  } else {
    for (int64_t o = 0; o < n; ++o) d[o] = r[o * sw];
  }
  Zeros(d + n, n1);
}

}  // namespace

// Tap by tap: a row segment's zeros and its valid columns are the same for every channel of the tap, so they are
// worked out once per (tap, output row) and the channels copy alike.
NPU_EP_KEEP_LOOPS void conv_detail::PatchMatrix(const ConvShape& s, const float* planes, int64_t p0, int64_t cols,
                                                float* patch) {
  const int64_t T = s.kh * s.kw, end = p0 + cols, plane = s.H * s.W;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t i = t / s.kw, j = t % s.kw, off_w = j * s.dw - s.pl;
    const conv_detail::Span sp = conv_detail::Valid(off_w, s.sw, s.W, s.OW);
    int64_t oh = p0 / s.OW, ow0 = p0 % s.OW;
    for (int64_t p = p0; p < end; ++oh, ow0 = 0) {  // one output row segment at a time
      const int64_t ow1 = std::min(s.OW, ow0 + (end - p));
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      const bool inside = ih >= 0 && ih < s.H;  // else the segment is all zeros
      const int64_t lo = inside ? std::clamp(sp.lo, ow0, ow1) : ow1, hi = inside ? std::clamp(sp.hi, lo, ow1) : ow1;
      const int64_t src = inside ? ih * s.W + off_w + lo * s.sw : 0;
      float* d = patch + t * cols + (p - p0);  // pixel (oh, ow0) of channel 0's row for this tap
      for (int64_t c = 0; c < s.Cg(); ++c, d += T * cols)
        Segment(d, planes + c * plane + src, s.sw, lo - ow0, hi - lo, ow1 - hi);
      p += ow1 - ow0;
    }
  }
}

}  // namespace npu_ep::kern
