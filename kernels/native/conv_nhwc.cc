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
#include <optional>
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

// A tail applied to each output vector before its store: one clip or one of HardSwish's two programs, the register
// interpreter's operations in its order (conv_tail.h, conv_tail_registers.cc); kOther: ApplyTail on the stored row.
struct RowTail {
  enum Kind { kNone, kClip, kHardSwish, kHardSwishDiv, kOther } kind = kNone;
  // clip {lo, hi}; HardSwish {a, b, lo, hi}: v * max(lo, min(hi, v * a + b)); HardSwishDiv {b, lo, hi, d}: the
  // program save; add b; clip lo hi (lo <= hi); mul_saved; div d, i.e. v * max(lo, min(hi, v + b)) / d (PicoDet's)
  float c[4] = {};
  explicit RowTail(const ConvTail& t) {
    namespace tc = tail_code;
    if (t.n == 0) return;
    if (t.n == 1 && t.codes[0] == kTailClip && t.channel_consts == nullptr) {
      kind = kClip, c[0] = t.consts[0], c[1] = t.consts[1];
    } else if (HardSwishTail(t, c)) {
      kind = kHardSwish;
    } else if (t.n == 5 && t.channel_consts == nullptr && t.codes[0] == tc::kSave && t.codes[1] == tc::kAdd &&
               t.codes[2] == tc::kClip && t.codes[3] == tc::kMulSaved && t.codes[4] == tc::kDiv &&
               t.consts[4] <= t.consts[5]) {
      kind = kHardSwishDiv, c[0] = t.consts[2], c[1] = t.consts[4], c[2] = t.consts[5], c[3] = t.consts[8];
    } else {
      kind = kOther;
    }
  }
};

// Channels a depthwise task takes (its output rows are cut in blocks too, so that small-channel maps split).
constexpr int64_t kGroup = kNhwcGroup;
constexpr int64_t kCopyPitch = 256;  // an NHWC input with this many channels or more is read from compact rows

// The kh input rows one output row reads, channel c0 at each row's column 0, `pitch` floats between columns; ok[i]:
// row i is inside the input (else its taps read zeros, as the reference's padding: on AVX-512, p[i] is a row of
// zeros then). padded: every column a tap reads, also left and right of the input, is there (zeros outside it).
struct Rows {
  const float* p[kNhwcMaxKernel];
  bool ok[kNhwcMaxKernel];
  int64_t pitch;
  bool padded;
};

// The columns left and right of the input that the taps read (the reference's padding).
int64_t PadLeft(const NhwcDepthwise& d) { return std::max<int64_t>(0, d.pl); }
int64_t PadRight(const NhwcDepthwise& d) { return std::max<int64_t>(0, (d.OW - 1) * d.sw - d.pl + d.kw - d.W); }

// The input rows of channels [c0, c0 + G) made compact (pitch Gp, G rounded up to 16, the lanes past G zero) in a ring
// of kh rows, each input row made once while the output rows that read it run: an NCHW input's rows (layout_in NCHW)
// gathered into the lanes, or an NHWC input's rows copied: read in place, a column pitch of 256 floats or more maps a
// block's columns, its weights and its outputs onto a few cache sets, and at unit width stride the copy (one load and
// store per input vector, kw taps reading it) costs less than the checked border blocks it spares (at stride 2 it
// does not). Each ring row holds the padding columns too (zeros, written once), so that no tap's column needs a check.
struct CompactRows {
  const NhwcDepthwise& d;
  int64_t n, c0, G, Gp, lead, cols;  // lead: zero columns left of the input; cols: the row's columns, padding included
  float* ring;
  bool wide;
  int64_t held[kNhwcMaxKernel];  // the input row each ring slot holds, -1: none

  CompactRows(const NhwcDepthwise& dw, int64_t image, int64_t first, int64_t group, float* r, bool avx512)
      : d(dw), n(image), c0(first), G(group), Gp((group + 15) / 16 * 16), lead(PadLeft(dw)),
        cols(lead + dw.W + PadRight(dw)), ring(r), wide(avx512) {
    std::fill(held, held + kNhwcMaxKernel, int64_t{-1});
    for (int64_t slot = 0; slot < d.kh; ++slot) {
      float* row = ring + slot * cols * Gp;
      std::fill(row, row + lead * Gp, 0.0f);
      std::fill(row + (lead + d.W) * Gp, row + cols * Gp, 0.0f);
    }
  }

