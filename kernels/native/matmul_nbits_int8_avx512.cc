// accuracy_level 4's int4 kernel on AVX-512, for every M: decode and prefill read the tiles the compiler stored
// (matmul_nbits.h), with the columns in the lanes, and nothing is re-laid out per call.
//
// A pass takes one group of 32 columns (two with fewer than 4 rows) and 1, 2 or 4 rows of A. Per 4 elements of
// K and group: one 64-byte load, two nibble masks (columns 0-15 and 16-31), A's 4 codes broadcast per row, one
// DPBUSD per 16 outputs. Per block: one zero-point term, one convert, one scale and one FMA per 16 outputs. Each output
// is so summed exactly in int32 per block and accumulated over the blocks in order (y = fma(float(dot_b - zp_b *
// sum_b(a)), sw_b * sa_b, y)): the scalar and AVX2 paths' bits (matmul_nbits.cc), whatever the rows per pass.
#include <algorithm>
#include <cstring>

#include "intrinsics.h"
#include "matmul_nbits_internal.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

// A decode streams the tiles from DRAM; one sequential stream per pass leaves the core short of reads in flight, so
// passes with fewer than 4 rows take two neighbouring groups (two streams) at once.
constexpr int kMaxGroups = 2;

// R rows x G tile groups whose columns follow each other (t[g]); the rows' outputs in the lanes of store[g] (bits of
// group g's 32 lanes) go to y[r] + 32 g (y[r] points at t[0]'s first column), plus the bias or plus 0.0 (-0.0
// stays +0.0 either way).
#define NPU_INT8_TILE(NAME, TARGET, DPBUSD)                                                                          \
  template <int R, int G>                                                                                            \
  __attribute__((target(TARGET))) void NAME(const TileGroup* t, const Shape& s, const int8_t* const q[],             \
                                            const float* const sa[], const int32_t* const asum[], const float* bias, \
                                            const uint32_t* store, float* const y[]) {                               \
    const __m512i m0f = _mm512_set1_epi8(0x0F);                                                                      \
    __mmask16 real[G][2];                                                                                            \
    const uint8_t* pb[G];                                                                                            \
    _Pragma("GCC unroll 2") for (int g = 0; g < G; ++g) {                                                            \
      const uint32_t lanes = t[g].lanes == kTileCols ? ~0u : (1u << t[g].lanes) - 1;                                 \
      real[g][0] = static_cast<__mmask16>(lanes), real[g][1] = static_cast<__mmask16>(lanes >> 16);                  \
      pb[g] = t[g].b;                                                                                                \
    }                                                                                                                \
    const int64_t steps = s.bs / 4;                                                                                  \
    __m512 f[R][2 * G];                                                                                              \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 4") for (int v = 0; v < 2 * G; ++v)      \
        f[r][v] = _mm512_setzero_ps();                                                                               \
    for (int64_t blk = 0; blk < s.kb; ++blk) {                                                                       \
      __m512i d[R][2 * G];                                                                                           \
      _Pragma("GCC unroll 2") for (int g = 0; g < G; ++g) {                                                          \
        if (t[0].zp == nullptr) {                                                                                    \
          _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) d[r][2 * g] = d[r][2 * g + 1] =                        \
              _mm512_slli_epi32(_mm512_set1_epi32(-asum[r][blk]), 3); /* zero point 8 */                             \
          continue;                                                                                                  \
        }                                                                                                            \
        const __m256i raw =                                                                                          \
            _mm256_maskz_loadu_epi8(real[g][0] | (uint32_t{real[g][1]} << 16), t[g].zp + (blk >> 1) * t[g].stride);  \
        const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(blk & 1) * 4);                                      \
        const __m512i z0 = _mm512_and_si512(                                                                         \
            _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(raw)), shift), _mm512_set1_epi32(15));      \
        const __m512i z1 = _mm512_and_si512(                                                                         \
            _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(raw, 1)), shift), _mm512_set1_epi32(15)); \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                        \
          const __m512i nsum = _mm512_set1_epi32(-asum[r][blk]);                                                     \
          d[r][2 * g] = _mm512_mullo_epi32(z0, nsum);                                                                \
          d[r][2 * g + 1] = _mm512_mullo_epi32(z1, nsum);                                                            \
        }                                                                                                            \
      }                                                                                                              \
      const int64_t e = blk * s.bs;                                                                                  \
      for (int64_t i = 0; i < steps; ++i) {                                                                          \
        __m512i b[2 * G];                                                                                            \
        _Pragma("GCC unroll 2") for (int g = 0; g < G; ++g) {                                                        \
          const __m512i raw = _mm512_loadu_si512(pb[g]);                                                             \
          pb[g] += 64;                                                                                               \
          b[2 * g] = _mm512_and_si512(raw, m0f);                                                                     \
          b[2 * g + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f);                                           \
        }                                                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                        \
          int32_t codes;                                                                                             \
          std::memcpy(&codes, q[r] + e + 4 * i, 4);                                                                  \
          const __m512i a = _mm512_set1_epi32(codes);                                                                \
          _Pragma("GCC unroll 4") for (int v = 0; v < 2 * G; ++v) d[r][v] = DPBUSD(d[r][v], b[v], a);                \
        }                                                                                                            \
      }                                                                                                              \
      _Pragma("GCC unroll 2") for (int g = 0; g < G; ++g) {                                                          \
        const float* sw = t[g].sw + blk * t[g].stride;                                                               \
        const __m512 s0 = _mm512_maskz_loadu_ps(real[g][0], sw), s1 = _mm512_maskz_loadu_ps(real[g][1], sw + 16);    \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                        \
          const __m512 sr = _mm512_set1_ps(sa[r][blk]);                                                              \
          f[r][2 * g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][2 * g]), _mm512_mul_ps(s0, sr), f[r][2 * g]);        \
          f[r][2 * g + 1] =                                                                                          \
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][2 * g + 1]), _mm512_mul_ps(s1, sr), f[r][2 * g + 1]);          \
        }                                                                                                            \
      }                                                                                                              \
    }                                                                                                                \
    _Pragma("GCC unroll 2") for (int g = 0; g < G; ++g) {                                                            \
      const __mmask16 m0 = static_cast<__mmask16>(store[g]), m1 = static_cast<__mmask16>(store[g] >> 16);            \
      const float* bg = bias ? bias + kTileCols * g : nullptr;                                                       \
      const __m512 c0 = bg ? _mm512_maskz_loadu_ps(m0, bg) : _mm512_setzero_ps();                                    \
      const __m512 c1 = bg ? _mm512_maskz_loadu_ps(m1, bg + 16) : _mm512_setzero_ps();                               \
      _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                          \
        _mm512_mask_storeu_ps(y[r] + kTileCols * g, m0, _mm512_add_ps(f[r][2 * g], c0));                             \
        _mm512_mask_storeu_ps(y[r] + kTileCols * g + 16, m1, _mm512_add_ps(f[r][2 * g + 1], c1));                    \
      }                                                                                                              \
    }                                                                                                                \
  }

NPU_INT8_TILE(TileBw, NPU_AVX512, DpbusdBw)
NPU_INT8_TILE(TileVnni, NPU_AVX512 ",avx512vnni", DpbusdTied)

template <int R, int G>
void RunTile(bool vnni, const TileGroup* t, const Shape& s, const Int8A& a, const NBitsGemm& g, int64_t m0,
             const uint32_t* store) {
  const int8_t* q[R];
  const float* sa[R];
  const int32_t* asum[R];
  float* y[R];
  for (int r = 0; r < R; ++r) {
    q[r] = a.q + (m0 + r) * s.kc;
    sa[r] = a.scale + (m0 + r) * s.kb;
    asum[r] = a.block + (m0 + r) * s.kb;
    y[r] = g.y + (m0 + r) * s.N + t[0].first;
  }
  const float* bias = g.bias ? g.bias + t[0].first : nullptr;
  (vnni ? TileVnni<R, G> : TileBw<R, G>)(t, s, q, sa, asum, bias, store, y);
}

}  // namespace

