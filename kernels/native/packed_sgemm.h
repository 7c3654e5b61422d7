// A float32 product with a constant B, B packed once into column panels (what a BLAS packs on every call), the
// native float MatMul for large products on AVX-512 hosts (kernels/ops/matmul.py). Its sums run in a fixed order
// that is not numpy's BLAS's, so it matches the reference model within float tolerance, not bit for bit; every
// ISA path, thread count and tile plan gives the same bits.
#pragma once

#include <cstdint>

#include "cpu.h"
#include "tile_dma.h"

namespace npu_ep::kern {

// Packed B: panels of kSgemmPanel columns, panel p holding B[k, p * kSgemmPanel + j] at
// packed[(p * K + k) * kSgemmPanel + j], zero past column N.
constexpr int64_t kSgemmPanel = 32;
constexpr int64_t kSgemmDepthChunk = 256;
void PackSgemmB(const float* b, int64_t K, int64_t N, float* packed);

// c[m * ldc + n] = the sum over k of a[m * lda + k] * B[k, n]: fused multiply-adds in order of k within chunks of
// kSgemmDepthChunk, from zero, the chunks' sums added in order; then + bias[n] (if bias), then ReLU as
// np.maximum(y, 0) (if relu: NaN stays, -0 becomes +0).
struct PackedSgemmArgs {
  const float* a;
  int64_t M, K, lda;
  const float* packed;
  int64_t N;
  float* c;
  int64_t ldc;
  const float* bias;
  bool relu;
};

// On up to `threads` threads; with an active plan, the plan's output tiles in its order, their DMA counted into
// *dma when given (tile_dma.h's RunTiles).
void PackedSgemm(const PackedSgemmArgs& g, int threads, const TilePlanArgs* plan, DmaCount* dma);

#if NPU_EP_X86
// Rows [m0, m1) x panels [p0, p1) on the calling thread, written from `out` (element (m0, p0 * kSgemmPanel)) with
// row pitch ldo; AVX-512F only (packed_sgemm_avx512.cc).
void PackedSgemmBlockAvx512(const PackedSgemmArgs& g, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* out,
                            int64_t ldo);
#endif

}  // namespace npu_ep::kern
