// The float conv's GEMM of our own, where the BLAS is slow on a conv's small products (see conv_gemm_avx512.cc).
#pragma once

#include <cstdint>

#include "conv_geometry.h"
#include "conv_tail.h"
#include "cpu.h"

namespace npu_ep::kern {

// One vector of up to 16 output pixels: the pixels' column offset in B's rows, their offset in each C row, count.
struct GemmSlot {
  int64_t in, out;
  int n;
};

#if NPU_EP_X86
// c[m * ldc + s.out + l] = sum_k at[k * lda + m] * b[koff[k] + s.in + l] for m < M, every slot s and lane
// l < s.n, on the calling thread; then + bias[m] (if bias), then clipped to [clip[0], clip[1]] (if clip; NaN
// stays NaN), in that order. A is the conv's packed weights [K x M]; B's rows are found through koff, so one kernel
// serves a patch matrix (koff[k] = k * pitch) and a zero-padded input read in place (koff[k] = the tap's offset).
// AVX-512F only: callers check ActiveIsa() first.
void GemmAvx512(int64_t M, int64_t K, const float* at, int64_t lda, const float* b, const int64_t* koff,
                const GemmSlot* slots, int64_t n_slots, float* c, int64_t ldc, const float* bias, const float* clip);

// c[m * ldc + p] = sum_k at[k * lda + m] * b[k * ldb + p] (+ bias[m], clipped) for m < M, p < P, the output
// channels in the lanes (a 1x1 conv over fewer than 16 pixels), each output summed as GemmAvx512 sums it.
void ChannelLanesAvx512(int64_t M, int64_t K, const float* at, int64_t lda, const float* b, int64_t ldb, int64_t P,
                        float* c, int64_t ldc, const float* bias, const float* clip);

// DenseFloat (conv.h) on GemmAvx512 instead of the BLAS (conv_gemm.cc); same arguments, AVX-512F only.
void DenseFloatOwnGemm(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                       const ConvTail& tail);
// A 1x1, stride-1, unpadded DenseFloat over fewer than 16 pixels on ChannelLanesAvx512 (conv_gemm.cc).
void PointwiseFewPixels(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                        const ConvTail& tail);
#endif

}  // namespace npu_ep::kern