void Int8TilesAvx512(const NBitsGemm& g, const Shape& s, const Int8A& a, bool vnni, int64_t r0, int64_t r1, int64_t n0,
                     int64_t n1) {
  for (int64_t n = n0; n < n1;) {
    TileGroup t[kMaxGroups];
    uint32_t store[kMaxGroups];
    int groups = 0;
    for (int64_t c = n; groups < (r1 - r0 < 4 ? kMaxGroups : 1) && c < n1; ++groups) {
      t[groups] = TileGroupOf(g, s, c);
      if (groups > 0 && t[groups].first != t[0].first + kTileCols) break;  // y and the bias are read as one run
      const int64_t l0 = c - t[groups].first, l1 = std::min<int64_t>(t[groups].lanes, n1 - t[groups].first);
      store[groups] = (l1 == kTileCols ? ~0u : (1u << l1) - 1) & ~((1u << l0) - 1);
      c = t[groups].first + l1;
      n = c;
    }
    for (int64_t m = r0; m < r1;) {
      if (r1 - m >= 4) {
        RunTile<4, 1>(vnni, t, s, a, g, m, store);
        m += 4;
      } else if (r1 - m >= 2) {
        (groups == 2 ? RunTile<2, 2> : RunTile<2, 1>)(vnni, t, s, a, g, m, store);
        m += 2;
      } else {
        (groups == 2 ? RunTile<1, 2> : RunTile<1, 1>)(vnni, t, s, a, g, m, store);
        m += 1;
      }
    }
  }
}

}  // namespace npu_ep::kern::nbits

#endif  // NPU_EP_X86
