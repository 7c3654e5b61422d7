// The dense float conv on our own GEMM (GemmAvx512, conv_gemm_avx512.cc) instead of the BLAS. Per task (image,
// group, block of output pixels) B is one of:
// - x's own rows (pointwise: 1x1, stride 1, no pads);
// - a zero-padded copy of the input rows the block reads, held as the width stride's column phases and read in
//   place through the taps' offsets: no patch matrix at all. A 16-pixel vector that crosses into the next output
//   row jumps over the padding between the rows (GemmSlot's split), so no lane is wasted at a row's end;
// - else (output rows narrower than half a vector) the block's patch matrix, as the BLAS path builds it.
// Every output is summed the same way whatever the block or thread count (GemmAvx512), so the split may follow
// the thread count and the bits do not. A conv over fewer than 16 pixels runs on weights packed in panels
// (conv_panels.cc), its output channels in the lanes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "conv_gemm.h"
#include "conv_geometry.h"
#include "scratch.h"
#include "thread_pool.h"

#if NPU_EP_X86

namespace npu_ep::kern {
namespace {

// A pool thread's scratch, kept between calls (its size is bounded by the block size below).
struct Scratch {
  std::vector<float> b, row;
  std::vector<int64_t> koff;
  std::vector<GemmSlot> slots;
  std::vector<int64_t> pin, pout;
};
thread_local Scratch t_scratch;

// Slots for `cols` consecutive pixels (C columns from 0) whose B column is that of a contiguous run.
void RunSlots(int64_t cols, std::vector<GemmSlot>& slots) {
  slots.clear();
  for (int64_t o = 0; o < cols; o += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, cols - o));
    slots.push_back({o, o, n, n, 0});
  }
}

// Slots for output pixels [p0, p0 + cols) of rows OW wide, pixel (r, o) (r counted from p0's row) at B column
// r * pitch + o: 16 pixels a vector, across at most one row end (a vector that would reach a third row stops short).
void RowSlots(int64_t p0, int64_t cols, int64_t ow, int64_t pitch, std::vector<GemmSlot>& slots) {
  slots.clear();
  const int64_t r0 = p0 / ow;
  for (int64_t p = p0, end = p0 + cols; p < end;) {
    const int64_t r = p / ow - r0, o = p % ow;
    const int64_t first = std::min({int64_t{16}, ow - o, end - p});
    const int64_t n = std::min({int64_t{16}, first + ow, end - p});
    slots.push_back({r * pitch + o, p - p0, static_cast<int>(n), static_cast<int>(first), n > first ? pitch - ow : 0});
    p += n;
  }
}

// Whether the output channels in the lanes (ChannelGemmAvx512) pay: fewer vector multiply-adds than the pixels'
// tiles (GemmAvx512: M per slot and k, its near-equal row blocks waste none; a split slot's blend is cheap), with 16
// more per vector and depth pass (up to kKc = 256 deep) for the channels' sums and scatter stores. The lanes re-read
// a 64-channel block's K rows from L2 for every 6 pixels where the pixels' tile keeps its 12 rows in L1: a block
// deeper than 2048 (512 KiB) crowds B out of L2 and stays with the pixels. One vector of channels (16) loads a
// broadcast of B per multiply-add, so its multiply-adds count 7/6. The bits are the same either way.
bool ChannelLanesPay(int64_t rows_m, int64_t K, int64_t cols, const std::vector<GemmSlot>& slots) {
  if (rows_m % 16 != 0 || K < 64 || K > 2048) return false;
  const int64_t kc = std::min<int64_t>(K, 256);
  const int64_t lanes = rows_m / 16 * cols * (kc + 16), pixels = rows_m * static_cast<int64_t>(slots.size()) * kc;
  return rows_m == 16 ? 7 * lanes < 6 * pixels : lanes < pixels;
}

// Each slot's pixels one by one: B column (pin) and C column (pout).
void Pixels(const std::vector<GemmSlot>& slots, std::vector<int64_t>& pin, std::vector<int64_t>& pout) {
  pin.clear();
  pout.clear();
  for (const GemmSlot& sl : slots)
    for (int l = 0; l < sl.n; ++l) {
      pin.push_back(sl.in + l + (l >= sl.split ? sl.jump : 0));
      pout.push_back(sl.out + l);
    }
}

