// MatMulNBits on AVX-512: the fp32 decode (M = 1) and level 4's quantization of A.
//
// accuracy_level 0..3, one pass over the packed weights, nothing staged in memory: the 16 possible weights of a
// block ((q - zp) * scale, rounded once) form a 16-entry table; a permute by the nibbles dequantizes 16 elements at
// once, and an FMA multiplies them with A in place.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

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

__attribute__((target(NPU_AVX512))) void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale,
                                                           int32_t* block) {
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
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + s.bs; k += 16) {
      __m128i c = _mm_setzero_si128();
      if (inv != 0.0f) {
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, k1 - k));
        const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), a + k);
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        const __m512i codes = _mm512_cvttps_epi32(r);
        sum = _mm512_add_epi32(sum, codes);
        c = _mm512_cvtepi32_epi8(codes);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), c);
    }
    block[b] = _mm512_reduce_add_epi32(sum);
  }
  std::memset(q + s.kb * s.bs, 0, s.kc - s.kb * s.bs);
}

void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const float* a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const Column col = ColumnOf(g, s, n);
    g.y[n] = GemvFp32Col(s, a, col.b, col.sw, col.zp) + Bias(g, n);
  }
}

}  // namespace npu_ep::kern::nbits
#endif  // NPU_EP_X86
