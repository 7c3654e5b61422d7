// The x86 SIMD intrinsics for the kernels' AVX2/AVX-512 paths (cpu.h's NPU_EP_X86), with GCC 12's false warnings
// silenced: it flags the deliberately undefined pass-through operand inside AVX-512 intrinsics as uninitialized;
// and the one intrinsic GCC compiles badly in register tiles, as asm.
#pragma once

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
}  // namespace npu_ep::kern
#endif
