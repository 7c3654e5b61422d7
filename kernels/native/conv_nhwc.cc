// Float convs of a layout chain in NHWC (kernels/layout.py, kernels/ops/conv_nhwc.py): x [N, H, W, C] in, y
// [N, OH, OW, M] out, so a chain of depthwise and pointwise convs needs no transposes between its steps.
// - Depthwise (one input channel per group, one output each): channels in the vector lanes, each tap a whole
//   vector of channels. The reference's float32 operations in its order (conv.py's _depthwise): the first tap's
//   product, each later tap's product added, padding read as zeros and multiplied like any input (0 * inf is NaN
//   there too), then + bias: the same bits. The fused tail runs on each output row while it is in cache.
// - Pointwise (1x1, stride 1, unpadded, one group): y[P, M] = x[P, C] W[C, M] on the packed GEMM (packed_sgemm.h)
//   with its bias, then the tail; within the dot-product bound of the reference's BLAS product, not bit-equal.
#include "conv_nhwc.h"

#include <algorithm>
#include <vector>

#include "cpu.h"
#include "intrinsics.h"
#include "packed_sgemm.h"
#include "thread_pool.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace npu_ep::kern {
namespace {

// A tail applied to each output vector before its store: one clip or HardSwish's program, the register
// interpreter's operations in its order (conv_tail.h); kOther: ApplyTail on the stored row.
struct RowTail {
  enum Kind { kNone, kClip, kHardSwish, kOther } kind = kNone;
  float c[4] = {};  // clip {lo, hi}; HardSwish {a, b, lo, hi}: v * max(lo, min(hi, v * a + b))
  explicit RowTail(const ConvTail& t) {
    if (t.n == 0) return;
    if (t.n == 1 && t.codes[0] == kTailClip && t.channel_consts == nullptr) {
      kind = kClip, c[0] = t.consts[0], c[1] = t.consts[1];
    } else if (HardSwishTail(t, c)) {
      kind = kHardSwish;
    } else {
      kind = kOther;
    }
  }
};

// Channels a depthwise task takes: its input rows' channels are padded once into a ring, all its output rows computed.
constexpr int64_t kGroup = 32;

// The input rows of channels [c0, c0 + G) of image n, each zero-padded to Wp columns (pads are zeros, as the
// reference's np.pad), kGroup channels a column (the last G), kept in a ring of kh rows: each input row is padded once
// while the output rows that read it run.
struct PaddedRows {
  const NhwcDepthwise& d;
  int64_t n, c0, G, Wp;
  float* ring;
  const float* zeros;
  int64_t held[kNhwcMaxKernel];  // the input row each ring slot holds, -1: none

  PaddedRows(const NhwcDepthwise& dw, int64_t image, int64_t first, int64_t group, int64_t width, float* r,
             const float* z)
      : d(dw), n(image), c0(first), G(group), Wp(width), ring(r), zeros(z) {
    std::fill(held, held + kNhwcMaxKernel, int64_t{-1});
  }

  const float* Row(int64_t ih) {
    if (ih < 0 || ih >= d.H) return zeros;
    const int64_t slot = ih % d.kh;
    float* r = ring + slot * Wp * kGroup;
    if (held[slot] != ih) {
      std::fill(r, r + d.pl * kGroup, 0.0f);
      if (d.nchw_in) {  // the row of each channel plane into the lanes
        const float* x = d.x + ((n * d.C + c0) * d.H + ih) * d.W;
        for (int64_t c = 0; c < G; ++c, x += d.H * d.W)
          for (int64_t iw = 0; iw < d.W; ++iw) r[(d.pl + iw) * kGroup + c] = x[iw];
      } else {
        const float* x = d.x + ((n * d.H + ih) * d.W) * d.C + c0;
        for (int64_t iw = 0; iw < d.W; ++iw) std::copy(x + iw * d.C, x + iw * d.C + G, r + (d.pl + iw) * kGroup);
      }
      std::fill(r + (d.pl + d.W) * kGroup, r + Wp * kGroup, 0.0f);
      held[slot] = ih;
    }
    return r;
  }
};

// One output row of channels [c0, c0 + G) from the padded rows (channel pitch kGroup).
void RowScalar(const NhwcDepthwise& d, const float* const* rows, int64_t c0, int64_t G, float* y) {
  for (int64_t ow = 0; ow < d.OW; ++ow) {
    for (int64_t c = 0; c < G; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d.kh; ++i)
        for (int64_t j = 0; j < d.kw; ++j) {
          const float p = rows[i][(ow * d.sw + j) * kGroup + c] * d.w[(i * d.kw + j) * d.C + c0 + c];
          acc = i == 0 && j == 0 ? p : acc + p;
        }
      y[ow * d.C + c0 + c] = d.bias != nullptr ? acc + d.bias[c0 + c] : acc;
    }
  }
}

