// Native MaxPool: one task per (image, channel) plane; per output row, the window's input rows are folded into a
// row maximum (vectorized), then each output takes the maximum of its columns. A NaN anywhere in the window wins,
// as numpy's max. The bits do not depend on the thread count.
#include "pool.h"

#include <algorithm>
#include <vector>

#include "cpu.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace npu_ep::kern {
namespace {

// A NaN, once taken, stays: NaN > v and v > NaN are both false.
inline float Max(float m, float v) { return v > m || v != v ? v : m; }

// The row pass (contiguous, the bulk of the work): acc[w] = Max(acc[w], row[w]).
void RowMaxScalar(float* acc, const float* row, int64_t n) {
  for (int64_t w = 0; w < n; ++w) acc[w] = Max(acc[w], row[w]);
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) void RowMaxAvx512(float* acc, const float* row, int64_t n) {
  for (int64_t w = 0; w < n; w += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - w >= 16 ? 0xFFFF : (1u << (n - w)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(k, acc + w), v = _mm512_maskz_loadu_ps(k, row + w);
    const __mmask16 take = _mm512_cmp_ps_mask(v, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    _mm512_mask_storeu_ps(acc + w, static_cast<__mmask16>(take & k), v);
  }
}
#endif

void RowMax(float* acc, const float* row, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return RowMaxAvx512(acc, row, n);
#endif
  RowMaxScalar(acc, row, n);
}

}  // namespace

void MaxPoolFloat(const PoolShape& s, const float* x, float low, float* y, int threads) {
  const int64_t work = s.N * s.C * s.OH * s.OW * s.kh * s.kw;
  ParallelFor(work < (int64_t{1} << 20) ? 1 : threads, s.N * s.C, [&](int64_t plane) {  // small: one thread
    const float* in = x + plane * s.H * s.W;
    float* out = y + plane * s.OH * s.OW;
    std::vector<float> rowmax(s.W);
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      // rows of the window first (whole input rows, in tap order), then the columns of each output
      std::fill(rowmax.begin(), rowmax.end(), low);
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        if (ih >= 0 && ih < s.H) RowMax(rowmax.data(), in + ih * s.W, s.W);
      }
      float* dst = out + oh * s.OW;
      for (int64_t ow = 0; ow < s.OW; ++ow) {
        float m = low;
        for (int64_t j = 0; j < s.kw; ++j) {
          const int64_t iw = ow * s.sw - s.pl + j * s.dw;
          if (iw >= 0 && iw < s.W) m = Max(m, rowmax[iw]);
        }
        dst[ow] = m;
      }
    }
  });
}

}  // namespace npu_ep::kern
