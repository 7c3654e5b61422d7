#include "cpu.h"

#include <algorithm>
#include <atomic>

namespace npu_ep::kern {
namespace {
std::atomic<int> g_cap{-1};
}

Isa ActiveIsa() {
  static const Isa host = DetectIsa();
  int cap = g_cap.load(std::memory_order_relaxed);
  return cap < 0 ? host : static_cast<Isa>(std::min(cap, static_cast<int>(host)));
}

void SetIsaCap(int cap) { g_cap.store(cap, std::memory_order_relaxed); }

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace npu_ep::kern
