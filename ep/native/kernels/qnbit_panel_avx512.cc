// The fp32 levels' int4 GEMM from M = 16 on, on AVX-512 without the BLAS: a task's columns, dequantized into a
// [columns, kc] panel (the same floats the BLAS path multiplies, in natural k order so A's rows are read where
// they are), times A's rows in one of two forms:
// - dot products (k in the lanes): blocks of 4 rows x 4 columns, each output a 16-lane FMA sum over kc reduced
//   once at the end; 32 rows of A at a time meet every column block;
// - from kOuterMinRows rows on, outer products: the panel re-laid out k-major in groups of 16 columns, blocks of up
//   to 8 rows x 32 columns, each row's A value broadcast against two column vectors, every output summed over k
//   in order (no horizontal sums, which are a large share of the dot form's work at small K).
// Numpy's OpenBLAS ran these products (A x B^T at M = 32) at ~25 GMAC/s on one thread here and barely scaled to
// two; this kernel shares nothing between threads.
#include <algorithm>
#include <vector>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"
#include "scratch.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512F "avx2,fma,avx512f,avx512dq"

// r[i] holds 16 dwords of row i; afterwards r[t] holds dword t of the 16 rows (a 16 x 16 transpose of 32-bit
// values: int32 or, cast, float32).
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 8)
#pragma GCC unroll 16
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xDD);
    }
#pragma GCC unroll 16
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD);
  }
}

constexpr int64_t kGroup = 16;     // columns per k-major group (one vector)
constexpr int64_t kRowChunk = 32;  // rows of A kept hot while every column block of the panel passes them
// From this many rows on, the outer-product form: re-laying the panel out k-major costs per weight about what 24
// rows' products save; below it, the dot-product form (no re-layout, horizontal sums at the end). The outer form
// sums each output by FMAs in order of k from zero, as MLAS's fp32 kernel does, so from here on the bits are ORT's.
constexpr int64_t kOuterMinRows = 32;

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

// Columns [0, C) of the panel against `rows` rows of A, 4 rows at a time (the dot-product form).
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

// panel [cols, kc] -> packed [groups][kc][16]; columns past `cols` are zero.
__attribute__((target(NPU_AVX512F))) void PackKMajor(const float* panel, int64_t cols, int64_t kc, float* packed) {
  const int64_t groups = (cols + kGroup - 1) / kGroup;
  for (int64_t g = 0; g < groups; ++g) {
    float* dst = packed + g * kc * kGroup;
    for (int64_t k = 0; k < kc; k += 16) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t c = g * kGroup + j;
        r[j] = c < cols ? _mm512_castps_si512(_mm512_loadu_ps(panel + c * kc + k)) : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (k + i) * kGroup, r[i]);
    }
  }
}

// y[r * ldy + v * 16 + l] = sum over k in order of a[r * kc + k] * group_v[k * 16 + l], for R rows and V groups;
// the last group stores only the lanes in `last`.
template <int R, int V>
__attribute__((target(NPU_AVX512F))) inline void Outer(const float* a, const float* const* group, int64_t kc, float* y,
                                                        int64_t ldy, __mmask16 last) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(group[v] + k * kGroup);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * kc + k]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + r * ldy + v * kGroup, v == V - 1 ? last : static_cast<__mmask16>(0xFFFF), acc[r][v]);
}

// `rows` rows of A against V groups, 8 rows at a time.
template <int V>
__attribute__((target(NPU_AVX512F))) void Rows(const float* a, int64_t rows, const float* const* group, int64_t kc,
                                               float* y, int64_t ldy, __mmask16 last) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) Outer<8, V>(a + r * kc, group, kc, y + r * ldy, ldy, last);
  switch (rows - r) {
    case 7: Outer<7, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 6: Outer<6, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 5: Outer<5, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 4: Outer<4, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 3: Outer<3, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 2: Outer<2, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    case 1: Outer<1, V>(a + r * kc, group, kc, y + r * ldy, ldy, last); break;
    default: break;
  }
}

}  // namespace

__attribute__((target(NPU_AVX512F))) void PanelGemmAvx512(const float* a, int64_t rows, const float* panel,
                                                          int64_t cols, int64_t kc, float* y, int64_t ldy) {
  if (rows < kOuterMinRows) {
    for (int64_t r = 0; r < rows; r += kRowChunk) {
      const int64_t n = std::min(kRowChunk, rows - r);
      int64_t c = 0;
      for (; c + 4 <= cols; c += 4) Cols<4>(a + r * kc, n, panel + c * kc, kc, y + r * ldy + c, ldy);
      for (; c < cols; ++c) Cols<1>(a + r * kc, n, panel + c * kc, kc, y + r * ldy + c, ldy);
    }
    return;
  }
  static thread_local std::vector<float> scratch;  // the packed panel: grown, never cleared (all of it written)
  const int64_t groups = (cols + kGroup - 1) / kGroup;
  float* packed = Grow(scratch, groups * kc * kGroup);
  PackKMajor(panel, cols, kc, packed);
  for (int64_t r = 0; r < rows; r += kRowChunk) {
    const int64_t n = std::min(kRowChunk, rows - r);
    for (int64_t g = 0; g < groups; g += 2) {
      const int64_t c0 = g * kGroup, width = std::min<int64_t>(2 * kGroup, cols - c0);
      const int64_t tail = width - (width > kGroup ? kGroup : 0);  // columns in the last group stored
      const __mmask16 last = static_cast<__mmask16>(tail >= 16 ? 0xFFFF : (1u << tail) - 1);
      const float* group[2] = {packed + g * kc * kGroup, packed + std::min(g + 1, groups - 1) * kc * kGroup};
      if (width > kGroup)
        Rows<2>(a + r * kc, n, group, kc, y + r * ldy + c0, ldy, last);
      else
        Rows<1>(a + r * kc, n, group, kc, y + r * ldy + c0, ldy, last);
    }
  }
}

}  // namespace npu_ep::kern::nbits

#endif
