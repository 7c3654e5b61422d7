// accuracy_level 4's int4 GEMM for M > 1 on AVX-512, with columns in the lanes.
//
// A task re-lays out 32 columns of B once (nibbles unpacked to bytes 0..15, k-major in 4-byte groups: [block]
// [k / 4][32 columns][4 bytes], the form VPDPBUSD takes) into a thread's L2-sized scratch, with their scales and
// zero points transposed to [block][32 columns]. Then blocks of 4 rows x 32 columns run over it: per 4 elements of
// k one DPBUSD per 16 outputs, A's 4 codes broadcast; per block one zero-point term, one convert, one scale and one
// FMA per 16 outputs. Each output is so summed exactly in int32 per block and accumulated over the blocks in order
// (y = fma(float(dot_b - zp_b * sum_b(a)), sw_b * sa_b, y)): the bits of the decode kernel
// (qnbit_gemv_avx512.cc) and of the scalar path. The re-layout costs per weight what several rows' products do,
// so level 4 takes this path from 8 rows on (qnbit_gemm.cc).
#include <algorithm>
#include <cstring>
#include <vector>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"
#include "scratch.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

constexpr int kCols = 32;  // columns per pass: two vectors
constexpr int kRows = 4;   // rows per block: 8 int32 and 8 float accumulators

// The re-laid-out columns of one pass.
struct Panel {
  const uint8_t* b;    // [kb][bs / 4][kCols][4] nibble values
  const float* sw;     // [kb][kCols]
  const int32_t* zp;   // [kb][kCols], or null: symmetric (8)
};