  // the ring's floats for a kernel of kh rows
  static size_t Floats(const NhwcDepthwise& d) {
    return static_cast<size_t>(d.kh * (PadLeft(d) + d.W + PadRight(d)) * kNhwcGroup);
  }

  const float* Row(int64_t ih);
};

#if NPU_EP_X86
// r[i] = column i of the 16 x 16 block r (rows in, columns out).
__attribute__((target("avx512f"), always_inline)) inline void Transpose16(__m512* r) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2)
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c)), r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e)), r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88), t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i)
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88), r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
}

// Row ih of channels [c0, c0 + G) of an NCHW x into dst [W, Gp]: 16 x 16 blocks transposed in registers.
__attribute__((target("avx512f"))) void GatherAvx512(const NhwcDepthwise& d, int64_t n, int64_t c0, int64_t G,
                                                     int64_t Gp, int64_t ih, float* dst) {
  const int64_t plane = d.H * d.W;
  for (int64_t cb = 0; cb < Gp; cb += 16) {
    const int64_t nc = std::min<int64_t>(16, G - cb);
    const float* x = d.x + (n * d.C + c0 + cb) * plane + ih * d.W;
    for (int64_t iw = 0; iw < d.W; iw += 16) {
      const int64_t left = d.W - iw;
      const __mmask16 m = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
      __m512 r[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) r[c] = c < nc ? _mm512_maskz_loadu_ps(m, x + c * plane + iw) : _mm512_setzero_ps();
      Transpose16(r);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k)
        if (k < left) _mm512_storeu_ps(dst + (iw + k) * Gp + cb, r[k]);
    }
  }
}

// W columns of G channels (column pitch C) into dst [W, Gp], the lanes past G zero.
__attribute__((target("avx512f"))) void CopyAvx512(const float* x, int64_t C, int64_t W, int64_t G, int64_t Gp,
                                                   float* dst) {
  for (int64_t iw = 0; iw < W; ++iw)
    for (int64_t c = 0; c < Gp; c += 16) {
      const __mmask16 m = static_cast<__mmask16>(G - c >= 16 ? 0xFFFF : (1u << (G - c)) - 1u);
      _mm512_storeu_ps(dst + iw * Gp + c, _mm512_maskz_loadu_ps(m, x + iw * C + c));
    }
}
#endif

const float* CompactRows::Row(int64_t ih) {
  int64_t slot = 0;
  while (slot < d.kh && held[slot] != ih) ++slot;  // a row already held (the division only for a new row)
  if (slot == d.kh) slot = ih % d.kh;
  float* r = ring + (slot * cols + lead) * Gp;
  if (held[slot] != ih) {
    held[slot] = ih;
    if (!d.nchw_in) {
      const float* x = d.x + ((n * d.H + ih) * d.W) * d.C + c0;
#if NPU_EP_X86
      if (wide) {
        CopyAvx512(x, d.C, d.W, G, Gp, r);
        return r;
      }
#endif
      for (int64_t iw = 0; iw < d.W; ++iw)
        for (int64_t c = 0; c < Gp; ++c) r[iw * Gp + c] = c < G ? x[iw * d.C + c] : 0.0f;
      return r;
    }
#if NPU_EP_X86
    if (wide) {
      GatherAvx512(d, n, c0, G, Gp, ih, r);
      return r;
    }
#endif
    const float* x = d.x + ((n * d.C + c0) * d.H + ih) * d.W;
    for (int64_t c = 0; c < Gp; ++c, x += d.H * d.W)
      for (int64_t iw = 0; iw < d.W; ++iw) r[iw * Gp + c] = c < G ? x[iw] : 0.0f;
  }
  return r;
}

