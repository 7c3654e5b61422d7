// Native MaxPool: one task per (image, channel) plane; per output row, the window rows are folded into a running
// maximum (a taken NaN stays, as numpy's max keeps it). The bits do not depend on the thread count.
#include "pool.h"

#include <algorithm>
#include <vector>

#include "thread_pool.h"

namespace npu_ep::kern {
namespace {

inline float Max(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

}  // namespace

void MaxPoolFloat(const PoolShape& s, const float* x, float low, float* y, int threads) {
  ParallelFor(threads, s.N * s.C, [&](int64_t plane) {
    const float* in = x + plane * s.H * s.W;
    float* out = y + plane * s.OH * s.OW;
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      float* dst = out + oh * s.OW;
      std::fill(dst, dst + s.OW, low);
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        if (ih < 0 || ih >= s.H) continue;
        const float* row = in + ih * s.W;
        for (int64_t j = 0; j < s.kw; ++j) {
          const int64_t off = j * s.dw - s.pl;  // input column of output ow: ow * sw + off
          const int64_t lo = off >= 0 ? 0 : (-off + s.sw - 1) / s.sw;
          const int64_t hi = std::min(s.OW, s.W - off <= 0 ? int64_t{0} : (s.W - off - 1) / s.sw + 1);
          if (s.sw == 1)
            for (int64_t o = lo; o < hi; ++o) dst[o] = Max(dst[o], row[o + off]);
          else
            for (int64_t o = lo; o < hi; ++o) dst[o] = Max(dst[o], row[o * s.sw + off]);
        }
      }
    }
  });
}

}  // namespace npu_ep::kern
