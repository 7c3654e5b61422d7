// MatMulNBits decode (M = 1) on AVX-512: one pass over the packed weights, nothing staged in memory.
//
// accuracy_level 4: eight columns per pass share A's codes and lane sums. The zero-point term starts the int32
// accumulator (-zp * lane_sum_a), two DPBUSDs add the low and high nibbles' products; block scales are multiplied
// (sw * sa) once per 16 blocks and spread to the lanes with one permute per chunk. The last partial chunk is a
// masked load, so no tail copy is made.
// accuracy_level 0..3: the 16 possible weights of a block ((q - zp) * scale, rounded once) form a 16-entry table;
// a permute by the nibbles dequantizes 16 elements at once, and an FMA multiplies them with A in place.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

constexpr int kCols = 8;  // columns per pass: A's codes, lane sums and scales are loaded once for all of them

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

// kCols columns per pass (pointers repeat the last real column when fewer remain) -> out[kCols]; the weights of the
// columns `ahead` further are prefetched into L2. HI_NIBBLES(bv) gives each byte's high nibble: one GF(2) affine op
// (a bit shift inside bytes) on GFNI hosts, shift+mask else.
#define NPU_GEMV_INT8_COLS(NAME, TARGET, DPBUSD, HI_NIBBLES)                                                          \
  __attribute__((target(TARGET))) void NAME(const Shape& s, const GemvA& a, const uint8_t* const bp[kCols],           \
                                            const float* const sw[kCols], const uint8_t* const zp[kCols],             \
                                            int64_t ahead, float out[kCols]) {                                        \
    const __m512i m0f = _mm512_set1_epi8(0x0F);                                                                       \
    const __m512i lane8 = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);         \
    const int64_t chunks_per_sup = s.bs / 8; /* 16 blocks = 16 * bs elements = bs / 8 chunks */                       \
    const int64_t rem = s.row_bytes % kChunkBytes;                                                                    \
    const __mmask64 tail = rem ? (~0ull >> (64 - rem)) : ~0ull;                                                       \
    const bool symmetric = zp[0] == nullptr;                                                                          \
    __m512 acc[kCols];                                                                                                \
    _Pragma("GCC unroll 8") for (int j = 0; j < kCols; ++j) acc[j] = _mm512_setzero_ps();                             \
    for (int64_t b0 = 0; b0 < s.kb; b0 += 16) {                                                                       \
      const __mmask16 bmask = static_cast<__mmask16>((1u << std::min<int64_t>(16, s.kb - b0)) - 1);                   \
      const __m512 sab = _mm512_maskz_loadu_ps(bmask, a.scale + b0);                                                  \
      __m512 sv[kCols];                                                                                               \
      __m512i zv[kCols];                                                                                              \
      _Pragma("GCC unroll 8") for (int j = 0; j < kCols; ++j) {                                                       \
        _mm_prefetch(reinterpret_cast<const char*>(sw[j] + ahead * s.kb + b0), _MM_HINT_T1);                          \
        sv[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(bmask, sw[j] + b0), sab);                                         \
        zv[j] = symmetric ? _mm512_setzero_si512() : ZeroPoints16(zp[j], b0, s.kb);                                   \
        if (!symmetric) _mm_prefetch(reinterpret_cast<const char*>(zp[j] + ahead * s.zp_bytes + b0 / 2), _MM_HINT_T1); \
      }                                                                                                               \
      const int64_t c_begin = (b0 / 16) * chunks_per_sup;                                                             \
      const int64_t c_end = std::min(s.n_chunks, c_begin + chunks_per_sup);                                           \
      for (int64_t c = c_begin; c < c_end; ++c) {                                                                     \
        const __m512i idx = _mm512_srli_epi32(                                                                        \
            _mm512_add_epi32(lane8, _mm512_set1_epi32(static_cast<int>((c - c_begin) * kChunkElems))), s.bs_log2);    \
        const __mmask64 bytes = c == s.n_chunks - 1 ? tail : ~0ull;                                                   \
        const int8_t* qc = a.q + c * kChunkElems;                                                                     \
        const __m512i qlo = _mm512_loadu_si512(qc), qhi = _mm512_loadu_si512(qc + kChunkBytes);                       \
        const __m512i nql = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(a.lane + c * 16));            \
        const __m512i nql8 = _mm512_slli_epi32(nql, 3);                                                               \
        _Pragma("GCC unroll 8") for (int j = 0; j < kCols; ++j) {                                                     \
          _mm_prefetch(reinterpret_cast<const char*>(bp[j] + ahead * s.row_bytes + c * kChunkBytes), _MM_HINT_T1);    \
          const __m512i bv = _mm512_maskz_loadu_epi8(bytes, bp[j] + c * kChunkBytes);                                 \
          const __m512i lo = _mm512_and_si512(bv, m0f);                                                               \
          const __m512i hi = HI_NIBBLES(bv);                                                                          \
          const __m512i d0 = symmetric ? nql8 : _mm512_mullo_epi32(_mm512_permutexvar_epi32(idx, zv[j]), nql);        \
          const __m512i d = DPBUSD(DPBUSD(d0, lo, qlo), hi, qhi);                                                     \
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(idx, sv[j]), acc[j]);                 \
        }                                                                                                             \
      }                                                                                                               \
    }                                                                                                                 \
    _Pragma("GCC unroll 8") for (int j = 0; j < kCols; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);                    \
  }