// One output row of channels [c0, c0 + G): each tap's input read where it is (padding read as zeros).
void RowScalar(const NhwcDepthwise& d, const Rows& r, int64_t c0, int64_t G, float* y) {
  for (int64_t ow = 0; ow < d.OW; ++ow) {
    for (int64_t c = 0; c < G; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d.kh; ++i)
        for (int64_t j = 0; j < d.kw; ++j) {
          const int64_t iw = ow * d.sw - d.pl + j;
          const float x = r.ok[i] && iw >= 0 && iw < d.W ? r.p[i][iw * r.pitch + c] : 0.0f;
          const float p = x * d.w[(c0 / kGroup * d.kh * d.kw + i * d.kw + j) * kGroup + c];
          acc = i == 0 && j == 0 ? p : acc + p;
        }
      y[ow * d.C + c0 + c] = d.bias != nullptr ? acc + d.bias[c0 + c] : acc;
    }
  }
}

#if NPU_EP_X86
// 16 floats at p, those under mask (kFull: all 16, unmasked: a masked load or store costs more than a plain one).
template <bool kFull>
__attribute__((target("avx512f"), always_inline)) inline __m512 Load(__mmask16 mask, const float* p) {
  return kFull ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
}

// acc + x * w, the product rounded first (no fusing), as one asm pair: from the intrinsics GCC computes a register
// block's products ahead of their sums and spills them and the accumulators.
__attribute__((target("avx512f"), always_inline)) inline void MulAdd(__m512& acc, __m512 x, __m512 w) {
  __m512 p;
  asm("vmulps %[w], %[x], %[p]\n\tvaddps %[p], %[acc], %[acc]"
      : [acc] "+v"(acc), [p] "=&v"(p)
      : [x] "v"(x), [w] "v"(w));
}

// The NC x NV sums of output columns from ow, channels from c: + bias, the register tail, stored.
template <int NC, int NV, bool kFull>
__attribute__((target("avx512f"), always_inline)) inline void Store(const NhwcDepthwise& d, const __m512* acc,
                                                                    int64_t ow, int64_t c, __mmask16 mask,
                                                                    const RowTail& rt, float* y) {
  const int64_t C = d.C;
  const __m512 k0 = _mm512_set1_ps(rt.c[0]), k1 = _mm512_set1_ps(rt.c[1]);
  const __m512 k2 = _mm512_set1_ps(rt.c[2]), k3 = _mm512_set1_ps(rt.c[3]);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512 b = d.bias != nullptr ? Load<kFull>(mask, d.bias + c + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) {
      __m512 s = d.bias != nullptr ? _mm512_add_ps(acc[q * NV + v], b) : acc[q * NV + v];
      if (rt.kind == RowTail::kClip) {  // lo wins, also when lo > hi; NaN stays
        const __mmask16 below = _mm512_cmp_ps_mask(s, k0, _CMP_LT_OQ);
        const __mmask16 above = _mm512_cmp_ps_mask(s, k1, _CMP_GT_OQ);
        s = _mm512_mask_mov_ps(_mm512_mask_mov_ps(s, above, k1), below, k0);
      } else if (rt.kind == RowTail::kHardSwish) {
        s = _mm512_mul_ps(s, _mm512_max_ps(k2, _mm512_min_ps(k3, _mm512_add_ps(_mm512_mul_ps(s, k0), k1))));
      } else if (rt.kind == RowTail::kHardSwishDiv) {
        s = _mm512_div_ps(_mm512_mul_ps(s, _mm512_max_ps(k1, _mm512_min_ps(k2, _mm512_add_ps(s, k0)))), k3);
      }
      if (kFull)
        _mm512_storeu_ps(y + (ow + q) * C + c + 16 * v, s);
      else
        _mm512_mask_storeu_ps(y + (ow + q) * C + c + 16 * v, mask, s);
    }
  }
}

