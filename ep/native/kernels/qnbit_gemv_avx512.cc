// MatMulNBits decode (M = 1) on AVX-512: one pass over the packed weights, nothing staged in memory.
//
// accuracy_level 4: four columns per pass share A's codes and lane sums. The zero-point term starts the int32
// accumulator (-zp * lane_sum_a), two DPBUSDs add the low and high nibbles' products; block scales are multiplied
// (sw * sa) once per 16 blocks and spread to the lanes with one permute per chunk. The last partial chunk is a
// masked load, so no tail copy is made.
// accuracy_level 0..3: the 16 possible weights of a block ((q - zp) * scale, rounded once) form a 16-entry table;
// a permute by the nibbles dequantizes 16 elements at once, and an FMA multiplies them with A in place.
#include <algorithm>
#include <cstring>

#include "qnbit_gemm_internal.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

__attribute__((target(NPU_AVX512))) inline __m512i DpbusdBw(__m512i acc, __m512i u, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
__attribute__((target(NPU_AVX512 ",avx512vnni"))) inline __m512i DpbusdVnni(__m512i acc, __m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(acc, u, s);
}

// Zero points of blocks [b0, b0 + 16) as 16 int32 (8 packed bytes, masked at the row's end).
__attribute__((target(NPU_AVX512))) inline __m512i ZeroPoints16(const uint8_t* zp_row, int64_t b0, int64_t kb) {
  const int64_t bytes = std::min<int64_t>(8, (kb - b0 + 1) / 2);
  const __m128i raw = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << bytes) - 1), zp_row + b0 / 2);
  const __m128i m0f = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, m0f), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m0f);
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

// Four columns (pointers repeat the last real column when fewer remain) -> out[4].
#define NPU_GEMV_INT8_COLS4(NAME, TARGET, DPBUSD)                                                                 \
  __attribute__((target(TARGET))) void NAME(const Shape& s, const GemvA& a, const uint8_t* const bp[4],          \
                                            const float* const sw[4], const uint8_t* const zp[4], float out[4]) { \
    const __m512i m0f = _mm512_set1_epi8(0x0F);                                                                  \
    const __m512i lane8 = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);    \
    const int64_t chunks_per_sup = s.bs / 8; /* 16 blocks = 16 * bs elements = bs / 8 chunks */                  \
    const int64_t rem = s.row_bytes % kChunkBytes;                                                               \
    const __mmask64 tail = rem ? (~0ull >> (64 - rem)) : ~0ull;                                                  \
    const bool symmetric = zp[0] == nullptr;                                                                     \
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};        \
    for (int64_t b0 = 0; b0 < s.kb; b0 += 16) {                                                                  \
      const __mmask16 bmask = static_cast<__mmask16>((1u << std::min<int64_t>(16, s.kb - b0)) - 1);              \
      const __m512 sab = _mm512_maskz_loadu_ps(bmask, a.scale + b0);                                             \
      __m512 sv[4];                                                                                              \
      __m512i zv[4];                                                                                             \
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) {                                                      \
        sv[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(bmask, sw[j] + b0), sab);                                    \
        zv[j] = symmetric ? _mm512_setzero_si512() : ZeroPoints16(zp[j], b0, s.kb);                              \
      }                                                                                                          \
      const int64_t c_begin = (b0 / 16) * chunks_per_sup;                                                        \
      const int64_t c_end = std::min(s.n_chunks, c_begin + chunks_per_sup);                                      \
      for (int64_t c = c_begin; c < c_end; ++c) {                                                                \
        const __m512i idx = _mm512_srli_epi32(                                                                   \
            _mm512_add_epi32(lane8, _mm512_set1_epi32(static_cast<int>((c - c_begin) * kChunkElems))), s.bs_log2); \
        const __mmask64 bytes = c == s.n_chunks - 1 ? tail : ~0ull;                                              \
        const int8_t* qc = a.q + c * kChunkElems;                                                                \
        const __m512i qlo = _mm512_loadu_si512(qc), qhi = _mm512_loadu_si512(qc + kChunkBytes);                  \
        const __m512i nql = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(a.lane + c * 16));       \
        const __m512i nql8 = _mm512_slli_epi32(nql, 3);                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) {                                                    \
          const __m512i bv = _mm512_maskz_loadu_epi8(bytes, bp[j] + c * kChunkBytes);                            \
          const __m512i lo = _mm512_and_si512(bv, m0f);                                                          \
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bv, 4), m0f);                                   \
          const __m512i d0 = symmetric ? nql8 : _mm512_mullo_epi32(_mm512_permutexvar_epi32(idx, zv[j]), nql);   \
          const __m512i d = DPBUSD(DPBUSD(d0, lo, qlo), hi, qhi);                                                \
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(idx, sv[j]), acc[j]);            \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);                   \
  }

