// The float conv's GEMM of our own, where the BLAS is slow on a conv's small products (see conv_gemm_avx512.cc).
#pragma once

#include <cstdint>

#include "conv_geometry.h"
#include "conv_tail.h"
#include "cpu.h"

namespace npu_ep::kern {

// One vector of n <= 16 output pixels, consecutive in C's rows (from column `out` on). Lane l < split reads B's
// rows at column in + l, lane l >= split at in + jump + l: a vector that crosses from one output row into the next
// skips the padding columns between them in a padded input read in place (split = n: no jump).
struct GemmSlot {
  int64_t in, out;
  int n;
  int split;
  int64_t jump;
};

#if NPU_EP_X86
// c[m * ldc + s.out + l] = sum_k at[k * lda + m] * b[koff[k] + s.in + l (+ s.jump from lane s.split on)] for
// m < M, every slot s and lane l < s.n, on the calling thread; then + bias[m] (if bias), then clipped to
// [clip[0], clip[1]] (if clip; NaN stays NaN), then HardSwish with hswish = {a, b, lo, hi} (if hswish: conv_tail.h's
// HardSwishTail), in that order. A is the conv's packed weights [K x M]; B's rows are
// found through koff, so one kernel serves a patch matrix (koff[k] = k * pitch) and a zero-padded input read in
// place (koff[k] = the tap's offset). A slot with a jump reads B up to 16 floats past its last lane's. Each output is
// summed in k order with fused multiply-adds from zero per pass of 256 k, the passes added in order: the tiling and the
// slots never change an output's bits. AVX-512F only: callers check ActiveIsa() first.
void GemmAvx512(int64_t M, int64_t K, const float* at, int64_t lda, const float* b, const int64_t* koff,
                const GemmSlot* slots, int64_t n_slots, float* c, int64_t ldc, const float* bias, const float* clip,
                const float* hswish);

// c[m * ldc + pout[p]] = sum_k at[k * lda + m] * b[koff[k] + pin[p]] (+ bias[m], clip, hswish) for m < M (a multiple
// of 16), p < n_pix: the output channels in the lanes, for small maps whose pixels fill vectors badly (a 10x10 map
// read in place), each output summed as GemmAvx512 sums it; AVX-512F only.
void ChannelGemmAvx512(int64_t M, int64_t K, const float* at, int64_t lda, const float* b, const int64_t* koff,
                       const int64_t* pin, const int64_t* pout, int64_t n_pix, float* c, int64_t ldc, const float* bias,
                       const float* clip, const float* hswish);

// dst[r * wq + q] = plane[(ih0 + r) * W + q - pl] for r < rows, q < wq <= 64, zeros where that is outside the H x W
// plane (a stride-1 conv's zero-padded input rows); AVX-512F only.
void PaddedRowsAvx512(const float* plane, int64_t H, int64_t W, int64_t ih0, int64_t rows, int64_t pl, int64_t wq,
                      float* dst);

// even[q] = src[2q], odd[q] = src[2q + 1] for q < n (reads src[0, 2n)); AVX-512F only.
void EvenOddAvx512(const float* src, int64_t n, float* even, float* odd);

// DenseFloat (conv.h) on GemmAvx512 instead of the BLAS (conv_gemm.cc); same arguments, AVX-512F only.
void DenseFloatOwnGemm(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                       const ConvTail& tail);

// Output channels per panel of conv_panels' weights (conv_panels.h; packed by kernels/ops/conv.py).
constexpr int64_t kPanel = 64;
#endif

}  // namespace npu_ep::kern
