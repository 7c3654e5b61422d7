// Float convs of a layout chain in NHWC (kernels/layout.py, kernels/ops/conv_nhwc.py): x [N, H, W, C] in, y
// [N, OH, OW, M] out, so a chain of depthwise and pointwise convs needs no transposes between its steps.
// - Depthwise (one input channel per group, one output each): channels in the vector lanes, each tap a whole
//   vector of channels. The reference's float32 operations in its order (conv.py's _depthwise): the first tap's
//   product, each later tap's product added, padding read as zeros and multiplied like any input (0 * inf is NaN
//   there too), then + bias: the same bits. The fused tail runs on each output row while it is in cache.
// - Pointwise (1x1, stride 1, unpadded, one group): y[P, M] = x[P, C] W[C, M] on the packed GEMM (packed_sgemm.h)
//   with its bias, then the tail; within the dot-product bound of the reference's BLAS product, not bit-equal.
#include "conv_nhwc.h"

#include <algorithm>
#include <vector>

#include "cpu.h"
#include "packed_sgemm.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace npu_ep::kern {
namespace {

// Input row pointers of one output row's kernel rows: a zero row where the tap row is padding.
struct RowTaps {
  const float* rows[kNhwcMaxKernel];
};

void Rows(const NhwcDepthwise& d, int64_t n, int64_t oh, const float* zeros, RowTaps& r) {
  for (int64_t i = 0; i < d.kh; ++i) {
    const int64_t ih = oh * d.sh - d.pt + i;
    r.rows[i] = ih >= 0 && ih < d.H ? d.x + ((n * d.H + ih) * d.W) * d.C : zeros;
  }
}

// Output columns [lo, hi) whose taps all read inside the row (no column padding).
void Interior(const NhwcDepthwise& d, int64_t& lo, int64_t& hi) {
  lo = std::min(d.OW, (d.pl + d.sw - 1) / d.sw);
  hi = d.W - d.kw + d.pl >= 0 ? std::min(d.OW, (d.W - d.kw + d.pl) / d.sw + 1) : 0;
  if (hi < lo) hi = lo;
}

void RowScalar(const NhwcDepthwise& d, const RowTaps& r, float* y) {
  const int64_t C = d.C;
  for (int64_t ow = 0; ow < d.OW; ++ow, y += C) {
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d.kh; ++i)
        for (int64_t j = 0; j < d.kw; ++j) {
          const int64_t iw = ow * d.sw - d.pl + j;
          const float v = iw >= 0 && iw < d.W ? r.rows[i][iw * C + c] : 0.0f;
          const float p = v * d.w[(i * d.kw + j) * C + c];
          acc = i == 0 && j == 0 ? p : acc + p;
        }
      y[c] = d.bias != nullptr ? acc + d.bias[c] : acc;
    }
  }
}

#if NPU_EP_X86
// One output column's channels [c, c + 16) under `mask`, every tap checked against the row's ends.
__attribute__((target("avx512f"))) void ColumnChecked(const NhwcDepthwise& d, const RowTaps& r, int64_t ow, int64_t c,
                                                      __mmask16 mask, float* y) {
  const int64_t C = d.C;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d.kh; ++i)
    for (int64_t j = 0; j < d.kw; ++j) {
      const int64_t iw = ow * d.sw - d.pl + j;
      const __m512 v = iw >= 0 && iw < d.W ? _mm512_maskz_loadu_ps(mask, r.rows[i] + iw * C + c) : _mm512_setzero_ps();
      const __m512 p = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, d.w + (i * d.kw + j) * C + c));
      acc = i == 0 && j == 0 ? p : _mm512_add_ps(acc, p);
    }
  if (d.bias != nullptr) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, d.bias + c));
  _mm512_mask_storeu_ps(y + ow * C + c, mask, acc);
}

