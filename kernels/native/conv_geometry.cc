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

void conv_detail::PatchMatrix(const ConvShape& s, const float* planes, int64_t p0, int64_t cols, float* patch) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t c = k / T, i = (k % T) / s.kw, j = k % s.kw;
    const float* plane = planes + c * s.H * s.W;
    const int64_t off_w = j * s.dw - s.pl;
    const conv_detail::Span sp = conv_detail::Valid(off_w, s.sw, s.W, s.OW);
    float* dst = patch + k * cols;
    for (int64_t p = p0; p < p0 + cols;) {  // one output row segment at a time
      const int64_t oh = p / s.OW, ow0 = p % s.OW, ow1 = std::min(s.OW, ow0 + (p0 + cols - p));
      float* d = dst + (p - p0) - ow0;  // d[ow] is pixel (oh, ow)
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      if (ih < 0 || ih >= s.H) {
        std::fill(d + ow0, d + ow1, 0.0f);
      } else {
        const float* row = plane + ih * s.W + off_w;
        const int64_t lo = std::clamp(sp.lo, ow0, ow1), hi = std::clamp(sp.hi, lo, ow1);
        std::fill(d + ow0, d + lo, 0.0f);
        if (s.sw == 1)
          std::memcpy(d + lo, row + lo, (hi - lo) * sizeof(float));
        else
          for (int64_t o = lo; o < hi; ++o) d[o] = row[o * s.sw];
        std::fill(d + hi, d + ow1, 0.0f);
      }
      p += ow1 - ow0;
    }
  }
}

}  // namespace npu_ep::kern
