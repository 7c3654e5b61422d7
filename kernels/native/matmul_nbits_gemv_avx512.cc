// MatMulNBits on AVX-512: the fp32 decode (M = 1) and level 4's quantization of A.
//
// accuracy_level 0..3, one pass over the packed weights, nothing staged in memory: the 16 possible weights of a
// block ((q - zp) * scale, rounded once) form a 16-entry table; a permute by the nibbles dequantizes 16 elements at
// once, and an FMA multiplies them with A in place.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "intrinsics.h"
#include "matmul_nbits_internal.h"

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
        const __m512 zq =
            zp_row == nullptr
                ? iota8
                : _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>((zp_row[blk >> 1] >> ((blk & 1) * 4)) & 0x0F)));
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

// MLAS's AVX-512 QuantizeARow_CompInt8 step for step (MlasBlockMax's lanes and reduction, MlasCode's conversion):
// the same codes and scales as the scalar QuantizeRow, NaN and Inf included.
__attribute__((target(NPU_AVX512))) void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale,
                                                           int32_t* block) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < s.kb; ++b) {
    const int64_t k0 = b * s.bs, step = std::min<int64_t>(s.K, k0 + s.bs) - k0;
    __m512 vmax = _mm512_setzero_ps();
    for (int64_t k = 0; k < step; k += 16) {
      const __mmask16 m = static_cast<__mmask16>(0xFFFF >> (16 - std::min<int64_t>(16, step - k)));
      vmax = _mm512_max_ps(vmax, _mm512_andnot_ps(sign, _mm512_maskz_loadu_ps(m, a + k0 + k)));
    }
    const __m256 max8 = _mm256_max_ps(_mm512_extractf32x8_ps(vmax, 1), _mm512_extractf32x8_ps(vmax, 0));
    __m128 max4 = _mm_max_ps(_mm256_extractf128_ps(max8, 1), _mm256_castps256_ps128(max8));
    max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
    const float amax = _mm_cvtss_f32(max4);
    scale[b] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = 0; k < s.bs; k += 16) {
      __m128i c = _mm_setzero_si128();
      if (k < step) {
        const __mmask16 m = static_cast<__mmask16>(0xFFFF >> (16 - std::min<int64_t>(16, step - k)));
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + k0 + k), inv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c = _mm_maskz_mov_epi8(m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));  // NaN, out of range: INT_MIN
        sum = _mm512_add_epi32(sum, _mm512_cvtepi8_epi32(c));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0 + k), c);
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