// Padded input columns q * sw + ph of the padded row `row` (W + pl + pr, zeros outside the input) for each phase
// ph < sw: dst + ph * phase_pitch, wq columns each.
void Phases(const ConvShape& s, const float* row, int64_t wq, int64_t phase_pitch, float* dst,
            std::vector<float>& tmp) {
  const int64_t lo = std::min<int64_t>(s.pl, wq * s.sw), hi = std::clamp<int64_t>(s.pl + s.W, lo, wq * s.sw);
  auto padded = [&](float* d) {  // padded columns [0, wq * sw) into d
    for (int64_t q = 0; q < lo; ++q) d[q] = 0.0f;  // a pad of a column or two: no call for it
    if (row != nullptr) {
      std::memcpy(d + lo, row + lo - s.pl, (hi - lo) * sizeof(float));
    } else {
      std::fill(d + lo, d + hi, 0.0f);
    }
    for (int64_t q = hi; q < wq * s.sw; ++q) d[q] = 0.0f;
  };
  if (s.sw == 1) return padded(dst);
  if (s.sw == 2 && row != nullptr) {  // columns q whose both phases are inside the input split in place, the rest here
    const int64_t qa = std::min(wq, (s.pl + 1) / 2);  // from qa on 2q - pl >= 0
    const int64_t qb = std::clamp<int64_t>((s.W + s.pl) / 2, qa, wq);  // below qb 2q + 1 - pl < W
    auto edge = [&](int64_t q) {
      for (int64_t ph = 0; ph < 2; ++ph) {
        const int64_t col = 2 * q + ph - s.pl;
        dst[ph * phase_pitch + q] = col >= 0 && col < s.W ? row[col] : 0.0f;
      }
    };
    for (int64_t q = 0; q < qa; ++q) edge(q);
    for (int64_t q = qb; q < wq; ++q) edge(q);
    if (qb > qa) EvenOddAvx512(row + 2 * qa - s.pl, qb - qa, dst + qa, dst + phase_pitch + qa);
    return;
  }
  float* t = Grow(tmp, wq * s.sw);
  padded(t);
  if (s.sw == 2) return EvenOddAvx512(t, wq, dst, dst + phase_pitch);
  for (int64_t ph = 0; ph < s.sw; ++ph)
    for (int64_t q = 0; q < wq; ++q) dst[ph * phase_pitch + q] = t[q * s.sw + ph];
}

// Input rows [ih0, ih0 + rows) of the group's Cg planes into dst [Cg, sw, rows, wq]: padded row ih's column
// q * sw + ph at dst[((c * sw + ph) * rows + r) * wq + q], zeros in the padding.
void PhasedRows(const ConvShape& s, const float* planes, int64_t ih0, int64_t rows, int64_t wq, float* dst,
                std::vector<float>& tmp) {
  if (s.sw == 1 && wq <= 48) {  // short rows: one call a plane (a memcpy a row is as fast on longer ones)
    for (int64_t c = 0; c < s.Cg(); ++c)
      PaddedRowsAvx512(planes + c * s.H * s.W, s.H, s.W, ih0, rows, s.pl, wq, dst + c * rows * wq);
    return;
  }
  for (int64_t c = 0; c < s.Cg(); ++c)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ih = ih0 + r;
      const float* row = ih >= 0 && ih < s.H ? planes + (c * s.H + ih) * s.W : nullptr;
      Phases(s, row, wq, rows * wq, dst + (c * s.sw * rows + r) * wq, tmp);
    }
}

// How an image's work is cut into tasks: blocks of output pixels times blocks of output channels.
struct TaskSplit {
  int64_t blocks, m_blocks;
};

// Pixel block b of n starts at BlockStart(b) (b = n: P). Near-equal blocks of whole slot pairs, the first
// ones a pair larger where they do not divide (more blocks than pairs: of slots), the odd last slot, if any, the last
// block's: an odd slot count a block would leave every block a lone last slot, which runs in the lanes kernel at a
// fraction of the pair tile's speed. The last block is the first task, then the others in order: the tasks hand out
// one at a time, largest first but that one, so the short ones even the threads out at the end.
int64_t BlockStart(int64_t b, int64_t n, int64_t P) {
  if (b >= n) return P;
  const int64_t units = (P + 15) / 16, pairs = units / 2;
  const int64_t q = n <= pairs ? 2 : 1, quanta = n <= pairs ? pairs : units;
  return 16 * q * (b * (quanta / n) + std::min(b, quanta % n));
}