#if NPU_EP_X86
// The NC x NV sums of output columns from ow, channels from c: + bias, the register tail, stored.
template <int NC, int NV>
__attribute__((target("avx512f"), always_inline)) inline void Store(const NhwcDepthwise& d, const __m512* acc,
                                                                    int64_t ow, int64_t c, __mmask16 mask,
                                                                    const RowTail& rt, float* y) {
  const int64_t C = d.C;
  const __m512 k0 = _mm512_set1_ps(rt.c[0]), k1 = _mm512_set1_ps(rt.c[1]);
  const __m512 k2 = _mm512_set1_ps(rt.c[2]), k3 = _mm512_set1_ps(rt.c[3]);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512 b = d.bias != nullptr ? _mm512_maskz_loadu_ps(mask, d.bias + c + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) {
      __m512 s = d.bias != nullptr ? _mm512_add_ps(acc[q * NV + v], b) : acc[q * NV + v];
      if (rt.kind == RowTail::kClip) {  // lo wins, also when lo > hi; NaN stays
        const __mmask16 below = _mm512_cmp_ps_mask(s, k0, _CMP_LT_OQ);
        const __mmask16 above = _mm512_cmp_ps_mask(s, k1, _CMP_GT_OQ);
        s = _mm512_mask_mov_ps(_mm512_mask_mov_ps(s, above, k1), below, k0);
      } else if (rt.kind == RowTail::kHardSwish) {
        s = _mm512_mul_ps(s, _mm512_max_ps(k2, _mm512_min_ps(k3, _mm512_add_ps(_mm512_mul_ps(s, k0), k1))));
      }
      _mm512_mask_storeu_ps(y + (ow + q) * C + c + 16 * v, mask, s);
    }
  }
}

// NC output columns from ow of NV channel vectors from channel c (cx within the padded rows, channel pitch G; NV = 1:
// the 16 channels under `mask`): each tap's weights loaded once for all NC columns, NC * NV sums in flight.
template <int NC, int NV>
__attribute__((target("avx512f"), always_inline)) inline void Columns(const NhwcDepthwise& d, const float* const* rows,
                                                                      const float* wg, int64_t ow, int64_t c,
                                                                      int64_t cx, __mmask16 mask, const RowTail& rt,
                                                                      float* y) {
  constexpr int64_t G = kGroup;
  const int64_t C = d.C, step = d.sw * G;
  (void)C;
  __m512 acc[NC * NV];
  {  // the first tap's products
    const float* row = rows[0] + ow * step + cx;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512 w = _mm512_maskz_loadu_ps(mask, wg + cx + 16 * v);
#pragma GCC unroll 8
      for (int q = 0; q < NC; ++q)
        acc[q * NV + v] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + q * step + 16 * v), w);
    }
  }
  for (int64_t i = 0; i < d.kh; ++i) {
    const float* row = rows[i] + ow * step + cx;
    for (int64_t j = i == 0 ? 1 : 0; j < d.kw; ++j) {
      const float* x = row + j * G;
      const float* wt = wg + (i * d.kw + j) * G + cx;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const __m512 w = _mm512_maskz_loadu_ps(mask, wt + 16 * v);
#pragma GCC unroll 8
        for (int q = 0; q < NC; ++q)
          acc[q * NV + v] =
              _mm512_add_ps(acc[q * NV + v], _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + q * step + 16 * v), w));
      }
    }
  }
  Store<NC, NV>(d, acc, ow, c, mask, rt, y);
}

