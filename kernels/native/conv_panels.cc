// The float conv on panel-packed weights (conv_panels.h): a panel of kPanel output channels of one image and group
// a task, its K rows of kPanel floats streamed from memory in order (the weights do not stay in cache between
// calls; the [K, Mg] rows read in 64-channel pieces 4-5 KiB apart kept the prefetchers behind). B's row k = (c, i, j)
// and pixel (oh, ow) meet at koff[k] + pin[p] of the (padded) planes, so no patch matrix is built.
#include "conv_panels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "conv_gemm.h"
#include "scratch.h"
#include "thread_pool.h"

#if NPU_EP_X86

namespace npu_ep::kern {

void PanelsFloat(const ConvShape& s, const float* x, const float* wp, const float* bias, float* y, int threads,
                 const ConvTail& tail) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), Mg = s.Mg(), panels = (Mg + kPanel - 1) / kPanel;
  if (P == 0 || s.N == 0) return;
  const bool padded = s.pt || s.pl || s.pb || s.pr;
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr;
  const bool clip_only = tail.n == 1 && tail.codes[0] == kTailClip;
  float hs[4];
  const bool hswish = tail.n && HardSwishTail(tail, hs);
  std::vector<int64_t> koff(K), pin(P), pout(P);
  for (int64_t c = 0, k = 0; c < s.Cg(); ++c)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j) koff[k++] = (c * Hp + i * s.dh) * Wp + j * s.dw;
  for (int64_t p = 0; p < P; ++p) {
    pin[p] = p / s.OW * s.sh * Wp + p % s.OW * s.sw;
    pout[p] = p;
  }
  // streaming the weights is the cost (a 1280 x 512 head reads 2.6 MB for 0.66 M multiply-adds): count each
  // weight as four multiply-adds' worth when deciding on a second thread
  const int64_t work = s.N * s.M * K * std::max<int64_t>(P, 4);
  ParallelFor(ThreadsFor(threads, work), s.N * s.group * panels, [&](int64_t task) {
    const int64_t n = task / (s.group * panels), g = task / panels % s.group, m0 = task % panels * kPanel;
    const int64_t rows = std::min(kPanel, Mg - m0);
    const float* planes = x + (n * s.C + g * s.Cg()) * s.H * s.W;
    float* out = y + (n * s.M + g * Mg + m0) * P;
    const float* b = bias == nullptr ? nullptr : bias + g * Mg + m0;
    static thread_local std::vector<float> t_rows, t_bias, t_planes;
    if (padded) {  // the group's planes with their zero borders (a few pixels' worth of input: a small copy)
      float* dst = Grow(t_planes, s.Cg() * Hp * Wp);
      std::fill(dst, dst + s.Cg() * Hp * Wp, 0.0f);
      for (int64_t c = 0; c < s.Cg(); ++c)
        for (int64_t h = 0; h < s.H; ++h)
          std::memcpy(dst + (c * Hp + h + s.pt) * Wp + s.pl, planes + (c * s.H + h) * s.W, s.W * sizeof(float));
      planes = dst;
    }
    // a short last panel: its vectors' zero channels' sums and stores land in scratch, the real rows are copied out
    float* dst = rows < kPanel ? Grow(t_rows, kPanel * P) : out;
    if (rows < kPanel && b != nullptr) {
      float* padded_bias = Grow(t_bias, kPanel);
      std::fill(padded_bias, padded_bias + kPanel, 0.0f);
      std::copy(b, b + rows, padded_bias);
      b = padded_bias;
    }
    ChannelGemmAvx512((rows + 15) / 16 * 16, K, wp + (g * panels + m0 / kPanel) * K * kPanel, kPanel, planes,
                      koff.data(), pin.data(), pout.data(), P, dst, P, b, clip_only ? tail.consts : nullptr,
                      hswish ? hs : nullptr);
    if (dst != out) std::memcpy(out, dst, rows * P * sizeof(float));
    if (tail.n && !clip_only && !hswish && tail.channel_consts == nullptr) ApplyTail(tail, out, rows * P);
    if (tail.n && tail.channel_consts != nullptr)
      for (int64_t m = 0; m < rows; ++m) ApplyChannelTail(tail, out + m * P, P, g * Mg + m0 + m);
  });
}

}  // namespace npu_ep::kern

#endif