// Pixel blocks balanced over the image, so that
// - B's scratch (a patch matrix, or the padded rows) stays near 512 KiB;
// - an image worth two threads' work has at least two tasks per thread (ORT's pool spins: no wake-up; the tasks
//   hand out one at a time, so an odd count leaves a thread idle for a task's time).
// A small map (7x7..28x28) would give pixel blocks of a few vectors, the last one short (196 pixels in 4 blocks:
// 64, 64, 64, 4, each costing a vector per k): its output channels go to the tasks instead, every task the whole
// map, so the tasks weigh the same and none pays for a near-empty vector.
TaskSplit SplitTasks(const ConvShape& s, int64_t K, int threads) {
  const int64_t P = s.P(), Mg = s.Mg(), units = (P + 15) / 16, images = s.N * s.group;
  const int64_t cap = std::clamp<int64_t>((131072 / K) / 16 * 16, 64, 4096);
  int64_t n_blocks = std::min((P + cap - 1) / cap, units), m_blocks = 1;
  if (threads > 1 && P * K * Mg >= kMinParallelWork) {
    const int64_t want = (2 * threads + images - 1) / images;  // tasks per image for two per thread
    int64_t pixel_blocks = std::max(n_blocks, want);
    while ((images * pixel_blocks) % threads != 0) ++pixel_blocks;
    pixel_blocks = std::min(pixel_blocks, units);
    const int64_t per = (units + pixel_blocks - 1) / pixel_blocks;
    if ((per < 4 || units % per != 0) && n_blocks < want && Mg >= 32) {
      m_blocks = (want + n_blocks - 1) / n_blocks;
      while ((images * n_blocks * m_blocks) % threads != 0) ++m_blocks;
    } else {
      n_blocks = pixel_blocks;
    }
  } else if (n_blocks == 1 && images == 1 && Mg >= 32 && P * K * Mg >= 2 * kMinParallelWork) {
    m_blocks = 2;  // a one-block image (YOLO's 10x10 maps) in two tasks, each building the same B
  }
  return {n_blocks, m_blocks};
}

}  // namespace

