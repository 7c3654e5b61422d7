// The planner's tile plan as the native matrix kernels take it (kernels/tile_plan.py), and the DMA traffic of its
// execution model (kernels/planner.py's docstring) counted tile by tile while a kernel runs the plan's output
// tiles. Counts are in half-bytes, so int4 weights (half a byte) and blockwise scales (4.5 bytes: float32 scale
// plus a 4-bit zero point per block and column) count exactly; bytes = half-bytes / 2.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "thread_pool.h"

namespace npu_ep::kern {

enum class Resident { kNone = 0, kA = 1, kB = 2, kWeights = 3 };

struct TilePlanArgs {
  int64_t tm = 0, tn = 0, tk = 0;  // 0: no plan (the kernel's own split; nothing counted)
  Resident resident = Resident::kNone;  // "b" runs n-outer ("nmk"), the others m-outer ("mnk")
  // DRAM half-bytes per element of A, B and the output; of the scales per (block, column) when block > 0, else
  // per column (int8 requantization constants)
  int64_t a_half = 0, b_half = 0, out_half = 0, scale_half = 0;
  int64_t block = 0;
  bool active() const { return tm > 0 && tn > 0 && tk > 0; }
};

struct DmaCount {  // half-bytes per operand, and the number of transfers
  int64_t a = 0, b = 0, scales = 0, out = 0, transfers = 0;
  void Add(const DmaCount& o) { a += o.a, b += o.b, scales += o.scales, out += o.out, transfers += o.transfers; }
};

// Output tiles of an [M, K] x [K, N] product in the plan's loop order.
struct TileGrid {
  int64_t M, N, K, Tm, Tn, Tk;
  const TilePlanArgs* p;
  TileGrid(const TilePlanArgs& plan, int64_t m, int64_t n, int64_t k)
      : M(m), N(n), K(k), Tm((m + plan.tm - 1) / plan.tm), Tn((n + plan.tn - 1) / plan.tn),
        Tk((k + plan.tk - 1) / plan.tk), p(&plan) {}
  int64_t count() const { return Tm * Tn; }
  // tile t (in loop order) -> (mi, ni)
  void Index(int64_t t, int64_t& mi, int64_t& ni) const {
    if (p->resident == Resident::kB) {
      ni = t / Tm, mi = t % Tm;
    } else {
      mi = t / Tn, ni = t % Tn;
    }
  }
  int64_t m0(int64_t mi) const { return mi * p->tm; }
  int64_t m1(int64_t mi) const { return std::min(M, (mi + 1) * p->tm); }
  int64_t n0(int64_t ni) const { return ni * p->tn; }
  int64_t n1(int64_t ni) const { return std::min(N, (ni + 1) * p->tn); }

  // The DMA the execution model does for output tile (mi, ni): A and B tiles per K tile unless resident (an A
  // strip is loaded with the first tile of its m strip, a B strip with the first of its n strip, all weights
  // during the first m strip), scales with their B, the output tile stored once.
  DmaCount Tile(int64_t mi, int64_t ni) const {
    const TilePlanArgs& q = *p;
    const int64_t rows = m1(mi) - m0(mi), cols = n1(ni) - n0(ni);
    DmaCount c;
    const bool a_strip = q.resident == Resident::kA || q.resident == Resident::kWeights;
    if (a_strip && ni == 0) c.a += rows * K * q.a_half, ++c.transfers;
    if (q.resident == Resident::kB && mi == 0) {
      c.b += K * cols * q.b_half, ++c.transfers;
      c.scales += ScaleHalf(0, K, cols);
    }
    for (int64_t k0 = 0; k0 < K; k0 += q.tk) {
      const int64_t k1 = std::min(K, k0 + q.tk);
      if (!a_strip) c.a += rows * (k1 - k0) * q.a_half, ++c.transfers;
      const bool load_b =
          q.resident == Resident::kNone || q.resident == Resident::kA || (q.resident == Resident::kWeights && mi == 0);
      if (load_b) {
        c.b += (k1 - k0) * cols * q.b_half, ++c.transfers;
        c.scales += ScaleHalf(k0, k1, cols);
      }
    }
    c.out += rows * cols * q.out_half, ++c.transfers;
    return c;
  }

 private:
  // scales of B rows [k0, k1) for `cols` columns: per block (blockwise) or per column (once per whole-K load)
  int64_t ScaleHalf(int64_t k0, int64_t k1, int64_t cols) const {
    if (p->block == 0) return k0 == 0 ? cols * p->scale_half : 0;
    const int64_t blocks = (k1 + p->block - 1) / p->block - k0 / p->block;  // k0 is a block boundary
    return blocks * cols * p->scale_half;
  }
};

// Runs fn(r0, r1, n0, n1) over the rows x columns of an [M, K] x [K, N] product on `threads` threads. Without a
// plan: all rows, columns in pieces of `width`. With one: the plan's output tiles in loop order, each cut into
// column pieces of `width`; the first piece of a tile adds the tile's DMA (into *dma when given). The pieces depend
// only on the shape and the plan, never on the thread count.
template <typename Fn>
void RunTiles(int threads, const TilePlanArgs* plan, DmaCount* dma, int64_t M, int64_t N, int64_t K, int64_t width,
              const Fn& fn) {
  threads = ThreadsFor(threads, M * N * K);
  if (plan == nullptr || !plan->active()) {
    ParallelFor(threads, (N + width - 1) / width,
                [&](int64_t t) { fn(int64_t{0}, M, t * width, std::min(N, (t + 1) * width)); });
    return;
  }
  const TileGrid grid(*plan, M, N, K);
  struct Piece {
    int64_t mi, ni, n0, n1;
  };
  std::vector<Piece> pieces;
  for (int64_t t = 0; t < grid.count(); ++t) {
    int64_t mi, ni;
    grid.Index(t, mi, ni);
    for (int64_t c = grid.n0(ni); c < grid.n1(ni); c += width)
      pieces.push_back({mi, ni, c, std::min(grid.n1(ni), c + width)});
  }
  std::vector<DmaCount> counts(dma != nullptr ? pieces.size() : 0);
  ParallelFor(threads, static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& p = pieces[i];
    if (dma != nullptr && p.n0 == grid.n0(p.ni)) counts[i] = grid.Tile(p.mi, p.ni);
    fn(grid.m0(p.mi), grid.m1(p.mi), p.n0, p.n1);
  });
  if (dma != nullptr) {
    *dma = DmaCount{};
    for (const DmaCount& c : counts) dma->Add(c);
  }
}

}  // namespace npu_ep::kern
