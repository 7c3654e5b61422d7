#include "norm_matmul.h"

#include <algorithm>
#include <cmath>

#include "cpu.h"
#include "intrinsics.h"
#include "thread_pool.h"

namespace npu_ep::kern {

// These loops must round each operation as the reference does: no multiply-add contraction (aarch64 and FMA
// targets would otherwise fuse s * s into the running sum).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

float SequentialDot(const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
  return acc;
}

void SkipRow(const RmsPrologue& p, int64_t m) {
  const int64_t K = p.K;
  const float* x = p.x + m * K;
  const float* skip = p.skip + m * K;
  float* s = p.sum != nullptr ? p.sum + m * K : p.a + m * K;  // the sum lives in the output it ends up in
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    float v = x[k] + skip[k];
    if (p.norm_bias != nullptr) v += p.norm_bias[k];
    s[k] = v;
    const float sq = v * v;
    acc += sq;
  }
  const float rms = std::sqrt(acc / static_cast<float>(K) + static_cast<float>(p.eps));
  float* a = p.a + m * K;
  for (int64_t k = 0; k < K; ++k) {
    const float v = s[k] / rms;
    a[k] = p.gamma != nullptr ? v * p.gamma[k] : v;
  }
}

void SimplifiedRow(const RmsPrologue& p, int64_t m) {
  const int64_t K = p.K;
  const float* x = p.x + m * K;
  const float dot = p.sdot != nullptr ? p.sdot(K, x, 1, x, 1) : SequentialDot(x, K);
  const double v = static_cast<double>(dot) / static_cast<double>(K) + p.eps;
  const float inv = static_cast<float>(1.0 / std::sqrt(v));
  float* a = p.a + m * K;
  for (int64_t k = 0; k < K; ++k)  // (x * gamma) * inv, the unfused kernel's order (kernels/ops/norm.py)
    a[k] = p.gamma != nullptr ? x[k] * p.gamma[k] * inv : x[k] * inv;
}

// Rows in tasks of kRowsPerTask on up to `threads` threads (a row's bits never depend on which thread runs it),
// when the rows weigh at least kMinParallelWork multiply-adds: `cost` per element, an exp or a division being
// worth about that many. A 512-token prefill ran these on the caller alone while ORT's worker waited.
template <typename Fn>
void ForRows(int threads, int64_t M, int64_t width, int64_t cost, const Fn& row) {
  constexpr int64_t kRowsPerTask = 16;
  ParallelFor(ThreadsFor(threads, M * width * cost), (M + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    for (int64_t m = t * kRowsPerTask; m < std::min(M, (t + 1) * kRowsPerTask); ++m) row(m);
  });
}

}  // namespace

void RunRmsPrologue(const RmsPrologue& p, int threads) {
  ForRows(threads, p.M, p.K, 8, [&](int64_t m) {
    if (p.skip != nullptr)
      SkipRow(p, m);
    else
      SimplifiedRow(p, m);
  });
}

#if NPU_EP_X86
// One row of SwiGlu below with the exp in 16 lanes (Cephes' expf, intrinsics.h); then the same float32 operations
// in the same order. The scalar std::exp cost a 32-token prefill's gate/up groups a third of their time.
__attribute__((target("avx2,fma,avx512f"))) void SwiGluRowAvx512(const float* g, const float* u, int64_t half,
                                                                 float* o) {
  const __m512 cap = _mm512_set1_ps(80.0f), one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < half; j += 16) {
    const __mmask16 m = half - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (half - j)) - 1u);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + j);
    const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), gv);
    const __m512 e = _mm512_add_ps(ExpAvx512(_mm512_min_ps(neg, cap)), one);  // NaN stays (second operand)
    _mm512_mask_storeu_ps(o + j, m, _mm512_mul_ps(_mm512_div_ps(gv, e), _mm512_maskz_loadu_ps(m, u + j)));
  }
}
#endif

void SwiGlu(const float* y, int64_t M, int64_t half, float* out, int threads) {
#if NPU_EP_X86
  const bool lanes = ActiveIsa() >= Isa::kAvx512;
#endif
  ForRows(threads, M, half, 16, [&](int64_t m) {
    const float* g = y + m * 2 * half;
    const float* u = g + half;
    float* o = out + m * half;
#if NPU_EP_X86
    if (lanes) return SwiGluRowAvx512(g, u, half, o);
#endif
    for (int64_t j = 0; j < half; ++j) {
      const float e = std::exp(std::min(-g[j], 80.0f)) + 1.0f;
      o[j] = g[j] / e * u[j];
    }
  });
}

#if defined(__clang__)
#pragma clang fp contract(on)
#else
#pragma GCC pop_options
#endif

}  // namespace npu_ep::kern