// NC output columns from ow of NV channel vectors (channel c of the output, cx of the rows; NV = 1: the 16 channels
// under `mask`), KW taps a row at width stride S (KW = 0: d.kw taps at d.sw, each tap's columns loaded for it): each
// input column loaded once per kernel row and multiplied into every output column that reads it, the weights loaded
// once for all NC columns. An output's products still arrive tap by tap in order (column k reaches output q at tap
// k - q * S). kChecked: columns outside the input read zeros (rows outside it are a row of zeros). The weights are
// always loaded whole (a group's missing channels are zeros).
template <int KW, int S, int NC, int NV, bool kChecked, bool kFull>
__attribute__((target("avx512f"), always_inline)) inline void Block(const NhwcDepthwise& d, const Rows& r,
                                                                    const float* wc, int64_t ow, int64_t c, int64_t cx,
                                                                    __mmask16 mask, const RowTail& rt, float* y) {
  const int64_t pitch = r.pitch, col0 = ow * (S > 0 ? S : d.sw) - d.pl;
  auto outside = [&](int64_t col) { return kChecked && static_cast<uint64_t>(col) >= static_cast<uint64_t>(d.W); };
  auto load = [&](int64_t i, int64_t col, int v) {
    return outside(col) ? _mm512_setzero_ps() : Load<kFull>(mask, r.p[i] + col * pitch + cx + 16 * v);
  };
  __m512 acc[NC * NV];
  if constexpr (KW == 0) {
    const int64_t sw = d.sw, kw = d.kw;
    for (int64_t i = 0; i < d.kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        const float* wt = wc + (i * kw + j) * kGroup;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          const __m512 w = _mm512_loadu_ps(wt + 16 * v);
#pragma GCC unroll 8
          for (int q = 0; q < NC; ++q) {
            if (i == 0 && j == 0)
              acc[q * NV + v] = _mm512_mul_ps(load(i, col0 + q * sw + j, v), w);
            else
              MulAdd(acc[q * NV + v], load(i, col0 + q * sw + j, v), w);
          }
        }
      }
  } else {
    for (int64_t i = 0; i < d.kh; ++i) {
      __m512 w[KW][NV];
#pragma GCC unroll 8
      for (int j = 0; j < KW; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) w[j][v] = _mm512_loadu_ps(wc + (i * KW + j) * kGroup + 16 * v);
      const float* xp = r.p[i] + col0 * pitch + cx;  // a running pointer: one add a column, no offset per column
#pragma GCC unroll 32
      for (int k = 0; k < (NC - 1) * S + KW; ++k, xp += pitch) {
        const bool zero = outside(col0 + k);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          const __m512 x = zero ? _mm512_setzero_ps() : Load<kFull>(mask, xp + 16 * v);
#pragma GCC unroll 8
          for (int j = 0; j < KW; ++j) {
            if ((k - j) % S != 0) continue;
            const int q = (k - j) / S;
            if (k < j || q >= NC) continue;
            if (i == 0 && j == 0)
              acc[q * NV + v] = _mm512_mul_ps(x, w[j][v]);
            else
              MulAdd(acc[q * NV + v], x, w[j][v]);
          }
        }
      }
    }
  }
  Store<NC, NV, kFull>(d, acc, ow, c, mask, rt, y);
}

// Output columns [ow0, ow1) of NV channel vectors, in blocks of 8 columns, then one of the rest.
template <int KW, int S, int NV, bool kChecked, bool kFull>
__attribute__((target("avx512f"))) void Span(const NhwcDepthwise& d, const Rows& r, const float* wc, int64_t ow0,
                                             int64_t ow1, int64_t c, int64_t cx, __mmask16 mask, const RowTail& rt,
                                             float* y) {
  int64_t ow = ow0;
  for (; ow + 8 <= ow1; ow += 8) Block<KW, S, 8, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y);
  switch (ow1 - ow) {
    case 7: Block<KW, S, 7, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 6: Block<KW, S, 6, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 5: Block<KW, S, 5, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 4: Block<KW, S, 4, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 3: Block<KW, S, 3, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 2: Block<KW, S, 2, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    case 1: Block<KW, S, 1, NV, kChecked, kFull>(d, r, wc, ow, c, cx, mask, rt, y); break;
    default: break;
  }
}