void DenseFloatOwnGemm(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                       const ConvTail& tail) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), Mg = s.Mg();
  const bool pointwise = T == 1 && s.sh == 1 && s.sw == 1 && s.pt == 0 && s.pl == 0 && s.pb == 0 && s.pr == 0;
  const bool in_place = !pointwise && s.OW >= 8;
  const TaskSplit split = SplitTasks(s, K, threads);
  const int64_t n_blocks = split.blocks, block = (P + n_blocks - 1) / n_blocks;  // pixels a block, about
  // The output channels split evenly in whole 16-row vectors where Mg has them (the channels-in-lanes GEMM takes
  // those), else in 8-row tiles, the last one short (Mg = 33: 16 + 17 rows). Every output's sum is the same
  // whichever task has it, so the bits do not change.
  const int64_t m_unit = Mg % 16 == 0 ? 16 : 8, m_units = (Mg + m_unit - 1) / m_unit;
  const int64_t m_blocks = std::min(split.m_blocks, m_units);
  const int64_t ekh = (s.kh - 1) * s.dh + 1, wq = s.OW + (s.kw - 1) * s.dw / s.sw;
  const bool clip_only = tail.n == 1 && tail.codes[0] == kTailClip;  // Relu, Clip: done in the GEMM's registers
  float hs[4];
  const bool hswish = tail.n && HardSwishTail(tail, hs);  // HardSwish too
  const int64_t tasks = s.N * s.group * n_blocks * m_blocks;
  conv_detail::ParallelItems(threads, tasks, block * K * ((Mg + m_blocks - 1) / m_blocks), [&](int64_t item) {
    const int64_t task = item / m_blocks, mb = item % m_blocks;
    const int64_t m0 = mb * m_units / m_blocks * m_unit,
                  rows_m = std::min(Mg, (mb + 1) * m_units / m_blocks * m_unit) - m0;
    const int64_t pb = (task % n_blocks + n_blocks - 1) % n_blocks;  // the last block first
    const int64_t n = task / (s.group * n_blocks), g = (task / n_blocks) % s.group, p0 = BlockStart(pb, n_blocks, P);
    const int64_t cols = BlockStart(pb + 1, n_blocks, P) - p0;
    const float* planes = x + (n * s.C + g * s.Cg()) * s.H * s.W;
    float* out = y + (n * s.M + g * Mg) * P + p0;
    Scratch& sc = t_scratch;
    sc.koff.resize(K);
    const float* b;
    if (pointwise) {
      b = planes + p0;
      for (int64_t k = 0; k < K; ++k) sc.koff[k] = k * P;
      RunSlots(cols, sc.slots);
    } else if (in_place) {
      const int64_t oh0 = p0 / s.OW, rows = (p0 + cols - 1) / s.OW - oh0 + 1, rows_in = (rows - 1) * s.sh + ekh;
      float* pad = Grow(sc.b, s.Cg() * s.sw * rows_in * wq + 16);  // + what a split slot reads past its lanes
      PhasedRows(s, planes, oh0 * s.sh - s.pt, rows_in, wq, pad, sc.row);
      // k = (c, i, j) in order: the first channel's taps, then each channel's plane block further on (a division
      // per k cost ~1 us of a 16-channel 3x3 conv on an 8x8 map)
      int64_t* off = sc.koff.data();
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t j = 0; j < s.kw; ++j) *off++ = ((j * s.dw % s.sw) * rows_in + i * s.dh) * wq + j * s.dw / s.sw;
      const int64_t plane = s.sw * rows_in * wq;
      for (int64_t c = 1; c < s.Cg(); ++c)
        for (int64_t t = 0; t < T; ++t) *off++ = sc.koff[t] + c * plane;
      RowSlots(p0, cols, s.OW, s.sh * wq, sc.slots);
      b = pad;
    } else {
      float* patch = Grow(sc.b, K * cols);
      conv_detail::PatchMatrix(s, planes, p0, cols, patch);
      for (int64_t k = 0; k < K; ++k) sc.koff[k] = k * cols;
      RunSlots(cols, sc.slots);
      b = patch;
    }
    if (ChannelLanesPay(rows_m, K, cols, sc.slots)) {
      Pixels(sc.slots, sc.pin, sc.pout);
      ChannelGemmAvx512(rows_m, K, w + g * K * Mg + m0, Mg, b, sc.koff.data(), sc.pin.data(), sc.pout.data(), cols,
                        out + m0 * P, P, bias == nullptr ? nullptr : bias + g * Mg + m0,
                        clip_only ? tail.consts : nullptr, hswish ? hs : nullptr);
    } else {
      // a lone last slot (odd slot count) runs a one-slot tile, a broadcast of A per multiply-add: its pixels go to
      // the channels in the lanes instead (the same sums), also a split one; past K = 2048 only a short unsplit one
      // (196 pixels: 12 paired slots and one of 4), as ChannelLanesPay keeps deep blocks off the lanes
      int64_t n_slots = static_cast<int64_t>(sc.slots.size());
      const GemmSlot& last = sc.slots.back();
      const bool lone =
          n_slots % 2 == 1 && rows_m % 16 == 0 && K >= 64 && (K <= 2048 || (last.n <= 8 && last.split >= last.n));
      if (lone) {
        --n_slots;
        sc.pin.clear();
        sc.pout.clear();
        for (int l = 0; l < last.n; ++l) {
          sc.pin.push_back(last.in + l + (l >= last.split ? last.jump : 0));
          sc.pout.push_back(last.out + l);
        }
        ChannelGemmAvx512(rows_m, K, w + g * K * Mg + m0, Mg, b, sc.koff.data(), sc.pin.data(), sc.pout.data(), last.n,
                          out + m0 * P, P, bias == nullptr ? nullptr : bias + g * Mg + m0,
                          clip_only ? tail.consts : nullptr, hswish ? hs : nullptr);
      }
      if (n_slots > 0)
        GemmAvx512(rows_m, K, w + g * K * Mg + m0, Mg, b, sc.koff.data(), sc.slots.data(), n_slots, out + m0 * P, P,
                   bias == nullptr ? nullptr : bias + g * Mg + m0, clip_only ? tail.consts : nullptr,
                   hswish ? hs : nullptr);
    }
    if (tail.n && !clip_only && !hswish)
      for (int64_t m = m0; m < m0 + rows_m; ++m) ApplyChannelTail(tail, out + m * P, cols, g * Mg + m);
  });
}

}  // namespace npu_ep::kern

#endif