#define NPU_HI_SHIFT(bv) _mm512_and_si512(_mm512_srli_epi16(bv, 4), m0f)
#define NPU_HI_GFNI(bv) _mm512_gf2p8affine_epi64_epi8(bv, _mm512_set1_epi64(0x1020408000000000ll), 0)
NPU_GEMV_INT8_COLS(GemvInt8Cols, NPU_AVX512, DpbusdBw, NPU_HI_SHIFT)
NPU_GEMV_INT8_COLS(GemvInt8ColsVnni, NPU_AVX512 ",avx512vnni", DpbusdVnni, NPU_HI_SHIFT)
NPU_GEMV_INT8_COLS(GemvInt8ColsVnniGfni, NPU_AVX512 ",avx512vnni,gfni", DpbusdVnni, NPU_HI_GFNI)

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

// One row's codes are first written in natural order (q doubles as the buffer), then each 128-element chunk is
// split in place into its 64 even and 64 odd elements: an in-lane byte shuffle puts each 16-byte lane's evens
// before its odds, a two-source qword permute gathers them. Lane sums (8 consecutive codes) come from SAD on the
// codes biased to unsigned.
__attribute__((target(NPU_AVX512))) void QuantizeRowImpl(const float* a, const Shape& s, int8_t* q, float* scale,
                                                         int32_t* lane) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < s.kb; ++b) {
    const int64_t k0 = b * s.bs, k1 = std::min<int64_t>(s.K, k0 + s.bs);
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t k = k0; k < k0 + s.bs; k += 16) {
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, k1 - k));
      const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), a + k);
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      vmax = _mm512_max_ps(vmax, _mm512_and_ps(x, absmask));
    }
    const float amax = nan ? std::nanf("") : _mm512_reduce_max_ps(vmax);  // a NaN makes the scale NaN
    scale[b] = amax / 127.0f;
    const float inv = std::isfinite(amax) && amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t k = k0; k < k0 + s.bs; k += 16) {
      __m128i c = _mm_setzero_si128();
      if (inv != 0.0f) {
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, k1 - k));
        const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), a + k);
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        c = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), c);
    }
  }
  std::memset(q + s.kb * s.bs, 0, s.kc - s.kb * s.bs);
  const __m512i split = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m512i evens = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odds = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80)), off = _mm512_set1_epi32(8 * 128);
  for (int64_t c = 0; c < s.n_chunks; ++c) {
    int8_t* qc = q + c * kChunkElems;
    const __m512i v0 = _mm512_loadu_si512(qc), v1 = _mm512_loadu_si512(qc + 64);
    const __m512i s0 = _mm512_sad_epu8(_mm512_xor_si512(v0, bias), _mm512_setzero_si512());
    const __m512i s1 = _mm512_sad_epu8(_mm512_xor_si512(v1, bias), _mm512_setzero_si512());
    const __m512i sums = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(s0)),
                                            _mm512_cvtepi64_epi32(s1), 1);
    _mm512_storeu_si512(lane + c * 16, _mm512_sub_epi32(sums, off));
    const __m512i w0 = _mm512_shuffle_epi8(v0, split), w1 = _mm512_shuffle_epi8(v1, split);
    _mm512_storeu_si512(qc, _mm512_permutex2var_epi64(w0, evens, w1));
    _mm512_storeu_si512(qc + 64, _mm512_permutex2var_epi64(w0, odds, w1));
  }
}

inline float Bias(const NBitsGemm& g, int64_t n) { return g.bias == nullptr ? 0.0f : g.bias[n]; }

}  // namespace

void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* lane) {
  QuantizeRowImpl(a, s, q, scale, lane);
}

void GemvInt8Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, bool vnni, int64_t n0, int64_t n1) {
  static const bool gfni = __builtin_cpu_supports("gfni");
  const auto cols = !vnni ? GemvInt8Cols : gfni ? GemvInt8ColsVnniGfni : GemvInt8ColsVnni;
  for (int64_t c0 = n0; c0 < n1; c0 += kCols) {
    const uint8_t* bp[kCols];
    const float* sw[kCols];
    const uint8_t* zp[kCols];
    for (int j = 0; j < kCols; ++j) {
      const int64_t n = std::min(c0 + j, n1 - 1);
      const Column col = ColumnOf(g, s, n);
      bp[j] = col.b;
      sw[j] = col.sw;
      zp[j] = col.zp;
    }
    // Consecutive columns are consecutive rows of B, but a pass reads kCols of them chunk by chunk, which the
    // hardware prefetchers do not follow: the rows two passes ahead are prefetched into L2 (from DRAM, a decoder's
    // weights stream several times faster so; cached weights lose nothing). Prefetches never fault, but stop at N.
    const int64_t ahead = c0 + 3 * kCols <= s.N ? 2 * kCols : 0;
    float out[kCols];
    cols(s, a, bp, sw, zp, ahead, out);
    for (int j = 0; j < kCols && c0 + j < n1; ++j) g.y[c0 + j] = out[j] + Bias(g, c0 + j);
  }
}

void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const Column col = ColumnOf(g, s, n);
    g.y[n] = GemvFp32Col(s, a.a, col.b, col.sw, col.zp) + Bias(g, n);
  }
}

}  // namespace npu_ep::kern::nbits
#endif  // NPU_EP_X86