// Stride 1, KW taps a row: each input column loaded once per kernel row and multiplied into every output column
// that reads it; an output's products still arrive tap by tap in order (column k reaches output k - j at tap j).
template <int KW, int NC, int NV>
__attribute__((target("avx512f"), always_inline)) inline void Slide(const NhwcDepthwise& d, const float* const* rows,
                                                                    const float* wg, int64_t ow, int64_t c, int64_t cx,
                                                                    __mmask16 mask, const RowTail& rt, float* y) {
  constexpr int64_t G = kGroup;
  __m512 acc[NC * NV];
  for (int64_t i = 0; i < d.kh; ++i) {
    const float* row = rows[i] + ow * G + cx;
    const float* wt = wg + i * KW * G + cx;
    __m512 w[KW][NV];
#pragma GCC unroll 8
    for (int j = 0; j < KW; ++j)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) w[j][v] = _mm512_maskz_loadu_ps(mask, wt + j * G + 16 * v);
#pragma GCC unroll 16
    for (int k = 0; k < NC + KW - 1; ++k) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const __m512 x = _mm512_maskz_loadu_ps(mask, row + k * G + 16 * v);
#pragma GCC unroll 8
        for (int j = 0; j < KW; ++j) {
          const int q = k - j;
          if (q < 0 || q >= NC) continue;
          const __m512 p = _mm512_mul_ps(x, w[j][v]);
          acc[q * NV + v] = i == 0 && j == 0 ? p : _mm512_add_ps(acc[q * NV + v], p);
        }
      }
    }
  }
  Store<NC, NV>(d, acc, ow, c, mask, rt, y);
}

template <int NC, int NV>
__attribute__((target("avx512f"), always_inline)) inline void Block(const NhwcDepthwise& d, const float* const* rows,
                                                                    const float* wg, int64_t ow, int64_t c, int64_t cx,
                                                                    __mmask16 mask, const RowTail& rt, float* y) {
  if (d.sw == 1 && d.kw == 3) return Slide<3, NC, NV>(d, rows, wg, ow, c, cx, mask, rt, y);
  if (d.sw == 1 && d.kw == 5) return Slide<5, NC, NV>(d, rows, wg, ow, c, cx, mask, rt, y);
  Columns<NC, NV>(d, rows, wg, ow, c, cx, mask, rt, y);
}

// All output columns of NV channel vectors from channel c.
template <int NV>
__attribute__((target("avx512f"))) void ColumnsOfRow(const NhwcDepthwise& d, const float* const* rows, const float* wg,
                                                     int64_t c, int64_t cx, __mmask16 mask, const RowTail& rt,
                                                     float* y) {
  constexpr int kWide = NV == 1 ? 8 : 4;
  int64_t ow = 0;
  for (; ow + kWide <= d.OW; ow += kWide) Block<kWide, NV>(d, rows, wg, ow, c, cx, mask, rt, y);
  if (kWide == 8 && ow + 4 <= d.OW) Block<4, NV>(d, rows, wg, ow, c, cx, mask, rt, y), ow += 4;
  switch (d.OW - ow) {
    case 3: Block<3, NV>(d, rows, wg, ow, c, cx, mask, rt, y); break;
    case 2: Block<2, NV>(d, rows, wg, ow, c, cx, mask, rt, y); break;
    case 1: Block<1, NV>(d, rows, wg, ow, c, cx, mask, rt, y); break;
    default: break;
  }
}

