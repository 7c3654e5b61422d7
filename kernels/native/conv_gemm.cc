// The dense float conv on our own GEMM (GemmAvx512, conv_gemm_avx512.cc) instead of the BLAS. Per task (image,
// group, block of output rows or pixels) B is one of:
// - x's own rows (pointwise: 1x1, stride 1, no pads);
// - a zero-padded copy of the input rows the block reads, read in place through the taps' offsets (unit width
//   stride, output rows wide enough to fill most of a 16-lane vector): no patch matrix at all;
// - else the block's patch matrix, as the BLAS path builds it.
// The split depends on the shape only, so the bits are the same at any thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "conv_gemm.h"
#include "conv_geometry.h"
#include "scratch.h"

#if NPU_EP_X86

namespace npu_ep::kern {
namespace {

// A pool thread's scratch, kept between calls (its size is bounded by the block size below).
struct Scratch {
  std::vector<float> b;
  std::vector<int64_t> koff;
  std::vector<GemmSlot> slots;
};
thread_local Scratch t_scratch;

// Slots for `rows` output rows of `ow` pixels whose B columns start every `in_pitch` floats (C rows: every ow).
void RowSlots(int64_t rows, int64_t ow, int64_t in_pitch, std::vector<GemmSlot>& slots) {
  slots.clear();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < ow; o += 16)
      slots.push_back({r * in_pitch + o, r * ow + o, static_cast<int>(std::min<int64_t>(16, ow - o))});
}

// In-place B: a vector of 16 lanes per started output row segment wastes lanes when rows are narrow.
bool ReadsInPlace(const ConvShape& s) {
  const int64_t lanes = (s.OW + 15) / 16 * 16;
  return s.sw == 1 && s.OW >= 16 && lanes * 4 <= s.OW * 5;
}

// Rows [ih0, ih0 + rows) of the group's Cg planes into dst [Cg, rows, wp], zero where they fall in the padding.
void PaddedRows(const ConvShape& s, const float* planes, int64_t ih0, int64_t rows, int64_t wp, float* dst) {
  const int64_t lo = std::min<int64_t>(s.pl, wp), hi = std::clamp<int64_t>(s.pl + s.W, lo, wp);
  for (int64_t c = 0; c < s.Cg(); ++c) {
    for (int64_t r = 0; r < rows; ++r, dst += wp) {
      const int64_t ih = ih0 + r;
      if (ih < 0 || ih >= s.H) {
        std::fill(dst, dst + wp, 0.0f);
        continue;
      }
      const float* src = planes + (c * s.H + ih) * s.W - s.pl;  // src[q] is padded column q
      for (int64_t q = 0; q < lo; ++q) dst[q] = 0.0f;  // a pad of a column or two: no call for it
      std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
      for (int64_t q = hi; q < wp; ++q) dst[q] = 0.0f;
    }
  }
}

}  // namespace

