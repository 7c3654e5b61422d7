#include "half.h"

#include <cstring>

#include "cpu.h"
#include "intrinsics.h"

namespace npu_ep::kern {

#if NPU_EP_X86
__attribute__((target("avx2,f16c"))) static void HalfToFloatF16c(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(s[i]);
}

__attribute__((target("avx2,f16c"))) static void FloatToHalfF16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#endif

void HalfToFloatRow(const uint16_t* s, float* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return HalfToFloatF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, s + i, sizeof h);
    d[i] = static_cast<float>(h);
  }
}

void FloatToHalfRow(const float* s, uint16_t* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return FloatToHalfF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const _Float16 h = static_cast<_Float16>(s[i]);
    std::memcpy(d + i, &h, sizeof h);
  }
}

}  // namespace npu_ep::kern
