// Runtime CPU dispatch for the native kernels: the widest instruction set this host runs.
#pragma once

namespace npu_ep::kern {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

#if defined(__x86_64__) || defined(_M_X64)
#define NPU_EP_X86 1
inline Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return __builtin_cpu_supports("avx512vnni") ? Isa::kAvx512Vnni : Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}
#else
#define NPU_EP_X86 0
inline Isa DetectIsa() { return Isa::kScalar; }
#endif

// Round to nearest, ties to even, for |x| < 2^22 (the default rounding mode; no libm call, unlike std::nearbyint
// on baseline x86-64): adding 1.5 * 2^23 leaves a float whose spacing is 1.
inline float RoundHalfEven(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

// The host's ISA, optionally capped (tests run every path that this host supports).
Isa ActiveIsa();
void SetIsaCap(int cap);  // -1: no cap
const char* IsaName(Isa isa);

}  // namespace npu_ep::kern