void DenseFloatOwnGemm(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                       const ConvTail& tail) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), Mg = s.Mg();
  const bool pointwise = T == 1 && s.sh == 1 && s.sw == 1 && s.pt == 0 && s.pl == 0 && s.pb == 0 && s.pr == 0;
  const bool in_place = !pointwise && ReadsInPlace(s);
  // pixels per task as on the BLAS path (a patch matrix of about 512 KiB), whole output rows when read in place;
  // one image worth 1M multiply-adds (~20 us here) already goes to two threads (ORT's pool spins: no wake-up)
  const int64_t cap = std::clamp<int64_t>((131072 / K) / 16 * 16, 64, 4096);
  int64_t n_blocks = (P + cap - 1) / cap;
  if (n_blocks == 1 && s.N * s.group == 1 && P >= 128 && P * K * Mg >= kMinParallelWork) n_blocks = 2;
  const int64_t unit = in_place ? s.OW : 16;  // a block is a whole number of these pixels
  const int64_t units = (P + unit - 1) / unit;
  const int64_t per_block = (units + n_blocks - 1) / n_blocks;
  const int64_t block = per_block * unit;
  n_blocks = (units + per_block - 1) / per_block;
  // A small image (YOLO's 10x10 maps: P = 100, K = 1152, 256 channels) is one block: its output channels go to two
  // tasks instead, each building the same B. Every output's sum is the same, so the bits do not change.
  // The rows are split rounding UP to whole 8-row tiles (Mg = 33 is 24 + 9 rows), so the blocks cover all Mg rows;
  // m_blocks is then recounted from that size.
  int64_t m_blocks = n_blocks == 1 && s.N * s.group == 1 && Mg >= 32 && P * K * Mg >= 2 * kMinParallelWork ? 2 : 1;
  const int64_t m_block = ((Mg + m_blocks - 1) / m_blocks + 7) / 8 * 8;
  m_blocks = (Mg + m_block - 1) / m_block;
  const int64_t ekh = (s.kh - 1) * s.dh + 1, wp = s.OW + (s.kw - 1) * s.dw;
  const bool clip_only = tail.n == 1 && tail.codes[0] == kTailClip;  // Relu, Clip: done in the GEMM's registers
  const int64_t tasks = s.N * s.group * n_blocks * m_blocks;
  conv_detail::ParallelItems(threads, tasks, block * K * std::min(m_block, Mg), [&](int64_t item) {
    const int64_t task = item / m_blocks, m0 = (item % m_blocks) * m_block, rows_m = std::min(m_block, Mg - m0);
    const int64_t n = task / (s.group * n_blocks), g = (task / n_blocks) % s.group, p0 = (task % n_blocks) * block;
    const int64_t cols = std::min(block, P - p0);
    const float* planes = x + (n * s.C + g * s.Cg()) * s.H * s.W;
    float* out = y + (n * s.M + g * Mg) * P + p0;
    Scratch& sc = t_scratch;
    sc.koff.resize(K);
    const float* b;
    if (pointwise) {
      b = planes + p0;
      for (int64_t k = 0; k < K; ++k) sc.koff[k] = k * P;
      RowSlots(1, cols, cols, sc.slots);
    } else if (in_place) {
      const int64_t rows = cols / s.OW, oh0 = p0 / s.OW, rows_in = (rows - 1) * s.sh + ekh;
      float* pad = Grow(sc.b, s.Cg() * rows_in * wp);
      PaddedRows(s, planes, oh0 * s.sh - s.pt, rows_in, wp, pad);
      int64_t* off = sc.koff.data();  // k = (c, i, j) in order, without a division per k
      for (int64_t c = 0; c < s.Cg(); ++c)
        for (int64_t i = 0; i < s.kh; ++i)
          for (int64_t j = 0; j < s.kw; ++j) *off++ = (c * rows_in + i * s.dh) * wp + j * s.dw;
      RowSlots(rows, s.OW, s.sh * wp, sc.slots);
      b = pad;
    } else {
      float* patch = Grow(sc.b, K * cols);
      conv_detail::PatchMatrix(s, planes, p0, cols, patch);
      for (int64_t k = 0; k < K; ++k) sc.koff[k] = k * cols;
      RowSlots(1, cols, cols, sc.slots);
      b = patch;
    }
    GemmAvx512(rows_m, K, w + g * K * Mg + m0, Mg, b, sc.koff.data(), sc.slots.data(),
               static_cast<int64_t>(sc.slots.size()), out + m0 * P, P, bias == nullptr ? nullptr : bias + g * Mg + m0,
               clip_only ? tail.consts : nullptr);
    if (tail.n && !clip_only)
      for (int64_t m = m0; m < m0 + rows_m; ++m) ApplyChannelTail(tail, out + m * P, cols, g * Mg + m);
  });
}

void PointwiseFewPixels(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                        const ConvTail& tail) {
  const int64_t K = s.Cg(), P = s.P(), Mg = s.Mg();
  const int64_t per = 128;  // output channels per task (two passes of ChannelLanesAvx512)
  const int64_t blocks = (Mg + per - 1) / per;
  const bool clip_only = tail.n == 1 && tail.codes[0] == kTailClip;
  // streaming the weights is the cost (a 1280 x 512 head reads 2.6 MB for 0.66 M multiply-adds): count each
  // weight as four multiply-adds' worth when deciding on a second thread
  const int64_t work = s.N * s.M * K * std::max<int64_t>(P, 4);
  ParallelFor(ThreadsFor(threads, work), s.N * s.group * blocks, [&](int64_t task) {
    const int64_t n = task / (s.group * blocks), g = (task / blocks) % s.group, m0 = (task % blocks) * per;
    const int64_t rows = std::min(per, Mg - m0);
    float* out = y + (n * s.M + g * Mg + m0) * P;
    ChannelLanesAvx512(rows, K, w + g * K * Mg + m0, Mg, x + (n * s.C + g * K) * P, P, P, out, P,
                       bias == nullptr ? nullptr : bias + g * Mg + m0, clip_only ? tail.consts : nullptr);
    if (tail.n && !clip_only && tail.channel_consts == nullptr) ApplyTail(tail, out, rows * P);  // rows contiguous
    if (tail.n && tail.channel_consts != nullptr)
      for (int64_t m = 0; m < rows; ++m) ApplyChannelTail(tail, out + m * P, P, g * Mg + m0 + m);
  });
}

}  // namespace npu_ep::kern

#endif
