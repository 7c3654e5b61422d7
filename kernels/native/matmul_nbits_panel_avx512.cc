// The fp32 levels' int4 GEMM from kOuterMinRows rows on, on AVX-512 without the BLAS: a task's columns are
// dequantized straight into k-major groups of 16 columns, then multiplied as outer products: blocks of up to 8 rows x
// 32 columns, each row's A value broadcast against two column vectors, every output summed over k in order from zero
// (as MLAS's fp32 kernel sums, so the bits are ORT's; no horizontal sums, which were a large share of a dot-product
// form's work at small K). Numpy's OpenBLAS ran these products (A x B^T at M = 32) at ~25 GMAC/s on one thread here
// and barely scaled to two; this kernel shares nothing between threads.
#include <algorithm>
#include <vector>

#include "intrinsics.h"
#include "matmul_nbits_internal.h"
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
constexpr int64_t kRowChunk = 32;  // rows of A kept hot while every column group passes them

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

// Per 64 bytes of the 16 columns' packed rows (128 k), one 16 x 16 transpose of their dwords puts in vector t the
// 8 nibbles of k in [8t, 8t + 8) of every column; each nibble then becomes (q - zp) * scale, rounded once, as
// DequantColAvx512 computes it. A transpose of the nibbles is an eighth of one of the floats.
__attribute__((target(NPU_AVX512F))) void DequantKMajorAvx512(const NBitsGemm& g, const Shape& s, int64_t n0,
                                                              int64_t n1, float* out) {
  static thread_local std::vector<float> t_scale;   // [kb][16] the group's block scales (0 past its columns)
  static thread_local std::vector<int32_t> t_zp;    // [kb][16] its zero points (0 past its columns)
  float* scale = Grow(t_scale, s.kb * kGroup);
  int32_t* zp = Grow(t_zp, s.kb * kGroup);
  const __m512i nibble = _mm512_set1_epi32(0x0F);
  const int64_t kq = 2 * s.row_bytes;  // k the blocks hold: K rounded up to the block size
  for (int64_t c0 = n0; c0 < n1; c0 += kGroup) {
    const int cols = static_cast<int>(std::min<int64_t>(kGroup, n1 - c0));
    float* dst = out + (c0 - n0) * s.kc;  // this group: [kc][16]
    const uint8_t* b[kGroup];
    for (int j = 0; j < kGroup; ++j) {
      if (j < cols) {
        const Column col = ColumnOf(g, s, c0 + j);
        b[j] = col.b;
        for (int64_t blk = 0; blk < s.kb; ++blk) {
          scale[blk * kGroup + j] = col.sw[blk];
          zp[blk * kGroup + j] = ZeroPoint(col.zp, blk);
        }
      } else {
        b[j] = nullptr;
        for (int64_t blk = 0; blk < s.kb; ++blk) {
          scale[blk * kGroup + j] = 0.0f;
          zp[blk * kGroup + j] = 0;
        }
      }
    }
    for (int64_t off = 0; off < s.row_bytes; off += 64) {
      const int dwords = static_cast<int>(std::min<int64_t>(64, s.row_bytes - off) / 4);  // row_bytes: whole dwords
      const __mmask16 m = static_cast<__mmask16>(dwords >= 16 ? 0xFFFF : (1u << dwords) - 1);
      __m512i r[16];
      for (int j = 0; j < kGroup; ++j)
        r[j] = b[j] != nullptr ? _mm512_maskz_loadu_epi32(m, b[j] + off) : _mm512_setzero_si512();
      Transpose16x16(r);
      for (int t = 0; t < dwords; ++t) {
        const int64_t k0 = 2 * off + 8 * t, blk = k0 >> s.bs_log2;  // a block holds whole dwords (bs >= 16)
        const __m512 sc = _mm512_loadu_ps(scale + blk * kGroup);
        const __m512i z = _mm512_loadu_si512(zp + blk * kGroup);
#pragma GCC unroll 8
        for (int e = 0; e < 8; ++e) {
          const __m512i q = _mm512_and_si512(_mm512_srli_epi32(r[t], 4 * e), nibble);
          _mm512_storeu_ps(dst + (k0 + e) * kGroup, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, z)), sc));
        }
      }
    }
    std::fill(dst + kq * kGroup, dst + s.kc * kGroup, 0.0f);
  }
}

__attribute__((target(NPU_AVX512F))) void OuterGemmAvx512(const float* a, int64_t rows, const float* packed,
                                                          int64_t cols, int64_t kc, float* y, int64_t ldy) {
  const int64_t groups = (cols + kGroup - 1) / kGroup;
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
