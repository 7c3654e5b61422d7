// The vector work around an int4 matmul in a fused decoder step: the RMS-norm prologue of npu::NormMatMul and the
// SwiGLU epilogue of npu::MatMulGroup, so a fused norm + gate/up projection is one native call instead of the
// GEMV plus a dozen small numpy operations.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

// CBLAS sdot with 64-bit integers from the BLAS numpy loaded (kernels/host_blas.py): numpy's float32 dot calls it,
// so the Simplified statistics here have the reference model's bits.
using Sdot64 = float (*)(int64_t n, const float* x, int64_t incx, const float* y, int64_t incy);

struct RmsPrologue {
  const float* x = nullptr;          // [M, K]
  const float* skip = nullptr;       // [M, K] or null (SimplifiedLayerNormalization)
  const float* norm_bias = nullptr;  // [K] or null (Skip* only)
  const float* gamma = nullptr;      // [K] or null
  int64_t M = 0, K = 0;
  double eps = 1e-5;
  Sdot64 sdot = nullptr;             // null: a sequential float32 dot (within a few ulp of the BLAS one)
  float* a = nullptr;                // [M, K] out: the normalized rows, the matmul's A
  float* sum = nullptr;              // [M, K] out or null: Skip*'s input + skip (+ bias)
};

// Skip*: s = x + skip (+ bias); a = s / sqrt(sum(s*s) / K + eps) * gamma, the squares summed left to right in
// float32 and sqrt/division in float32 (ORT's SkipSimplifiedLayerNormalization, as kernels/ops/norm.skip_rms).
// Simplified: a = (x * gamma) * float(1 / sqrt(double(dot(x, x)) / K + eps)) (kernels/ops/norm: inv_rms, and
// the unfused kernel's order of the two products).
// Rows run in fixed tasks on up to `threads` threads: the same bits at any thread count.
void RunRmsPrologue(const RmsPrologue& p, int threads);

// out[m, j] = g * sigmoid(g) * u for g = y[m, j], u = y[m, half + j], computed as g / (1 + exp(min(-g, 80))) * u
// (kernels/ops/matmul_group._silu_mul); y is [M, 2 * half].
void SwiGlu(const float* y, int64_t M, int64_t half, float* out, int threads);

}  // namespace npu_ep::kern
