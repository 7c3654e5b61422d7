// Native float convolution kernels: blocked implicit GEMM on our AVX-512 GEMM (conv_gemm.cc) or, below AVX-512,
// numpy's OpenBLAS sgemm (a per-image im2col for the numpy fallback). Depthwise convs live in conv_depthwise.cc,
// QLinearConv in qlinear_conv.cc.
//
// No fused multiply-add anywhere in this file (fp-contract off): the float kernels do the reference's float32
// operations in the reference's order.
#include "conv.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu.h"
#include "conv_gemm.h"
#include "conv_geometry.h"
#include "thread_pool.h"

#include "intrinsics.h"
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace npu_ep::kern {

using conv_detail::Span;
using conv_detail::Valid;

void Im2ColFloat(const ConvShape& s, const float* x, int64_t n, float* cols, int threads) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), rows = s.group * K;
  conv_detail::ParallelItems(threads, rows, P, [&](int64_t r) {
    const int64_t g = r / K, k = r % K, c = k / T, i = (k % T) / s.kw, j = k % s.kw;
    const float* plane = x + ((n * s.C) + g * s.Cg() + c) * s.H * s.W;
    float* dst = cols + r * P;
    const int64_t off_w = j * s.dw - s.pl;
    const Span sw = Valid(off_w, s.sw, s.W, s.OW);
    for (int64_t oh = 0; oh < s.OH; ++oh, dst += s.OW) {
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      if (ih < 0 || ih >= s.H) {
        std::fill(dst, dst + s.OW, 0.0f);
        continue;
      }
      const float* row = plane + ih * s.W + off_w;
      std::fill(dst, dst + sw.lo, 0.0f);
      if (s.sw == 1) {
        std::memcpy(dst + sw.lo, row + sw.lo, (sw.hi - sw.lo) * sizeof(float));
      } else {
        for (int64_t o = sw.lo; o < sw.hi; ++o) dst[o] = row[o * s.sw];
      }
      std::fill(dst + sw.hi, dst + s.OW, 0.0f);
    }
  });
}

namespace {

// rows x cols outputs at pitch `ld` just written by the GEMM, of output channels m0.. : + bias[row], then the tail,
// while in cache.
void FinishRows(float* out, int64_t ld, int64_t rows, int64_t cols, int64_t m0, const float* bias,
                const ConvTail& tail) {
  for (int64_t m = 0; m < rows; ++m) {
    float* r = out + m * ld;
    if (bias != nullptr)
      for (int64_t o = 0; o < cols; ++o) r[o] = r[o] + bias[m0 + m];
    if (tail.n) ApplyChannelTail(tail, r, cols, m0 + m);
  }
}

}  // namespace

void DenseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, Sgemm64 sgemm,
                int threads, const ConvTail& tail) {
  if (s.W == 1 && s.kw == 1 && s.pl == 0 && s.pr == 0 && s.OW == 1 && s.OH > 1) {
    // a column image (Magika's [N, C, L, 1] and its kx1 kernel) is the same conv along W: [N, C, 1, L], the same
    // memory, the same k order of the weights (c, tap), and a row of L outputs the GEMM reads in place
    ConvShape t = s;
    std::swap(t.H, t.W);
    std::swap(t.kh, t.kw);
    std::swap(t.sh, t.sw);
    std::swap(t.dh, t.dw);
    std::swap(t.pt, t.pl);
    std::swap(t.pb, t.pr);
    std::swap(t.OH, t.OW);
    return DenseFloat(t, x, w, bias, y, sgemm, threads, tail);
  }
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), Mg = s.Mg();
  const bool pointwise = T == 1 && s.sh == 1 && s.sw == 1 && s.pt == 0 && s.pl == 0 && s.pb == 0 && s.pr == 0;
#if NPU_EP_X86
  // convs over fewer than 16 output pixels have a kernel of their own on packed weights (conv_panels.h); here
  // they take our GEMM too, so that no conv on an AVX-512 host depends on the host's BLAS
  if (ActiveIsa() >= Isa::kAvx512 && P > 0) return DenseFloatOwnGemm(s, x, w, bias, y, threads, tail);
#endif
  // pixels per task: the block's patch matrix about 512 KiB, the blocks of an image balanced, and at least two of
  // them when one image of one group is worth two threads (the split depends on the shape only)
  const int64_t cap = std::clamp<int64_t>((131072 / K) / 16 * 16, 64, 4096);
  int64_t n_blocks = (P + cap - 1) / cap;
  if (n_blocks == 1 && s.N * s.group == 1 && P >= 128 && P * K * Mg >= 2 * kMinParallelWork) n_blocks = 2;
  const int64_t block = ((P + n_blocks - 1) / n_blocks + 15) / 16 * 16;
  n_blocks = (P + block - 1) / block;
  conv_detail::ParallelItems(threads, s.N * s.group * n_blocks, block * K * Mg, [&](int64_t task) {
    const int64_t n = task / (s.group * n_blocks), g = (task / n_blocks) % s.group, p0 = (task % n_blocks) * block;
    const int64_t cols = std::min(block, P - p0);
    float* out = y + (n * s.M + g * Mg) * P + p0;
    if (pointwise) {  // B is x's rows [K, P] from pixel p0 on
      sgemm(kCblasRowMajor, kCblasTrans, kCblasNoTrans, Mg, cols, K, 1.0f, w + g * K * Mg, Mg,
            x + (n * s.C + g * s.Cg()) * P + p0, P, 0.0f, out, P);
      FinishRows(out, P, Mg, cols, g * Mg, bias, tail);
      return;
    }
    std::vector<float> patch(K * cols);
    conv_detail::PatchMatrix(s, x + (n * s.C + g * s.Cg()) * s.H * s.W, p0, cols, patch.data());
    sgemm(kCblasRowMajor, kCblasTrans, kCblasNoTrans, Mg, cols, K, 1.0f, w + g * K * Mg, Mg, patch.data(), cols, 0.0f,
          out, P);
    FinishRows(out, P, Mg, cols, g * Mg, bias, tail);
  });
}

}  // namespace npu_ep::kern