// All output columns of NV channel vectors: the columns whose taps all fall inside the input unchecked (all of them in
// padded rows; none in a row of 16 columns or fewer, whose narrow border blocks cost more than checking its columns).
template <int KW, int S, int NV, bool kFull>
__attribute__((target("avx512f"))) void ColumnsOfRow(const NhwcDepthwise& d, const Rows& r, int64_t c, int64_t cx,
                                                     __mmask16 mask, const RowTail& rt, float* y) {
  const float* wc = d.w + (c - cx) / kGroup * d.kh * d.kw * kGroup + cx;  // the group's taps, from lane cx
  int64_t lo = std::min(d.OW, (d.pl + d.sw - 1) / d.sw);
  int64_t hi = d.W - d.kw + d.pl >= 0 ? std::min(d.OW, (d.W - d.kw + d.pl) / d.sw + 1) : 0;
  if (r.padded) {
    lo = 0, hi = d.OW;
  } else if (hi <= lo || d.OW <= 16) {
    lo = hi = d.OW;
  }
  Span<KW, S, NV, true, kFull>(d, r, wc, 0, lo, c, cx, mask, rt, y);
  Span<KW, S, NV, false, kFull>(d, r, wc, lo, hi, c, cx, mask, rt, y);
  Span<KW, S, NV, true, kFull>(d, r, wc, std::max(lo, hi), d.OW, c, cx, mask, rt, y);
}

// One output row of channels [c0, c0 + G).
template <int KW, int S>
__attribute__((target("avx512f"))) void RowOf(const NhwcDepthwise& d, const Rows& r, int64_t c0, int64_t G,
                                              const RowTail& rt, float* y) {
  const __mmask16 all = 0xFFFF;
  int64_t cx = 0;
  for (; cx + 32 <= G; cx += 32) ColumnsOfRow<KW, S, 2, true>(d, r, c0 + cx, cx, all, rt, y);
  for (; cx + 16 <= G; cx += 16) ColumnsOfRow<KW, S, 1, true>(d, r, c0 + cx, cx, all, rt, y);
  if (cx < G) ColumnsOfRow<KW, S, 1, false>(d, r, c0 + cx, cx, static_cast<__mmask16>((1u << (G - cx)) - 1u), rt, y);
}

using RowFn = void (*)(const NhwcDepthwise&, const Rows&, int64_t, int64_t, const RowTail&, float*);

RowFn RowAvx512(const NhwcDepthwise& d) {
  if (d.kw == 3 && d.sw == 1) return RowOf<3, 1>;
  if (d.kw == 3 && d.sw == 2) return RowOf<3, 2>;
  if (d.kw == 5 && d.sw == 1) return RowOf<5, 1>;
  if (d.kw == 5 && d.sw == 2) return RowOf<5, 2>;
  return RowOf<0, 0>;
}
#endif

}  // namespace

void DepthwiseNhwc(const NhwcDepthwise& d, int threads) {
  if (d.N * d.OH == 0 || d.C == 0) return;
  const RowTail rt(d.tail);
#if NPU_EP_X86
  const bool wide = ActiveIsa() >= Isa::kAvx512;
  const RowFn row_avx512 = wide ? RowAvx512(d) : nullptr;
#else
  const bool wide = false;
#endif
  const int64_t groups = (d.C + kGroup - 1) / kGroup;
  // on several threads the output rows are cut in blocks so that about 8 tasks share the work (the bits do not depend
  // on the split; a block gathers or copies its first kh - 1 input rows again); from 2^17 multiply-adds on, as the
  // NCHW depthwise kernels: the pool's general threshold (2^20) left PP-LCNet's 28 x 28 and 7 x 7 maps on one thread
  const int64_t work = d.N * d.OH * d.OW * d.C * d.kh * d.kw;
  const int used = work < (int64_t{1} << 17) ? 1 : threads;
  const int64_t blocks = used > 1 ? std::min(d.OH, std::max<int64_t>(1, 8 / (d.N * groups))) : 1;
  const int64_t rows_per = (d.OH + blocks - 1) / blocks;
  ParallelFor(used, d.N * groups * blocks, [&](int64_t t) {
    static thread_local std::vector<float> ring, zeros;  // grown, never shrunk (zeros: never written)
    const int64_t n = t / (groups * blocks), c0 = t / blocks % groups * kGroup, G = std::min(kGroup, d.C - c0);
    const int64_t oh0 = t % blocks * rows_per, oh1 = std::min(d.OH, oh0 + rows_per);
    std::optional<CompactRows> compact;
    if (d.nchw_in || d.C >= kCopyPitch || (wide && d.sw == 1 && d.C >= kGroup)) {
      const size_t need = CompactRows::Floats(d) + 16;
      if (ring.size() < need) ring.resize(need);
      // 64-byte aligned: a column of channels is whole cache lines (a split line costs two loads)
      const auto at = reinterpret_cast<uintptr_t>(ring.data());
      compact.emplace(d, n, c0, G, ring.data() + (-at / sizeof(float) & 15), wide);
    }
    Rows r;
    r.pitch = compact ? compact->Gp : d.C;
    r.padded = compact.has_value();
    // the rows above and below the input read as a row of zeros (the register blocks then check columns only, and
    // none in compact rows)
    const float* zero_row = d.x;
    if (wide) {
      const int64_t lead = PadLeft(d), cols = lead + d.W + PadRight(d);
      const size_t need = static_cast<size_t>(cols * r.pitch + 16);
      if (zeros.size() < need) zeros.resize(need, 0.0f);
      zero_row = zeros.data() + lead * r.pitch;
    }
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t i = 0; i < d.kh; ++i) {
        const int64_t ih = oh * d.sh - d.pt + i;
        r.ok[i] = ih >= 0 && ih < d.H;
        r.p[i] = !r.ok[i] ? zero_row : compact ? compact->Row(ih) : d.x + ((n * d.H + ih) * d.W) * d.C + c0;
      }
      float* y = d.y + (n * d.OH + oh) * d.OW * d.C;
#if NPU_EP_X86
      if (wide)
        row_avx512(d, r, c0, G, rt, y);
      else
#endif
        RowScalar(d, r, c0, G, y);
      if (rt.kind == RowTail::kOther || (!wide && d.tail.n > 0)) {
        if (G == d.C)  // the task has every channel: its output row is one contiguous run
          ApplyTail(d.tail, y, d.OW * d.C);
        else
          for (int64_t ow = 0; ow < d.OW; ++ow) ApplyTail(d.tail, y + ow * d.C + c0, G);
      }
    }
  });
}

