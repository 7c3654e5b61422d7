// A copy of one run of bytes for the kernels that cut rows (pad, concat, split, slice, tile, QLinearConcat): a run
// of 256 B to 8 KB goes through 32-byte vectors, because glibc's memcpy per run of that size took ~1.4x the time of
// this loop on the rows of a pad or concat; shorter runs are memcpy (its small-size path), and so are longer ones (on
// rows of 12 KB into an output past the cache the loop was no faster).
#pragma once

#include <cstddef>
#include <cstring>

#include "cpu.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace npu_ep::kern {

#if NPU_EP_X86
// n >= 32: whole vectors, then the last 32 bytes once more (src and dst do not overlap).
__attribute__((target("avx2"))) inline void CopyRunAvx2(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  for (; i + 32 <= n; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  if (i < n)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n - 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + n - 32)));
}
#endif

// Made once per kernel call (the ISA check), then called per run.
struct RunCopier {
  bool vectors = false;

  RunCopier() {
#if NPU_EP_X86
    vectors = ActiveIsa() >= Isa::kAvx2;
#endif
  }

  void operator()(char* dst, const char* src, size_t n) const {
#if NPU_EP_X86
    if (vectors && n >= 256 && n <= 8192) {
      CopyRunAvx2(dst, src, n);
      return;
    }
#endif
    std::memcpy(dst, src, n);
  }
};

}  // namespace npu_ep::kern