// Four interior output columns [ow, ow + 4) of channels [c, c + 16): each tap's weights loaded once.
__attribute__((target("avx512f"))) void Columns4(const NhwcDepthwise& d, const RowTaps& r, int64_t ow, int64_t c,
                                                 __mmask16 mask, float* y) {
  const int64_t C = d.C, step = d.sw * C;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < d.kh; ++i) {
    const float* row = r.rows[i] + (ow * d.sw - d.pl) * C + c;
    for (int64_t j = 0; j < d.kw; ++j, row += C) {
      const __m512 w = _mm512_maskz_loadu_ps(mask, d.w + (i * d.kw + j) * C + c);
      const __m512 p0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row), w);
      const __m512 p1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + step), w);
      const __m512 p2 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + 2 * step), w);
      const __m512 p3 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + 3 * step), w);
      if (i == 0 && j == 0) {
        a0 = p0, a1 = p1, a2 = p2, a3 = p3;
      } else {
        a0 = _mm512_add_ps(a0, p0), a1 = _mm512_add_ps(a1, p1);
        a2 = _mm512_add_ps(a2, p2), a3 = _mm512_add_ps(a3, p3);
      }
    }
  }
  if (d.bias != nullptr) {
    const __m512 b = _mm512_maskz_loadu_ps(mask, d.bias + c);
    a0 = _mm512_add_ps(a0, b), a1 = _mm512_add_ps(a1, b), a2 = _mm512_add_ps(a2, b), a3 = _mm512_add_ps(a3, b);
  }
  float* out = y + ow * C + c;
  _mm512_mask_storeu_ps(out, mask, a0);
  _mm512_mask_storeu_ps(out + C, mask, a1);
  _mm512_mask_storeu_ps(out + 2 * C, mask, a2);
  _mm512_mask_storeu_ps(out + 3 * C, mask, a3);
}

__attribute__((target("avx512f"))) void RowAvx512(const NhwcDepthwise& d, const RowTaps& r, float* y) {
  int64_t lo, hi;
  Interior(d, lo, hi);
  for (int64_t c = 0; c < d.C; c += 16) {
    const int64_t lanes = std::min<int64_t>(16, d.C - c);
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
    int64_t ow = 0;
    for (; ow < lo; ++ow) ColumnChecked(d, r, ow, c, mask, y);
    for (; ow + 4 <= hi; ow += 4) Columns4(d, r, ow, c, mask, y);
    for (; ow < d.OW; ++ow) ColumnChecked(d, r, ow, c, mask, y);
  }
}
#endif

}  // namespace

void DepthwiseNhwc(const NhwcDepthwise& d, int threads) {
  const int64_t rows = d.N * d.OH;
  if (rows == 0 || d.C == 0) return;
  const std::vector<float> zeros(static_cast<size_t>(d.W * d.C), 0.0f);
#if NPU_EP_X86
  const bool wide = ActiveIsa() >= Isa::kAvx512;
#else
  const bool wide = false;
#endif
  const int64_t row_work = d.OW * d.C * d.kh * d.kw;
  const int64_t per_task = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, row_work));
  const int64_t tasks = (rows + per_task - 1) / per_task;
  ParallelFor(ThreadsFor(threads, rows * row_work), tasks, [&](int64_t t) {
    for (int64_t row = t * per_task; row < std::min(rows, (t + 1) * per_task); ++row) {
      RowTaps r;
      Rows(d, row / d.OH, row % d.OH, zeros.data(), r);
      float* y = d.y + row * d.OW * d.C;
#if NPU_EP_X86
      if (wide)
        RowAvx512(d, r, y);
      else
#endif
        RowScalar(d, r, y);
      (void)wide;
      if (d.tail.n > 0) ApplyTail(d.tail, y, d.OW * d.C);
    }
  });
}

void PointwiseNhwc(const float* x, int64_t P, int64_t C, const float* packed, int64_t M, const float* bias,
                   const ConvTail& tail, float* y, int threads) {
  // pixel blocks so that the tail runs on each block's outputs while they are in cache
  const int64_t block = std::max<int64_t>(64, ((int64_t{1} << 15) / std::max<int64_t>(1, M) + 15) / 16 * 16);
  const int64_t blocks = (P + block - 1) / block;
  const int inner = ThreadsFor(threads, P * C * M) > 1 && blocks < 2 * threads ? threads : 1;
  ParallelFor(inner > 1 ? 1 : ThreadsFor(threads, P * C * M), blocks, [&](int64_t b) {
    const int64_t p0 = b * block, rows = std::min(block, P - p0);
    const PackedSgemmArgs g{x + p0 * C, rows, C, C, packed, M, y + p0 * M, M, bias, false};
    PackedSgemm(g, inner, nullptr, nullptr);
    if (tail.n > 0) ApplyTail(tail, y + p0 * M, rows * M);
  });
}

}  // namespace npu_ep::kern