void PointwiseNhwc(const float* x, int64_t P, int64_t C, const float* packed, int64_t M, const float* bias,
                   const ConvTail& tail, float* y, int threads) {
  // tasks: blocks of pixels (about 128 KiB of outputs, so the tail runs on a block's outputs while they are in
  // cache), each applying the tail to its own outputs. On several threads a multiple of the thread count of blocks
  // as even as whole 8-row tiles allow (blocks of 256, 256, 256 and 16 pixels left one thread 2/3 of a 28 x 28
  // map), and under 64 pixels a thread, groups of column panels instead (each thread then reads its part of the
  // weights only). The split changes no sum.
  const int used = ThreadsFor(threads, P * C * M);
  const int64_t panels = (M + kSgemmPanel - 1) / kSgemmPanel;
  const int64_t target = std::max<int64_t>(64, ((int64_t{1} << 15) / std::max<int64_t>(1, M) + 15) / 16 * 16);
  int64_t blocks = (P + target - 1) / target, col_groups = 1;
  if (used > 1) {
    if (P < 64 * used) col_groups = std::min<int64_t>(panels, used);
    if (col_groups < used) blocks = (blocks + used - 1) / used * used;
  }
  const int64_t rows = used > 1 ? ((P + blocks - 1) / blocks + 7) / 8 * 8 : target;
  blocks = (P + rows - 1) / rows;
  const int64_t per_group = (panels + col_groups - 1) / col_groups * kSgemmPanel;
  ParallelFor(used, blocks * col_groups, [&](int64_t t) {
    const int64_t p0 = t / col_groups * rows, n = std::min(rows, P - p0);
    const int64_t q0 = t % col_groups * per_group, q1 = std::min(M, q0 + per_group);
    if (n <= 0 || q0 >= q1) return;
    // panel p of the packed weights starts at p * C * kSgemmPanel floats, so columns from q0 start at q0 * C
    const PackedSgemmArgs g{
        x + p0 * C, n, C, C, packed + q0 * C, q1 - q0, y + p0 * M + q0, M, bias != nullptr ? bias + q0 : nullptr,
        false};
    PackedSgemm(g, 1, nullptr, nullptr);
    if (tail.n == 0) return;
    if (q1 - q0 == M) return ApplyTail(tail, y + p0 * M, n * M);
    for (int64_t r = 0; r < n; ++r) ApplyTail(tail, y + (p0 + r) * M + q0, q1 - q0);
  });
}

}  // namespace npu_ep::kern