// w[i] holds 16 words of column i; afterwards w[t] holds word t of the 16 columns: 8 x 8 transposes inside the
// 128-bit lanes of rows 0-7 and 8-15, then their lanes exchanged.
__attribute__((target(NPU_AVX512), always_inline)) inline void Transpose16x16Words(__m256i w[16]) {
  __m256i a[16], b[16];
#pragma GCC unroll 16
  for (int g = 0; g < 16; g += 8) {
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
      a[g + i] = _mm256_unpacklo_epi16(w[g + i], w[g + i + 1]);
      a[g + i + 1] = _mm256_unpackhi_epi16(w[g + i], w[g + i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 4) {
      b[g + i] = _mm256_unpacklo_epi32(a[g + i], a[g + i + 2]);
      b[g + i + 1] = _mm256_unpackhi_epi32(a[g + i], a[g + i + 2]);
      b[g + i + 2] = _mm256_unpacklo_epi32(a[g + i + 1], a[g + i + 3]);
      b[g + i + 3] = _mm256_unpackhi_epi32(a[g + i + 1], a[g + i + 3]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // word order: b[g+i] holds words 2i, 2i+1 of rows g..g+3 and of g+4..g+7 in b[g+4+i]
      a[g + 2 * i] = _mm256_unpacklo_epi64(b[g + i], b[g + 4 + i]);
      a[g + 2 * i + 1] = _mm256_unpackhi_epi64(b[g + i], b[g + 4 + i]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) {  // a[t]: word t (low lane) and t + 8 (high lane) of rows 0-7; a[8 + t] of rows 8-15
    w[t] = _mm256_permute2x128_si256(a[t], a[8 + t], 0x20);
    w[t + 8] = _mm256_permute2x128_si256(a[t], a[8 + t], 0x31);
  }
}

// Columns [n0, n1) (a short pass repeats its last column) into the scratch, 64 elements (32 packed bytes, masked at
// the row's end) of 16 columns per transpose.
__attribute__((target(NPU_AVX512))) Panel Relayout(const NBitsGemm& g, const Shape& s, int64_t n0, int64_t n1) {
  static thread_local std::vector<uint8_t> b_scratch;
  static thread_local std::vector<float> sw_scratch;
  static thread_local std::vector<int32_t> zp_scratch;
  const int64_t elems = s.kb * s.bs;
  uint8_t* b = Grow(b_scratch, elems * kCols);
  float* sw = Grow(sw_scratch, s.kb * kCols);
  const bool symmetric = Symmetric(g);
  int32_t* zp = symmetric ? nullptr : Grow(zp_scratch, s.kb * kCols);
  Column cols[kCols];
  for (int j = 0; j < kCols; ++j) cols[j] = ColumnOf(g, s, std::min(n0 + j, n1 - 1));
  for (int64_t blk = 0; blk < s.kb; ++blk)
    for (int j = 0; j < kCols; ++j) {
      sw[blk * kCols + j] = cols[j].sw[blk];
      if (!symmetric) zp[blk * kCols + j] = (cols[j].zp[blk >> 1] >> ((blk & 1) * 4)) & 0x0F;
    }
  const __m512i m0f = _mm512_set1_epi8(0x0F);
  // per dword of packed bytes [b0, b1, 0, 0]: [b0, b0, b1, b1]; then odd bytes take the high nibble
  const __m512i spread = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 1, 1, 4, 4, 5, 5, 8, 8, 9, 9, 12, 12, 13, 13));
  const int64_t steps = s.bs / 4;  // 4-element groups per block
  for (int half = 0; half < 2; ++half) {
    for (int64_t e0 = 0; e0 < elems; e0 += 64) {
      const int64_t bytes = std::min<int64_t>(32, s.row_bytes - e0 / 2);
      const __mmask32 mask = static_cast<__mmask32>(bytes >= 32 ? ~0u : (1u << bytes) - 1);
      __m256i w[16];  // column j's 16 packed words (4 elements each), then word t of the 16 columns
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) w[j] = _mm256_maskz_loadu_epi8(mask, cols[16 * half + j].b + e0 / 2);
      Transpose16x16Words(w);
#pragma GCC unroll 16
      for (int t = 0; t < 16 && e0 + 4 * t < elems; ++t) {
        const __m512i x = _mm512_shuffle_epi8(_mm512_cvtepu16_epi32(w[t]), spread);
        const __m512i nibbles = _mm512_and_si512(
            _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, x, _mm512_srli_epi16(x, 4)), m0f);
        const int64_t e = e0 + 4 * t, blk = e >> s.bs_log2, step = (e & (s.bs - 1)) / 4;
        _mm512_storeu_si512(b + ((blk * steps + step) * kCols + 16 * half) * 4, nibbles);
      }
    }
  }
  return {b, sw, zp};
}

