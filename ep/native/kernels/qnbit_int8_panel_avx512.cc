// accuracy_level 4's int4 GEMM for M > 1 on AVX-512, with columns in the lanes.
//
// A task re-lays out 32 columns of B once (nibbles unpacked to bytes 0..15, k-major in 4-byte groups: [block]
// [k / 4][32 columns][4 bytes], the form VPDPBUSD takes) into a thread's L2-sized scratch, with their scales and
// zero points transposed to [block][32 columns]. Then blocks of 4 rows x 32 columns run over it: per 4 elements of
// k one DPBUSD per 16 outputs, A's 4 codes broadcast; per block one zero-point term, one convert, one scale and one
// FMA per 16 outputs. Each output is so summed exactly in int32 per block and accumulated over the blocks in order
// (y = fma(float(dot_b - zp_b * sum_b(a)), sw_b * sa_b, y)): the bits of the decode kernel
// (qnbit_gemv_avx512.cc) and of the scalar path. The re-layout costs per weight what a few rows' products do, so
// it pays from M = 2 on.
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
  const __m256i m0f = _mm256_set1_epi8(0x0F);
  const int64_t steps = s.bs / 4;  // 4-element groups per block
  for (int half = 0; half < 2; ++half) {
    for (int64_t e0 = 0; e0 < elems; e0 += 64) {
      const int64_t bytes = std::min<int64_t>(32, s.row_bytes - e0 / 2);
      const __mmask32 mask = static_cast<__mmask32>(bytes >= 32 ? ~0u : (1u << bytes) - 1);
      __m512i r[16];
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        const __m256i raw = _mm256_maskz_loadu_epi8(mask, cols[16 * half + j].b + e0 / 2);
        const __m256i lo = _mm256_and_si256(raw, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f);
        const __m256i x0 = _mm256_unpacklo_epi8(lo, hi), x1 = _mm256_unpackhi_epi8(lo, hi);  // elements in order
        r[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(x0, x1, 0x20)),
                                  _mm256_permute2x128_si256(x0, x1, 0x31), 1);
      }
      Transpose16x16(r);
#pragma GCC unroll 16
      for (int t = 0; t < 16 && e0 + 4 * t < elems; ++t) {
        const int64_t e = e0 + 4 * t, blk = e >> s.bs_log2, step = (e & (s.bs - 1)) / 4;
        _mm512_storeu_si512(b + ((blk * steps + step) * kCols + 16 * half) * 4, r[t]);
      }
    }
  }
  return {b, sw, zp};
}

// kRows rows (pointers repeat the last real row) x kCols columns -> out[r][c].
#define NPU_INT8_PANEL_TILE(NAME, TARGET, DPBUSD)                                                                  \
  __attribute__((target(TARGET))) void NAME(const Panel& p, const Shape& s, const int8_t* const q[kRows],         \
                                            const float* const sa[kRows], const int32_t* const asum[kRows],      \
                                            float out[kRows][kCols]) {                                          \
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
    _Pragma("GCC unroll 4") for (int r = 0; r < kRows; ++r) {                                                   \
      _mm512_storeu_ps(out[r], f[r][0]);                                                                        \
      _mm512_storeu_ps(out[r] + 16, f[r][1]);                                                                   \
    }                                                                                                           \
  }

__attribute__((target(NPU_AVX512))) inline __m512i DpbusdBw(__m512i acc, __m512i u, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
__attribute__((target(NPU_AVX512 ",avx512vnni"))) inline __m512i DpbusdVnni(__m512i acc, __m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(acc, u, s);
}

NPU_INT8_PANEL_TILE(TileBw, NPU_AVX512, DpbusdBw)
NPU_INT8_PANEL_TILE(TileVnni, NPU_AVX512 ",avx512vnni", DpbusdVnni)

}  // namespace

void Int8PanelAvx512(const NBitsGemm& g, const Shape& s, const Int8A& a, bool vnni, int64_t r0, int64_t r1,
                     int64_t n0, int64_t n1) {
  const auto tile = vnni ? TileVnni : TileBw;
  for (int64_t c0 = n0; c0 < n1; c0 += kCols) {
    const int64_t c1 = std::min(n1, c0 + kCols);
    const Panel p = Relayout(g, s, c0, c1);
    for (int64_t m0 = r0; m0 < r1; m0 += kRows) {
      const int8_t* q[kRows];
      const float* sa[kRows];
      const int32_t* asum[kRows];
      for (int r = 0; r < kRows; ++r) {
        const int64_t m = std::min(m0 + r, r1 - 1);
        q[r] = a.q + m * s.kc;
        sa[r] = a.scale + m * s.kb;
        asum[r] = a.block + m * s.kb;
      }
      alignas(64) float out[kRows][kCols];
      tile(p, s, q, sa, asum, out);
      for (int r = 0; r < kRows && m0 + r < r1; ++r)
        for (int64_t n = c0; n < c1; ++n) g.y[(m0 + r) * s.N + n] = out[r][n - c0] + (g.bias ? g.bias[n] : 0.0f);
    }
  }
}

}  // namespace npu_ep::kern::nbits

#endif  // NPU_EP_X86
