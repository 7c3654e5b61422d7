#include "cpu.h"

#include <algorithm>
#include <atomic>

#if NPU_EP_X86
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace npu_ep::kern {
namespace {
std::atomic<int> g_cap{-1};
}

#if NPU_EP_X86
bool AmxInt8Usable() {
#if defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  if (!tile || !int8) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // linux/arch/x86/include/uapi/asm/prctl.h
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

Isa ActiveIsa() {
  static const Isa host = DetectIsa();
  int cap = g_cap.load(std::memory_order_relaxed);
  return cap < 0 ? host : static_cast<Isa>(std::min(cap, static_cast<int>(host)));
}

void SetIsaCap(int cap) { g_cap.store(cap, std::memory_order_relaxed); }

bool HasF16c() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool yes = __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAmxInt8: return "amx_int8";
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace npu_ep::kern
