#include "norm_matmul.h"

#include <algorithm>
#include <cmath>

namespace npu_ep::kern {

// These loops must round each operation as the reference does: no multiply-add contraction (aarch64 and FMA
// targets would otherwise fuse s * s into the running sum).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

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
  for (int64_t k = 0; k < K; ++k) {
    const float y = x[k] * inv;
    a[k] = p.gamma != nullptr ? y * p.gamma[k] : y;
  }
}

}  // namespace

void RunRmsPrologue(const RmsPrologue& p) {
  for (int64_t m = 0; m < p.M; ++m) {
    if (p.skip != nullptr)
      SkipRow(p, m);
    else
      SimplifiedRow(p, m);
  }
}

void SwiGlu(const float* y, int64_t M, int64_t half, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* g = y + m * 2 * half;
    const float* u = g + half;
    float* o = out + m * half;
    for (int64_t j = 0; j < half; ++j) {
      const float e = std::exp(std::min(-g[j], 80.0f)) + 1.0f;
      o[j] = g[j] / e * u[j];
    }
  }
}

#pragma GCC pop_options

}  // namespace npu_ep::kern
