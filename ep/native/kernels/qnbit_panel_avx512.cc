// The fp32 levels' int4 GEMM from M = 16 on, on AVX-512 without the BLAS: a task's columns, dequantized into a
// [columns, kc] panel (the same floats the BLAS path multiplies, in natural k order so A's rows are read where
// they are), times A's rows in blocks of 4 rows x 4 columns,
// each output a 16-lane FMA sum over kc reduced once at the end; 32 rows of A at a time meet every column block.
// Numpy's OpenBLAS ran these products (A x B^T at M = 32) at ~25 GMAC/s on one thread here and barely scaled to
// two; this kernel shares nothing between threads.
#include <algorithm>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512F "avx2,fma,avx512f,avx512dq"

// out[r * ldy + c] = sum_k a[r * kc + k] * w[c * kc + k] for R rows and C columns (kc a multiple of 16).
template <int R, int C>
__attribute__((target(NPU_AVX512F))) inline void Block(const float* a, const float* w, int64_t kc, float* out,
                                                        int64_t ldy) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k += 16) {
    __m512 wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * kc + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_loadu_ps(a + r * kc + k);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(av, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
}

// Columns [0, C) of the panel against `rows` rows of A, 4 rows at a time.
template <int C>
__attribute__((target(NPU_AVX512F))) void Cols(const float* a, int64_t rows, const float* w, int64_t kc, float* y,
                                               int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) Block<4, C>(a + r * kc, w, kc, y + r * ldy, ldy);
  switch (rows - r) {
    case 3: Block<3, C>(a + r * kc, w, kc, y + r * ldy, ldy); break;
    case 2: Block<2, C>(a + r * kc, w, kc, y + r * ldy, ldy); break;
    case 1: Block<1, C>(a + r * kc, w, kc, y + r * ldy, ldy); break;
    default: break;
  }
}

constexpr int64_t kRowChunk = 32;  // rows of A kept hot while every column block of the panel passes them

}  // namespace

__attribute__((target(NPU_AVX512F))) void PanelGemmAvx512(const float* a, int64_t rows, const float* panel,
                                                          int64_t cols, int64_t kc, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; r += kRowChunk) {
    const int64_t n = std::min(kRowChunk, rows - r);
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) Cols<4>(a + r * kc, n, panel + c * kc, kc, y + r * ldy + c, ldy);
    for (; c < cols; ++c) Cols<1>(a + r * kc, n, panel + c * kc, kc, y + r * ldy + c, ldy);
  }
}

}  // namespace npu_ep::kern::nbits

#endif
