// Runtime CPU dispatch for the native kernels: the widest instruction set this host runs.
#pragma once

namespace npu_ep::kern {

// kAmxInt8: AVX-512 VNNI plus Intel AMX's int8 tiles, which Linux lets a process use only after it asks
// (arch_prctl ARCH_REQ_XCOMP_PERM); only the int8 GEMM has a path of its own there.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3, kAmxInt8 = 4 };

#if defined(__x86_64__) || defined(_M_X64)
#define NPU_EP_X86 1
// AMX intrinsics: GCC 11 and clang 12 on; an older compiler builds the kernels without the AMX path
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define NPU_EP_AMX 1
#else
#define NPU_EP_AMX 0
#endif
bool AmxInt8Usable();  // the CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile state
inline Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    if (!__builtin_cpu_supports("avx512vnni")) return Isa::kAvx512;
    return NPU_EP_AMX && AmxInt8Usable() ? Isa::kAmxInt8 : Isa::kAvx512Vnni;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}
#else
#define NPU_EP_X86 0
#define NPU_EP_AMX 0
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
// The F16C conversions (float16 <-> float32 in 8 lanes), which AVX2 hosts usually have but do not imply.
bool HasF16c();

}  // namespace npu_ep::kern