NPU_GEMV_INT8_COLS4(GemvInt8Cols4, NPU_AVX512, DpbusdBw)
NPU_GEMV_INT8_COLS4(GemvInt8Cols4Vnni, NPU_AVX512 ",avx512vnni", DpbusdVnni)

// One column, level 0..3, bs >= 32 (a 16-byte group lies in one block). Accumulator k takes the groups at byte
// offset 16k of every chunk, low nibbles then high ones: the order of the dequantize-then-dot path.
__attribute__((target(NPU_AVX512))) float GemvFp32Col(const Shape& s, const float* a, const uint8_t* brow,
                                                       const float* sw, const uint8_t* zp_row) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t c = 0; c < s.n_chunks; ++c) {
    const float* ac = a + c * kChunkElems;
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) {
      const int64_t g = c * kChunkBytes + 16 * k;
      __m512 wlo = _mm512_setzero_ps(), whi = wlo;
      if (g < s.row_bytes) {
        const int64_t blk = (2 * g) >> s.bs_log2;
        const __m512 zq = zp_row == nullptr
                              ? iota8
                              : _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(
                                                        (zp_row[blk >> 1] >> ((blk & 1) * 4)) & 0x0F)));
        const __m512 table = _mm512_mul_ps(zq, _mm512_set1_ps(sw[blk]));
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(brow + g)));
        wlo = _mm512_permutexvar_ps(x, table);  // only the index's low 4 bits count: the low nibble
        whi = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table);
      }
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(ac + 16 * k), wlo, acc[k]);
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(ac + kChunkBytes + 16 * k), whi, acc[k]);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

inline float Bias(const NBitsGemm& g, int64_t n) { return g.bias == nullptr ? 0.0f : g.bias[n]; }

}  // namespace

void GemvInt8Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, bool vnni, int64_t n0, int64_t n1) {
  for (int64_t c0 = n0; c0 < n1; c0 += 4) {
    const uint8_t* bp[4];
    const float* sw[4];
    const uint8_t* zp[4];
    for (int j = 0; j < 4; ++j) {
      const int64_t n = std::min(c0 + j, n1 - 1);
      bp[j] = g.b + n * s.row_bytes;
      sw[j] = g.scales + n * s.kb;
      zp[j] = g.zero_points == nullptr ? nullptr : g.zero_points + n * s.zp_bytes;
    }
    float out[4];
    (vnni ? GemvInt8Cols4Vnni : GemvInt8Cols4)(s, a, bp, sw, zp, out);
    for (int j = 0; j < 4 && c0 + j < n1; ++j) g.y[c0 + j] = out[j] + Bias(g, c0 + j);
  }
}

void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    g.y[n] = GemvFp32Col(s, a.a, g.b + n * s.row_bytes, g.scales + n * s.kb,
                         g.zero_points == nullptr ? nullptr : g.zero_points + n * s.zp_bytes) + Bias(g, n);
}

}  // namespace npu_ep::kern::nbits
#endif  // NPU_EP_X86
