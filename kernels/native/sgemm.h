// The float GEMM library the native kernels call: CBLAS sgemm with 64-bit integers from the BLAS numpy already
// loaded (OpenBLAS in numpy's wheels; its address comes from kernels/host_blas.py), so no BLAS is linked here.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

using Sgemm64 = void (*)(int order, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// CBLAS enum values
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

}  // namespace npu_ep::kern
