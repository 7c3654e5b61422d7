// Packing B for the packed-B float GEMM, its threading and tile plans, and its portable path (the same fused
// multiply-adds in the same order as the AVX-512 tile, one output at a time), which keeps the bits equal on any
// host.
#include "packed_sgemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "scratch.h"
#include "thread_pool.h"

namespace npu_ep::kern {

void PackSgemmB(const float* b, int64_t K, int64_t N, float* packed) {
  for (int64_t n0 = 0; n0 < N; n0 += kSgemmPanel) {
    const int64_t w = std::min(kSgemmPanel, N - n0);
    for (int64_t k = 0; k < K; ++k, packed += kSgemmPanel) {
      std::memcpy(packed, b + k * N + n0, w * sizeof(float));
      std::fill(packed + w, packed + kSgemmPanel, 0.0f);
    }
  }
}

namespace {

constexpr int64_t kRowsPerTask = 128;  // a task's rows: their depth chunk of A (128 x 256 floats) stays in L2

void BlockScalar(const PackedSgemmArgs& g, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* out, int64_t ldo) {
  const int64_t n0 = p0 * kSgemmPanel, n1 = std::min(g.N, p1 * kSgemmPanel);
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = g.a + m * g.lda;
    for (int64_t n = n0; n < n1; ++n) {
      const float* col = g.packed + n / kSgemmPanel * kSgemmPanel * g.K + n % kSgemmPanel;
      float y = 0.0f;
      for (int64_t k0 = 0; k0 < g.K; k0 += kSgemmDepthChunk) {
        float acc = 0.0f;
        for (int64_t k = k0; k < std::min(g.K, k0 + kSgemmDepthChunk); ++k)
          acc = std::fma(row[k], col[k * kSgemmPanel], acc);
        y = k0 == 0 ? acc : y + acc;
      }
      if (g.bias != nullptr) y += g.bias[n];
      if (g.relu && !(y > 0.0f || y != y)) y = 0.0f;
      out[(m - m0) * ldo + (n - n0)] = y;
    }
  }
}

void Block(const PackedSgemmArgs& g, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* out, int64_t ldo) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return PackedSgemmBlockAvx512(g, m0, m1, p0, p1, out, ldo);
#endif
  BlockScalar(g, m0, m1, p0, p1, out, ldo);
}

thread_local std::vector<float> t_panel;  // a pool thread's panel rows for a plan tile's part of a panel

// Rows [m0, m1) x columns [n0, n1): whole panels straight into C, a panel the range cuts through via scratch.
void Range(const PackedSgemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t p = n0 / kSgemmPanel; p * kSgemmPanel < n1; ++p) {
    const int64_t c0 = std::max(n0, p * kSgemmPanel), c1 = std::min(n1, (p + 1) * kSgemmPanel);
    if (c0 == p * kSgemmPanel && (c1 == (p + 1) * kSgemmPanel || c1 == g.N)) {
      Block(g, m0, m1, p, p + 1, g.c + m0 * g.ldc + c0, g.ldc);
      continue;
    }
    float* panel = Grow(t_panel, (m1 - m0) * kSgemmPanel);
    Block(g, m0, m1, p, p + 1, panel, kSgemmPanel);
    for (int64_t m = m0; m < m1; ++m)
      std::memcpy(g.c + m * g.ldc + c0, panel + (m - m0) * kSgemmPanel + (c0 - p * kSgemmPanel),
                  (c1 - c0) * sizeof(float));
  }
}

}  // namespace

void PackedSgemm(const PackedSgemmArgs& g, int threads, const TilePlanArgs* plan, DmaCount* dma) {
  if (g.M <= 0 || g.N <= 0) return;  // an empty product (a batch of 0 rows): nothing to write
  if (plan != nullptr && plan->active())
    return RunTiles(threads, plan, dma, g.M, g.N, g.K, kSgemmPanel,
                    [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) { Range(g, m0, m1, n0, n1); });
  // tasks: blocks of rows x groups of panels, a group per thread (a task packs its rows of A once per chunk); the
  // split changes no sum, so it may follow the thread count
  threads = ThreadsFor(threads, g.M * g.N * g.K);
  const int64_t panels = (g.N + kSgemmPanel - 1) / kSgemmPanel, row_blocks = (g.M + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t col_blocks = std::min<int64_t>(panels, std::max<int64_t>(1, threads / row_blocks));
  const int64_t per_task = col_blocks > 0 ? (panels + col_blocks - 1) / col_blocks : 0;
  ParallelFor(threads, row_blocks * col_blocks, [&](int64_t task) {
    const int64_t m0 = task / col_blocks * kRowsPerTask, m1 = std::min(g.M, m0 + kRowsPerTask);
    const int64_t p0 = task % col_blocks * per_task, p1 = std::min(panels, p0 + per_task);
    if (p0 < p1) Block(g, m0, m1, p0, p1, g.c + m0 * g.ldc + p0 * kSgemmPanel, g.ldc);
  });
}

}  // namespace npu_ep::kern
