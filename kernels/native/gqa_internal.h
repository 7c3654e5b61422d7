// GroupQueryAttention's inner loops (gqa_ops.cc), one set per instruction set, picked at run time.
#pragma once

#include <cstdint>

namespace npu_ep::kern::gqa {

constexpr int kRows = 4;  // query rows per pass over K and V (the microkernels take 1..kRows)

struct Ops {
  // sc[r * ld + j] = q[r * h ..] . k[j * h ..] for r < rows, j < nk
  void (*scores)(const float* q, int rows, const float* k, int64_t nk, int64_t h, float* sc, int64_t ld);
  // the same from K transposed: kt[i * ldk + j] is key j's channel i
  void (*scores_t)(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc,
                   int64_t ld);
  // x[j] = exp(x[j] - m) for j < n; returns their sum
  float (*exp_sum)(float* x, int64_t n, float m);
  // out[r][i] = (sum_j p[r * ld + j] * v[j * h + i]) / div[r]
  void (*pv)(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
             float* const* out);
};

// The widest set this host runs (cpu.h's ActiveIsa, so tests can cap it).
Ops SelectOps();

}  // namespace npu_ep::kern::gqa
