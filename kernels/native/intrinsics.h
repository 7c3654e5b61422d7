// The x86 SIMD intrinsics for the kernels' AVX2/AVX-512 paths (cpu.h's NPU_EP_X86), with GCC 12's false warnings
// silenced: it flags the deliberately undefined pass-through operand inside AVX-512 intrinsics as uninitialized;
// and the one intrinsic GCC compiles badly in register tiles, as asm.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace npu_ep::kern {
// acc + vpdpbusd(u8 u, s8 s) on AVX-512 BW hosts without VNNI: maddubs + madd, exact while the u8 x s8 pair sums fit
// in int16 (the int4 kernels' u <= 15).
__attribute__((target("avx512f,avx512bw"))) inline __m512i DpbusdBw(__m512i acc, __m512i u, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
// acc + vpdpbusd(u8 u, s8 s) (4 products per int32 lane), in asm with the accumulator tied to its register: with
// the intrinsic, GCC 12 copied each accumulator of a register tile to a fresh register before every vpdpbusd and
// back after it (the level-4 tile's inner loop ran 16 moves and a spill per 8 vpdpbusd).
__attribute__((target("avx512f,avx512vnni"))) inline __m512i DpbusdTied(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [s] "v"(s));
  return acc;
}
// Transposes the 16 x 16 floats of r[0..15] (row k in r[k]) in registers: r[i] becomes column i.
__attribute__((target("avx512f"))) inline void Transpose16x16Ps(__m512 (&r)[16]) {
  __m512 t[16];
  for (int k = 0; k < 16; k += 2) {
    t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 16; k += 4) {
    r[k] = _mm512_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0x88);
    t[k + 4] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0xDD);
    t[k + 8] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0x88);
    t[k + 12] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0xDD);
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
  }
}
// Cephes expf: 2^n * p(r), n = round(x log2 e), |r| <= ln2 / 2; below -87.3 (2^n would be subnormal) gives 0.
__attribute__((target("avx2,fma"))) inline __m256 ExpAvx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));  // NaN passes through (second operand)
  const __m256 fn = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// Cephes expf with scalef for 2^n (subnormal results and underflow to 0 come out right).
__attribute__((target("avx2,fma,avx512f"))) inline __m512 ExpAvx512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));  // NaN passes through
  const __m512 fn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, fn);
}

// 16 float32 lanes from x (mask m): float32 elements as they are, float16 bits (uint16_t) widened exactly.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512 LoadFloats16(const T* x, __mmask16 m) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x));
  else
    return _mm512_maskz_loadu_ps(m, x);
}
}  // namespace npu_ep::kern
#endif