// kRows rows (pointers repeat the last real row) x kCols columns; the first `rows` rows are stored to y[r] (the
// columns in `cols`, plus the bias, or plus 0.0 as the decode kernel does: -0.0 stays +0.0 either way).
#define NPU_INT8_PANEL_TILE(NAME, TARGET, DPBUSD)                                                                  \
  __attribute__((target(TARGET))) void NAME(const Panel& p, const Shape& s, const int8_t* const q[kRows],         \
                                            const float* const sa[kRows], const int32_t* const asum[kRows],      \
                                            const float* bias, uint32_t cols, int rows, float* const y[kRows]) { \
    const int64_t steps = s.bs / 4;                                                                            \
    __m512 f[kRows][2];                                                                                         \
    _Pragma("GCC unroll 4") for (int r = 0; r < kRows; ++r) f[r][0] = f[r][1] = _mm512_setzero_ps();           \
    for (int64_t blk = 0; blk < s.kb; ++blk) {                                                                  \
      __m512i d[kRows][2];                                                                                      \
      _Pragma("GCC unroll 4") for (int r = 0; r < kRows; ++r) {                                                 \
        const __m512i nsum = _mm512_set1_epi32(-asum[r][blk]);                                                  \
        if (p.zp == nullptr) {                                                                                  \
          d[r][0] = d[r][1] = _mm512_slli_epi32(nsum, 3); /* zero point 8 */                                    \
        } else {                                                                                                \
          d[r][0] = _mm512_mullo_epi32(_mm512_loadu_si512(p.zp + blk * kCols), nsum);                           \
          d[r][1] = _mm512_mullo_epi32(_mm512_loadu_si512(p.zp + blk * kCols + 16), nsum);                      \
        }                                                                                                       \
      }                                                                                                         \
      const uint8_t* pb = p.b + blk * steps * kCols * 4;                                                        \
      const int64_t e = blk * s.bs;                                                                             \
      for (int64_t t = 0; t < steps; ++t) {                                                                     \
        const __m512i b0 = _mm512_loadu_si512(pb + t * kCols * 4), b1 = _mm512_loadu_si512(pb + t * kCols * 4 + 64); \
        _Pragma("GCC unroll 4") for (int r = 0; r < kRows; ++r) {                                               \
          int32_t codes;                                                                                        \
          std::memcpy(&codes, q[r] + e + 4 * t, 4);                                                             \
          const __m512i a = _mm512_set1_epi32(codes);                                                           \
          d[r][0] = DPBUSD(d[r][0], b0, a);                                                                     \
          d[r][1] = DPBUSD(d[r][1], b1, a);                                                                     \
        }                                                                                                       \
      }                                                                                                         \
      const __m512 s0 = _mm512_loadu_ps(p.sw + blk * kCols), s1 = _mm512_loadu_ps(p.sw + blk * kCols + 16);     \
      _Pragma("GCC unroll 4") for (int r = 0; r < kRows; ++r) {                                                 \
        const __m512 sr = _mm512_set1_ps(sa[r][blk]);                                                           \
        f[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][0]), _mm512_mul_ps(s0, sr), f[r][0]);                 \
        f[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][1]), _mm512_mul_ps(s1, sr), f[r][1]);                 \
      }                                                                                                         \
    }                                                                                                           \
    const __mmask16 m0 = static_cast<__mmask16>(cols), m1 = static_cast<__mmask16>(cols >> 16);                \
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();                             \
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();                        \
    for (int r = 0; r < rows; ++r) {                                                                            \
      _mm512_mask_storeu_ps(y[r], m0, _mm512_add_ps(f[r][0], b0));                                              \
      _mm512_mask_storeu_ps(y[r] + 16, m1, _mm512_add_ps(f[r][1], b1));                                         \
    }                                                                                                           \
  }

NPU_INT8_PANEL_TILE(TileBw, NPU_AVX512, DpbusdBw)
NPU_INT8_PANEL_TILE(TileVnni, NPU_AVX512 ",avx512vnni", DpbusdTied)

}  // namespace

void Int8PanelAvx512(const NBitsGemm& g, const Shape& s, const Int8A& a, bool vnni, int64_t r0, int64_t r1,
                     int64_t n0, int64_t n1) {
  const auto tile = vnni ? TileVnni : TileBw;
  for (int64_t c0 = n0; c0 < n1; c0 += kCols) {
    const int64_t c1 = std::min(n1, c0 + kCols);
    const Panel p = Relayout(g, s, c0, c1);
    const uint32_t cols = c1 - c0 == kCols ? ~0u : (1u << (c1 - c0)) - 1;  // the real columns' lanes
    for (int64_t m0 = r0; m0 < r1; m0 += kRows) {
      const int8_t* q[kRows];
      const float* sa[kRows];
      const int32_t* asum[kRows];
      float* y[kRows];
      for (int r = 0; r < kRows; ++r) {
        const int64_t m = std::min(m0 + r, r1 - 1);
        q[r] = a.q + m * s.kc;
        sa[r] = a.scale + m * s.kb;
        asum[r] = a.block + m * s.kb;
        y[r] = g.y + m * s.N + c0;
      }
      const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - m0));
      tile(p, s, q, sa, asum, g.bias ? g.bias + c0 : nullptr, cols, rows, y);
    }
  }
}

}  // namespace npu_ep::kern::nbits

#endif  // NPU_EP_X86