// One output row of channels [c0, c0 + G).
__attribute__((target("avx512f"))) void RowAvx512(const NhwcDepthwise& d, const float* const* rows, const float* wg,
                                                  int64_t c0, int64_t G, const RowTail& rt, float* y) {
  const __mmask16 all = 0xFFFF;
  int64_t cx = 0;
  for (; cx + 32 <= G; cx += 32) ColumnsOfRow<2>(d, rows, wg, c0 + cx, cx, all, rt, y);
  if (cx + 16 <= G) ColumnsOfRow<1>(d, rows, wg, c0 + cx, cx, all, rt, y), cx += 16;
  if (cx < G) ColumnsOfRow<1>(d, rows, wg, c0 + cx, cx, static_cast<__mmask16>((1u << (G - cx)) - 1u), rt, y);
}
#endif

}  // namespace

void DepthwiseNhwc(const NhwcDepthwise& d, int threads) {
  if (d.N * d.OH == 0 || d.C == 0) return;
  const int64_t Wp = std::max(d.pl + d.W, (d.OW - 1) * d.sw + d.kw);
  const std::vector<float> zeros(static_cast<size_t>(Wp * kGroup), 0.0f);
  const RowTail rt(d.tail);
#if NPU_EP_X86
  const bool wide = ActiveIsa() >= Isa::kAvx512;
#else
  const bool wide = false;
#endif
  const int64_t groups = (d.C + kGroup - 1) / kGroup;
  ParallelFor(ThreadsFor(threads, d.N * d.OH * d.OW * d.C * d.kh * d.kw), d.N * groups, [&](int64_t t) {
    static thread_local std::vector<float> ring;  // grown, never shrunk
    static thread_local std::vector<float> taps_of_group;  // the group's weights [kh * kw, kGroup]
    if (ring.size() < static_cast<size_t>(d.kh * Wp * kGroup)) ring.resize(static_cast<size_t>(d.kh * Wp * kGroup));
    const int64_t n = t / groups, c0 = t % groups * kGroup, G = std::min(kGroup, d.C - c0);
    taps_of_group.assign(static_cast<size_t>(d.kh * d.kw * kGroup), 0.0f);
    for (int64_t k = 0; k < d.kh * d.kw; ++k)
      std::copy(d.w + k * d.C + c0, d.w + k * d.C + c0 + G, taps_of_group.data() + k * kGroup);
    PaddedRows padded(d, n, c0, G, Wp, ring.data(), zeros.data());
    const float* taps[kNhwcMaxKernel];
    for (int64_t oh = 0; oh < d.OH; ++oh) {
      for (int64_t i = 0; i < d.kh; ++i) taps[i] = padded.Row(oh * d.sh - d.pt + i);
      float* y = d.y + (n * d.OH + oh) * d.OW * d.C;
#if NPU_EP_X86
      if (wide)
        RowAvx512(d, taps, taps_of_group.data(), c0, G, rt, y);
      else
#endif
        RowScalar(d, taps, c0, G, y);
      (void)wide;
      if (rt.kind == RowTail::kOther || (!wide && d.tail.n > 0))
        for (int64_t ow = 0; ow < d.OW; ++ow) ApplyTail(d.tail, y + ow * d.C + c0, G);
    }
  });
}

void PointwiseNhwc(const float* x, int64_t P, int64_t C, const float* packed, int64_t M, const float* bias,
                   const ConvTail& tail, float* y, int threads) {
  // pixel blocks so that the tail runs on each block's outputs while they are in cache
  const int64_t block = std::max<int64_t>(64, ((int64_t{1} << 15) / std::max<int64_t>(1, M) + 15) / 16 * 16);
  const int64_t blocks = (P + block - 1) / block;
  const int inner = ThreadsFor(threads, P * C * M) > 1 && blocks < 2 * threads ? threads : 1;
  ParallelFor(inner > 1 ? 1 : ThreadsFor(threads, P * C * M), blocks, [&](int64_t b) {
    const int64_t p0 = b * block, rows = std::min(block, P - p0);
    const PackedSgemmArgs g{x + p0 * C, rows, C, C, packed, M, y + p0 * M, M, bias, false};
    PackedSgemm(g, inner, nullptr, nullptr);
    if (tail.n > 0) ApplyTail(tail, y + p0 * M, rows * M);
  });
}

}  // namespace npu_ep::kern
