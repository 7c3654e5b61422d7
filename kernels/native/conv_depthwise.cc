// Native depthwise float convolution (group == C), computed directly per output plane.
//
// No fused multiply-add anywhere in this file (fp-contract off): the kernels do the reference's float32
// operations in the reference's order.
#include "conv.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu.h"
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

namespace {

// dst[o] = src[o * stride] * w (first tap) or dst[o] + src[o * stride] * w, for o in [0, n).
void MulAddScalar(float* dst, const float* src, int64_t stride, int64_t n, float w, bool first) {
  if (first)
    for (int64_t o = 0; o < n; ++o) dst[o] = src[o * stride] * w;
  else
    for (int64_t o = 0; o < n; ++o) dst[o] = dst[o] + src[o * stride] * w;
}

#if NPU_EP_X86
__attribute__((target("avx2"))) void MulAddAvx2(float* dst, const float* src, int64_t n, float w, bool first) {
  const __m256 wv = _mm256_set1_ps(w);
  int64_t o = 0;
  for (; o + 8 <= n; o += 8) {
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(src + o), wv);
    if (!first) p = _mm256_add_ps(_mm256_loadu_ps(dst + o), p);
    _mm256_storeu_ps(dst + o, p);
  }
  MulAddScalar(dst + o, src + o, 1, n - o, w, first);
}

__attribute__((target("avx512f"))) void MulAddAvx512(float* dst, const float* src, int64_t n, float w, bool first) {
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t o = 0; o < n; o += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - o >= 16 ? 0xFFFF : (1u << (n - o)) - 1);
    __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + o), wv);
    if (!first) p = _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + o), p);
    _mm512_mask_storeu_ps(dst + o, k, p);
  }
}
#endif

#if NPU_EP_X86
// Stride 2: 32 source floats per 16 outputs, the even ones picked by a permute (the loads are masked to the
// 2n - 1 source elements the outputs read).
__attribute__((target("avx512f"))) void MulAddStride2Avx512(float* dst, const float* src, int64_t n, float w,
                                                            bool first) {
  const __m512 wv = _mm512_set1_ps(w);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const int64_t src_n = 2 * n - 1;
  for (int64_t o = 0; o < n; o += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - o >= 16 ? 0xFFFF : (1u << (n - o)) - 1);
    const int64_t left = src_n - 2 * o;  // source elements from src + 2o on
    const __mmask16 k0 = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    const __mmask16 k1 = static_cast<__mmask16>(left >= 32 ? 0xFFFF : left <= 16 ? 0 : (1u << (left - 16)) - 1);
    const __m512 v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(k0, src + 2 * o), even,
                                            _mm512_maskz_loadu_ps(k1, src + 2 * o + 16));
    __m512 p = _mm512_mul_ps(v, wv);
    if (!first) p = _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + o), p);
    _mm512_mask_storeu_ps(dst + o, k, p);
  }
}
#endif

void MulAdd(float* dst, const float* src, int64_t stride, int64_t n, float w, bool first) {
  if (n <= 0) return;
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (stride == 1) {
    if (isa >= Isa::kAvx512) return MulAddAvx512(dst, src, n, w, first);
    if (isa >= Isa::kAvx2) return MulAddAvx2(dst, src, n, w, first);
  }
  if (stride == 2 && isa >= Isa::kAvx512) return MulAddStride2Avx512(dst, src, n, w, first);
#endif
  MulAddScalar(dst, src, stride, n, w, first);
}

// A run of padded taps: dst = 0 * w (first) or dst + 0 * w (kept literally: signed zeros, Inf/NaN weights).
void MulAddZero(float* dst, int64_t n, float w, bool first) {
  const float z = 0.0f * w;
  for (int64_t o = 0; o < n; ++o) dst[o] = first ? z : dst[o] + z;
}

#if NPU_EP_X86
// One padded plane's outputs, 32 columns at a time in two registers with every tap summed there (the taps in the
// reference's order, product then sum, never fused), the bias added last: the per-tap passes over a plane-sized
// accumulator (load, add, store 25 times for a 5x5 kernel) become one store per output, and two independent sums
// hide part of the add latency a single running sum would wait on. The plane is held as s.sw column phases
// [sw, Hp, Wq] (phase p: padded columns p, p + sw, ...; one phase at unit width stride), so a tap (i, j) reads
// phase (j * dw) % sw from column (j * dw) / sw on, unit-stride whatever the width stride.
__attribute__((target("avx512f"))) void DepthwiseRowsAvx512(const ConvShape& s, const float* xp, int64_t Hp, int64_t Wq,
                                                            const float* taps, const float* bias, float* out) {
  const int64_t kh = s.kh, kw = s.kw, OH = s.OH, OW = s.OW, row_step = s.dh * Wq, sh = s.sh;
  auto mask = [OW](int64_t o) {
    const int64_t left = OW - o;
    return static_cast<__mmask16>(left >= 16 ? 0xFFFF : left <= 0 ? 0 : (1u << left) - 1);
  };
  int64_t tap_off[64];  // per column tap j: its phase's offset and column ((j * dw) % sw * Hp * Wq + (j * dw) / sw)
  for (int64_t j = 0; j < kw; ++j) tap_off[j] = (j * s.dw) % s.sw * Hp * Wq + (j * s.dw) / s.sw;
  for (int64_t oh = 0; oh < OH; ++oh) {
    const float* top = xp + oh * sh * Wq;
    float* dst = out + oh * OW;
    for (int64_t o = 0; o < OW; o += 32) {
      const __mmask16 k0 = mask(o), k1 = mask(o + 16);
      if (k1 == 0) {  // 16 columns or fewer left (a small map's whole row): one register
        __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(k0, top + o), _mm512_set1_ps(taps[0]));
        for (int64_t i = 0; i < kh; ++i) {
          const float* row = top + i * row_step + o;
          for (int64_t j = i == 0 ? 1 : 0; j < kw; ++j)
            a = _mm512_add_ps(
                a, _mm512_mul_ps(_mm512_maskz_loadu_ps(k0, row + tap_off[j]), _mm512_set1_ps(taps[i * kw + j])));
        }
        if (bias != nullptr) a = _mm512_add_ps(a, _mm512_set1_ps(*bias));
        _mm512_mask_storeu_ps(dst + o, k0, a);
        continue;
      }
      const __m512 w0 = _mm512_set1_ps(taps[0]);
      __m512 a0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(k0, top + o), w0);
      __m512 a1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(k1, top + o + 16), w0);
      for (int64_t i = 0; i < kh; ++i) {
        const float* row = top + i * row_step + o;
        for (int64_t j = i == 0 ? 1 : 0; j < kw; ++j) {
          const __m512 wt = _mm512_set1_ps(taps[i * kw + j]);
          const float* src = row + tap_off[j];
          a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_maskz_loadu_ps(k0, src), wt));
          a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_maskz_loadu_ps(k1, src + 16), wt));
        }
      }
      if (bias != nullptr) {
        const __m512 b = _mm512_set1_ps(*bias);
        a0 = _mm512_add_ps(a0, b);
        a1 = _mm512_add_ps(a1, b);
      }
      _mm512_mask_storeu_ps(dst + o, k0, a0);
      _mm512_mask_storeu_ps(dst + o + 16, k1, a1);
    }
  }
}
#endif

}  // namespace

namespace {

// Stride 1: the plane is copied once into a zero-padded buffer of row pitch Wp, and each tap is ONE multiply-add
// over the whole output plane laid out with the same pitch (the columns past OW are computed and dropped), so
// the work is T long vector loops instead of T * OH short ones. Padded taps multiply the buffer's zeros, as the
// reference does.
// DepthwiseRowsAvx512 takes the plane: on AVX-512 hosts, for kernels up to 64 taps wide (its per-tap offsets).
bool RowsKernel(const ConvShape& s) {
#if NPU_EP_X86
  return ActiveIsa() >= Isa::kAvx512 && s.kw <= 64;
#else
  (void)s;
  return false;
#endif
}

// Unit width stride (any height stride), or any width stride for DepthwiseRowsAvx512: each plane is copied once
// into a zero-padded scratch (as sw column phases for DepthwiseRowsAvx512), then every tap is one multiply-add pass
// over whole rows (over all output rows at once when the height stride is 1 too). Padding taps read the scratch's
// zeros: 0 * w, as the reference adds them.
void DepthwiseFloatPadded(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                          const ConvTail& epilogue) {
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, tail = (s.kw - 1) * s.dw;
  const int64_t Wq = (Wp + s.sw - 1) / s.sw;  // a phase's columns (sw == 1: Wp)
  conv_detail::ParallelItems(threads, s.N * s.M, P * T, [&](int64_t task) {
    const int64_t n = task / s.M, m = task % s.M, c = m / mult, jm = m % mult;
    const float* plane = x + (n * s.C + c) * s.H * s.W;
    // per-thread scratch kept across planes and calls: its padding stays zero while the geometry is the same, so a
    // plane only copies its rows in (a small map's planes cost more in allocation and zeroing than in arithmetic)
    thread_local std::vector<float> xp, acc;
    thread_local int64_t geometry[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    const int64_t g[8] = {Hp, Wp, s.pt, s.pl, s.H, s.W, tail, s.sw};
    if (!std::equal(g, g + 8, geometry)) {
      xp.assign(s.sw * Hp * Wq + tail, 0.0f);
      std::copy(g, g + 8, geometry);
    }
    if (s.sw == 1) {
      for (int64_t h = 0; h < s.H; ++h) std::memcpy(&xp[(h + s.pt) * Wp + s.pl], plane + h * s.W, s.W * sizeof(float));
    } else {  // phase ph holds padded columns ph, ph + sw, ...: its first input column, then every sw-th
      for (int64_t ph = 0; ph < s.sw; ++ph) {
        const int64_t q0 = s.pl + ((ph - s.pl) % s.sw + s.sw) % s.sw;  // first padded column >= pl in phase ph
        for (int64_t h = 0; h < s.H; ++h) {
          float* dst = &xp[(ph * Hp + h + s.pt) * Wq + q0 / s.sw];
          const float* src = plane + h * s.W + q0 - s.pl;
          for (int64_t q = q0, i = 0; q < s.pl + s.W; q += s.sw, ++i) dst[i] = src[i * s.sw];
        }
      }
    }
    float* out = y + task * P;
#if NPU_EP_X86
    if (RowsKernel(s)) {
      thread_local std::vector<float> taps;
      taps.resize(T);
      for (int64_t t = 0; t < T; ++t) taps[t] = w[(c * T + t) * mult + jm];
      DepthwiseRowsAvx512(s, xp.data(), Hp, Wq, taps.data(), bias != nullptr ? bias + m : nullptr, out);
      if (epilogue.n) ApplyChannelTail(epilogue, out, P, m);
      return;
    }
#endif
    acc.resize(s.OH * Wp);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = t / s.kw, j = t % s.kw;
      const float wt = w[(c * T + t) * mult + jm];
      if (s.sh == 1) {
        MulAdd(acc.data(), xp.data() + i * s.dh * Wp + j * s.dw, 1, s.OH * Wp, wt, t == 0);
        continue;
      }
      for (int64_t oh = 0; oh < s.OH; ++oh)
        MulAdd(acc.data() + oh * Wp, xp.data() + (oh * s.sh + i * s.dh) * Wp + j * s.dw, 1, s.OW, wt, t == 0);
    }
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const float* src = acc.data() + oh * Wp;
      float* dst = out + oh * s.OW;
      if (bias != nullptr)
        for (int64_t o = 0; o < s.OW; ++o) dst[o] = src[o] + bias[m];
      else
        std::memcpy(dst, src, s.OW * sizeof(float));
    }
    if (epilogue.n) ApplyChannelTail(epilogue, out, P, m);
  });
}

#if NPU_EP_X86
// Register kernels for the common depthwise shapes (3x3 and 5x5, strides 1 and 2, no dilation) on AVX-512: a block
// of R output rows x CV vectors of 16 columns is summed in registers, each input row's vector loaded once per tap
// column and multiplied into every output row of the block that reads it, so a 3x3 kernel's input is read about
// twice per output instead of nine times. Per output the taps still go in the reference's order (row by row, then
// column by column: the block walks its input rows top down), product then sum, never fused, then + bias.
// The input rows come from a RowRing: each row once per task, zero-padded, as its sw column phases.
//
// The kernels and their row ring are compiled for AVX-512 as a whole (their lambdas too, which a function's target
// attribute does not reach); they run only where RegisterSegment found AVX-512.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl")
#endif

// Forced inlining for the register kernels' unrolled steps: GCC otherwise leaves some of a block's lambdas out of
// line, and their accumulators go through memory.
#if defined(__GNUC__) && !defined(__clang__)
#define DW_INLINE __attribute__((always_inline)) inline
#define DW_LAMBDA_INLINE __attribute__((always_inline))
#else
#define DW_INLINE inline
#define DW_LAMBDA_INLINE
#endif

// The first n of 16 lanes (none for n <= 0, all for n >= 16).
inline __mmask16 LaneMask(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1); }

// f(std::integral_constant<int, 0>) ... f(std::integral_constant<int, N - 1>): loop indices the compiler sees as
// constants, so a block's accumulators stay in registers whatever the optimization level's unrolling limits.
template <int... I, typename F>
DW_INLINE void UnrollSeq(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
DW_INLINE void Unroll(F&& f) {
  UnrollSeq(std::make_integer_sequence<int, N>{}, f);
}

// Stride-2 column phases of one input row: its even columns to `ev`, its odd ones to `od`, 32 columns a step.
void DeinterleaveAvx512(const float* src, int64_t W, float* ev, float* od) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  int64_t x = 0;
  for (; x + 32 <= W; x += 32) {  // whole steps unmasked (masked stores cost more on some hosts)
    const __m512 a = _mm512_loadu_ps(src + x), b = _mm512_loadu_ps(src + x + 16);
    _mm512_storeu_ps(ev + x / 2, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(od + x / 2, _mm512_permutex2var_ps(a, odd, b));
  }
  if (x < W) {
    const int64_t left = W - x;
    const __m512 a = _mm512_maskz_loadu_ps(LaneMask(left), src + x);
    const __m512 b = _mm512_maskz_loadu_ps(LaneMask(left - 16), src + x + 16);
    _mm512_mask_storeu_ps(ev + x / 2, LaneMask((left + 1) / 2), _mm512_permutex2var_ps(a, even, b));
    _mm512_mask_storeu_ps(od + x / 2, LaneMask(left / 2), _mm512_permutex2var_ps(a, odd, b));
  }
}

// The block kernels' vectors: 16 lanes, or 8 for rows of at most 8 outputs (half the work of a 16-lane vector on
// hosts that split 512-bit operations in two). Store writes the first min(n, lanes) lanes.
struct Zmm {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V Set1(float f) { return _mm512_set1_ps(f); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Clip(V v, V lo, V hi) {  // lo wins, also when lo > hi; NaN stays
    const __mmask16 below = _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), above = _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ);
    return _mm512_mask_mov_ps(_mm512_mask_mov_ps(v, above, hi), below, lo);
  }
  static void Store(float* p, int64_t n, V v) { _mm512_mask_storeu_ps(p, LaneMask(n), v); }
};
struct Ymm {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V Set1(float f) { return _mm256_set1_ps(f); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Clip(V v, V lo, V hi) {
    const __mmask8 below = _mm256_cmp_ps_mask(v, lo, _CMP_LT_OQ), above = _mm256_cmp_ps_mask(v, hi, _CMP_GT_OQ);
    return _mm256_mask_mov_ps(_mm256_mask_mov_ps(v, above, hi), below, lo);
  }
  static void Store(float* p, int64_t n, V v) { _mm256_mask_storeu_ps(p, static_cast<__mmask8>(LaneMask(n)), v); }
};

// A fused tail the kernels apply to each output vector in registers before it is stored (no pass over the stored
// rows): one clip (Relu, Clip) or HardSwish's program, as the tail's register interpreter computes them, in its order
// (conv_tail.h). kind kNone: none, or a tail the kernels leave to ApplyChannelTail on the stored rows.
struct RegisterTail {
  enum Kind { kNone, kClip, kHardSwish } kind = kNone;
  float c[4] = {};  // clip: {lo, hi}; HardSwish: {a, b, lo, hi} for v * max(lo, min(hi, v * a + b))

  static RegisterTail Of(const ConvTail& tail) {
    RegisterTail r;
    if (tail.n == 1 && tail.codes[0] == kTailClip && tail.channel_consts == nullptr) {
      r.kind = kClip, r.c[0] = tail.consts[0], r.c[1] = tail.consts[1];
    } else if (tail.n && HardSwishTail(tail, r.c)) {
      r.kind = kHardSwish;
    }
    return r;
  }
  // The constants broadcast once, for Apply.
  template <typename Vec>
  DW_INLINE void Broadcast(typename Vec::V (&k)[4]) const {
    for (int i = 0; i < 4; ++i) k[i] = Vec::Set1(c[i]);
  }
  template <typename Vec>
  DW_INLINE typename Vec::V Apply(typename Vec::V v, const typename Vec::V (&k)[4]) const {
    if (kind == kClip) return Vec::Clip(v, k[0], k[1]);
    if (kind == kHardSwish) return Vec::Mul(v, Vec::Max(k[2], Vec::Min(k[3], Vec::Add(Vec::Mul(v, k[0]), k[1]))));
    return v;
  }
};

// R output rows of one plane, all OW columns, CV vectors of 16 at a time, from the block's input rows rows[0 ..]
// (phase 0 of each; the first output row's top tap row is rows[0]) and the kernel's taps.
template <int KH, int KW, int SH, int SW, int R, int CV, typename Vec>
__attribute__((noinline)) void DepthwiseBlock(const float* const* rows, int64_t pitch, const float* taps,
                                              const float* bias, const RegisterTail& rt, float* out, int64_t OW) {
  using V = typename Vec::V;
  constexpr int kLanes = Vec::kLanes, kHeld = KH * KW <= 9 ? KH * KW : 0;  // taps kept in registers
  V held[kHeld > 0 ? kHeld : 1];
  Unroll<kHeld>([&](auto t) DW_LAMBDA_INLINE { held[t] = Vec::Set1(taps[t]); });
  const V bv = Vec::Set1(bias != nullptr ? *bias : 0.0f);
  V tk[4];
  rt.Broadcast<Vec>(tk);
  for (int64_t o = 0; o < OW; o += kLanes * CV) {
    V acc[R][CV];
    Unroll<(R - 1) * SH + KH>([&](auto u) DW_LAMBDA_INLINE {
      const float* row = rows[u] + o;
      Unroll<KW>([&](auto j) DW_LAMBDA_INLINE {
        constexpr int kPhase = j % SW, kCol = j / SW;
        Unroll<CV>([&](auto c) DW_LAMBDA_INLINE {
          const V v = Vec::Load(row + kPhase * pitch + kCol + kLanes * c);
          Unroll<R>([&](auto q) DW_LAMBDA_INLINE {
            constexpr int i = u - q * SH;
            if constexpr (i >= 0 && i < KH) {
              V wt;
              if constexpr (kHeld > 0)
                wt = held[i * KW + j];
              else
                wt = Vec::Set1(taps[i * KW + j]);
              const V p = Vec::Mul(v, wt);
              if constexpr (i == 0 && j == 0)
                acc[q][c] = p;
              else
                acc[q][c] = Vec::Add(acc[q][c], p);
            }
          });
        });
      });
    });
    Unroll<R>([&](auto q) DW_LAMBDA_INLINE {
      Unroll<CV>([&](auto c) DW_LAMBDA_INLINE {
        if (bias != nullptr) acc[q][c] = Vec::Add(acc[q][c], bv);
        acc[q][c] = rt.Apply<Vec>(acc[q][c], tk);
      });
    });
    for (int q = 0; q < R; ++q) {
      for (int c = 0; c < CV; ++c) {
        const int64_t left = OW - o - kLanes * c;
        if (left <= 0) break;
        Vec::Store(out + q * OW + o + kLanes * c, left, acc[q][c]);
      }
    }
  }
}

// A task's zero-padded input rows in a ring of kRingSlots rows: row ih sits in slot ih % kRingSlots as sw phase
// rows of `pitch` floats (phase p: padded columns p, p + sw, ...), copied in when first asked for; rows above and
// below the input read a zero row. Per thread and kept across tasks and calls: the padding stays zero while the
// geometry is the same, since every row writes the same columns.
class RowRing {
 public:
  static constexpr int64_t kRingSlots = 16;  // >= (4 - 1) * sh + kh rows of a block; a power of two

  RowRing(const ConvShape& s, int64_t pitch) : s_(s), pitch_(pitch) {
    thread_local std::vector<float> buf;
    thread_local int64_t key[4] = {-1, -1, -1, -1};
    const int64_t k[4] = {pitch, s.sw, s.pl, s.W};
    if (!std::equal(k, k + 4, key)) {
      buf.assign(static_cast<size_t>((kRingSlots + 1) * s.sw * pitch), 0.0f);
      std::copy(k, k + 4, key);
    }
    buf_ = buf.data();
    Reset();
  }
  int64_t pitch() const { return pitch_; }
  void Reset() { std::fill(held_, held_ + kRingSlots, -1); }  // a new plane
  // Phase 0 of input row ih of `plane` (phase p at + p * pitch).
  __attribute__((always_inline)) const float* Row(const float* plane, int64_t ih) {
    if (ih < 0 || ih >= s_.H) return buf_ + kRingSlots * s_.sw * pitch_;  // the zero row after the slots
    const int64_t slot = ih & (kRingSlots - 1);
    float* row = buf_ + slot * s_.sw * pitch_;
    if (held_[slot] != ih) {
      Fill(plane + ih * s_.W, row);
      held_[slot] = ih;
    }
    return row;
  }

 private:
  void Fill(const float* src, float* row) const {
    const int64_t W = s_.W, pl = s_.pl;
    if (s_.sw == 1) {
      for (int64_t x = 0; x < W; x += 16)
        _mm512_mask_storeu_ps(row + pl + x, LaneMask(W - x), _mm512_maskz_loadu_ps(LaneMask(W - x), src + x));
    } else if (s_.sw == 2) {
      DeinterleaveAvx512(src, W, row + (pl % 2) * pitch_ + pl / 2, row + ((pl + 1) % 2) * pitch_ + (pl + 1) / 2);
    } else {
      for (int64_t x = 0; x < W; ++x) row[(pl + x) % s_.sw * pitch_ + (pl + x) / s_.sw] = src[x];
    }
  }

  const ConvShape& s_;
  int64_t pitch_;
  float* buf_;
  int64_t held_[kRingSlots];
};

// What a task's segment kernel needs beyond its rows.
struct DepthwiseArgs {
  const ConvShape& s;
  const float *x, *w, *bias;
  float* y;
  const ConvTail& tail;
  RegisterTail rt;  // the tail when the blocks apply it in their registers
};

// Output rows [oh0, oh1) of plane `plane` (image n, output channel m) in blocks of kRows output rows, each block's
// tail applied while in cache.
template <int KH, int KW, int SH, int SW, int CV, typename Vec>
void DepthwiseSegment(const DepthwiseArgs& a, RowRing& ring, int64_t plane, int64_t oh0, int64_t oh1) {
  constexpr int kRows = 4, kInRows = (kRows - 1) * SH + KH;
  const ConvShape& s = a.s;
  const int64_t mult = s.M / s.C, m = plane % s.M, c = m / mult, OW = s.OW;
  float gathered[KH * KW];  // a multiplier > 1 interleaves the channels' taps
  const float* taps = a.w + c * KH * KW;
  if (mult > 1) {
    for (int t = 0; t < KH * KW; ++t) gathered[t] = a.w[(c * KH * KW + t) * mult + m % mult];
    taps = gathered;
  }
  const float* in = a.x + (plane / s.M * s.C + c) * s.H * s.W;
  const float* bias = a.bias != nullptr ? a.bias + m : nullptr;
  float* out = a.y + plane * s.P();
  const int64_t pitch = ring.pitch();
  ring.Reset();
  const float* rows[kInRows];
  for (int64_t q0 = oh0; q0 < oh1; q0 += kRows) {
    const int64_t n_rows = std::min<int64_t>(kRows, oh1 - q0), top = q0 * SH - s.pt;
    for (int u = 0; u < (n_rows - 1) * SH + KH; ++u) rows[u] = ring.Row(in, top + u);
    float* dst = out + q0 * OW;
    if (n_rows == kRows)
      DepthwiseBlock<KH, KW, SH, SW, kRows, CV, Vec>(rows, pitch, taps, bias, a.rt, dst, OW);
    else if (n_rows == 3)
      DepthwiseBlock<KH, KW, SH, SW, 3, CV, Vec>(rows, pitch, taps, bias, a.rt, dst, OW);
    else if (n_rows == 2)
      DepthwiseBlock<KH, KW, SH, SW, 2, CV, Vec>(rows, pitch, taps, bias, a.rt, dst, OW);
    else
      DepthwiseBlock<KH, KW, SH, SW, 1, CV, Vec>(rows, pitch, taps, bias, a.rt, dst, OW);
    if (a.tail.n && a.rt.kind == RegisterTail::kNone) ApplyChannelTail(a.tail, dst, n_rows * OW, m);
  }
}

// Channels in the lanes, for small maps (a row of 7 or 14 outputs leaves lanes of a column vector idle, a stride-2
// row gathers): a task's 16 channel planes of one image are transposed once into a zero-padded channels-last
// scratch [Hp][Wp][16], each output pixel sums its taps over 16 channels at once (x_0 * w_0, then + x_t * w_t tap by
// tap, padded taps multiplying the scratch's zeros, then + bias: the reference's operations in its order), and the
// [OH * OW][16] result is transposed back into the planes. Lanes past the last channel compute zeros, never stored.

// Unroll, always inlined (the transposes' registers must stay registers).
template <int... I, typename F>
__attribute__((always_inline)) inline void UnrollSeqInline(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__attribute__((always_inline)) inline void UnrollInline(F&& f) {
  UnrollSeqInline(std::make_integer_sequence<int, N>{}, f);
}

// 16 x 16 transpose in registers: r[i] lane j becomes r[j] lane i.
__attribute__((always_inline)) inline void Transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  UnrollInline<8>([&](auto i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  });
  UnrollInline<4>([&](auto i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  });
  UnrollInline<8>([&](auto i) {
    constexpr int k = i % 4, base = i / 4 * 8;
    t[base + k] = _mm512_shuffle_f32x4(u[base + k], u[base + 4 + k], 0x88);
    t[base + 4 + k] = _mm512_shuffle_f32x4(u[base + k], u[base + 4 + k], 0xDD);
  });
  UnrollInline<8>([&](auto k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xDD);
  });
}

// NB output pixels of one output row (columns ow .. ow + NB - 1) from the channels-last scratch.
template <int NB>
void LanesPixels(const float* top, int64_t col_step, const int64_t* tap_off, int64_t T, const float* taps, __m512 bias,
                 const RegisterTail& rt, float* out) {
  __m512 acc[NB];
  const __m512 w0 = _mm512_loadu_ps(taps);
  UnrollInline<NB>([&](auto q) { acc[q] = _mm512_mul_ps(_mm512_loadu_ps(top + q * col_step), w0); });
  for (int64_t t = 1; t < T; ++t) {
    const __m512 wt = _mm512_loadu_ps(taps + 16 * t);
    const float* src = top + tap_off[t];
    UnrollInline<NB>(
        [&](auto q) { acc[q] = _mm512_add_ps(acc[q], _mm512_mul_ps(_mm512_loadu_ps(src + q * col_step), wt)); });
  }
  __m512 tk[4];
  rt.Broadcast<Zmm>(tk);
  UnrollInline<NB>([&](auto q) { _mm512_storeu_ps(out + 16 * q, rt.Apply<Zmm>(_mm512_add_ps(acc[q], bias), tk)); });
}

using LanesFn = void (*)(const float*, int64_t, const int64_t*, int64_t, const float*, __m512, const RegisterTail&,
                         float*);
constexpr int kLanesBlock = 8;      // output pixels summed at once (accumulators in registers)
constexpr int64_t kLanesMaxTaps = 256;  // tap offsets held on the stack
constexpr LanesFn kLanesFns[kLanesBlock + 1] = {nullptr,        LanesPixels<1>, LanesPixels<2>,
                                                LanesPixels<3>, LanesPixels<4>, LanesPixels<5>,
                                                LanesPixels<6>, LanesPixels<7>, LanesPixels<8>};

// LanesPixels for KW taps a row at width stride SW: per tap row, each input column is loaded once and multiplied
// into every output pixel that reads it (an output's taps still come in order, since its columns rise with j).
template <int KW, int SW, int NB>
struct LanesRow {
  template <bool kFirst>
  __attribute__((always_inline)) static void Pass(const float* row, const float* taps, __m512 (&acc)[NB]) {
    __m512 wj[KW];
    UnrollInline<KW>([&](auto j) { wj[j] = _mm512_load_ps(taps + 16 * j); });
    UnrollInline<SW*(NB - 1) + KW>([&](auto u) {
      const __m512 v = _mm512_load_ps(row + 16 * u);
      UnrollInline<KW>([&](auto j) {
        constexpr int d = u - j;
        if constexpr (d >= 0 && d % SW == 0 && d / SW < NB) {
          const __m512 prod = _mm512_mul_ps(v, wj[j]);
          if constexpr (kFirst && j == 0)
            acc[d / SW] = prod;
          else
            acc[d / SW] = _mm512_add_ps(acc[d / SW], prod);
        }
      });
    });
  }
  static void Run(const float* top, int64_t row_step, int64_t kh, const float* taps, __m512 bias,
                  const RegisterTail& rt, float* out) {
    __m512 acc[NB];
    Pass<true>(top, taps, acc);
    for (int64_t i = 1; i < kh; ++i) Pass<false>(top + i * row_step, taps + 16 * KW * i, acc);
    __m512 tk[4];
    rt.Broadcast<Zmm>(tk);
    UnrollInline<NB>([&](auto q) { _mm512_storeu_ps(out + 16 * q, rt.Apply<Zmm>(_mm512_add_ps(acc[q], bias), tk)); });
  }
};

using LanesRowFn = void (*)(const float*, int64_t, int64_t, const float*, __m512, const RegisterTail&, float*);
template <int KW>
constexpr LanesRowFn kLanesRowFns[kLanesBlock + 1] = {nullptr,
                                                      LanesRow<KW, 1, 1>::Run,
                                                      LanesRow<KW, 1, 2>::Run,
                                                      LanesRow<KW, 1, 3>::Run,
                                                      LanesRow<KW, 1, 4>::Run,
                                                      LanesRow<KW, 1, 5>::Run,
                                                      LanesRow<KW, 1, 6>::Run,
                                                      LanesRow<KW, 1, 7>::Run,
                                                      LanesRow<KW, 1, 8>::Run};

// The row kernels for the shape (3 or 5 taps wide at unit width stride, where they measured faster: the 5x5
// kernel's loads were the bound; at stride 2 they measured the same as LanesPixels), or null.
const LanesRowFn* LanesRowFns(const ConvShape& s) {
  if (s.dw != 1 || s.sw != 1) return nullptr;
  return s.kw == 3 ? kLanesRowFns<3> : s.kw == 5 ? kLanesRowFns<5> : nullptr;
}

// Rows [0, n) of 16 rows of `cols` floats (row l at src + l * pitch) to cols rows of 16 lanes, column c at
// dst + c * 16, or at dst + at[c] when a table is given (then cols <= 16): a 16 x 16 transpose per 16 columns; rows
// past n read as zeros.
template <bool kTable = false>
__attribute__((always_inline)) inline void TransposeIn(const float* src, int64_t pitch, int64_t n, int64_t cols,
                                                       float* dst, const int64_t* at = nullptr) {
  for (int64_t p = 0; p < cols; p += 16) {
    const __mmask16 km = LaneMask(cols - p);
    __m512 r[16];
    UnrollInline<16>(
        [&](auto l) { r[l] = l < n ? _mm512_maskz_loadu_ps(km, src + l * pitch + p) : _mm512_setzero_ps(); });
    Transpose16(r);
    const int64_t np = std::min<int64_t>(16, cols - p);
    UnrollInline<16>([&](auto q) {
      if (q < np) _mm512_storeu_ps(kTable ? dst + at[q] : dst + (p + q) * 16, r[q]);
    });
  }
}

// A vector's data from its first 64-byte boundary on (a 16-lane row that straddles two cache lines costs a load
// twice); the vectors are sized 15 floats over.
inline float* Aligned64(std::vector<float>& v) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
}

void DepthwiseLanes(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                    const ConvTail& tail) {
  const int64_t C = s.C, T = s.kh * s.kw, P = s.P(), HW = s.H * s.W, blocks = (C + 15) / 16;
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr;
  // taps and bias per block of 16 channels: [blocks][T + 1][16], lanes past the last channel zero
  thread_local std::vector<float> wl;
  wl.resize(static_cast<size_t>(blocks * (T + 1) * 16 + 15));
  for (int64_t cb = 0; cb < blocks; ++cb) {
    const int64_t nc = std::min<int64_t>(16, C - cb * 16);
    float* dst = Aligned64(wl) + cb * (T + 1) * 16;
    TransposeIn(w + cb * 16 * T, T, nc, T, dst);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(LaneMask(nc), bias + cb * 16) : _mm512_setzero_ps();
    _mm512_storeu_ps(dst + T * 16, b);
  }
  int64_t tap_off[kLanesMaxTaps];
  for (int64_t t = 0; t < T; ++t) tap_off[t] = ((t / s.kw) * s.dh * Wp + (t % s.kw) * s.dw) * 16;
  // an output row's columns in blocks of at most kLanesBlock, as even as they come (7 -> 7, 14 -> 7 + 7, 28 -> 4 x 7)
  const int64_t n_col_blocks = (s.OW + kLanesBlock - 1) / kLanesBlock, col_step = s.sw * 16;
  const float* weights = Aligned64(wl);
  const LanesRowFn* row_fns = LanesRowFns(s);
  const RegisterTail rt = RegisterTail::Of(tail);
  const int64_t row_group = std::max<int64_t>(1, 16 / s.W);  // input rows transposed at once
  int64_t group_at[16];  // their columns' scratch offsets
  for (int64_t q = 0; q < 16; ++q) group_at[q] = (q / s.W * Wp + q % s.W) * 16;
  ParallelFor(threads, s.N * blocks, [&](int64_t task) {
    const int64_t n = task / blocks, cb = task % blocks, c0 = cb * 16, nc = std::min<int64_t>(16, C - c0);
    thread_local std::vector<float> xs, os;
    thread_local int64_t key[6] = {-1, -1, -1, -1, -1, -1};
    const int64_t k[6] = {Hp, Wp, s.pt, s.pl, s.H, s.W};
    if (!std::equal(k, k + 6, key)) {
      // only the padding is zeroed, and it stays zero while the geometry is the same: every task transposes its
      // planes over the rest (a net's depthwise convs of different maps alternate, and zeroing all of a 56 x 56
      // map's scratch on every call cost half as much as its conv)
      xs.resize(static_cast<size_t>(Hp * Wp * 16 + 15));
      float* z = Aligned64(xs);
      std::fill(z, z + s.pt * Wp * 16, 0.0f);
      std::fill(z + (s.pt + s.H) * Wp * 16, z + Hp * Wp * 16, 0.0f);
      for (int64_t h = s.pt; h < s.pt + s.H; ++h) {
        std::fill(z + h * Wp * 16, z + (h * Wp + s.pl) * 16, 0.0f);
        std::fill(z + (h * Wp + s.pl + s.W) * 16, z + (h + 1) * Wp * 16, 0.0f);
      }
      std::copy(k, k + 6, key);
    }
    os.resize(static_cast<size_t>(P * 16 + 15));
    float* od = Aligned64(os);
    // planes -> channels-last scratch, row by row (no per-pixel row and column count), rows under 8 wide
    // row_group at a time (a block of 16 columns would be half idle)
    float* xd = Aligned64(xs);
    const float* xc = x + (n * C + c0) * HW;
    if (row_group == 1) {
      for (int64_t h = 0; h < s.H; ++h) TransposeIn(xc + h * s.W, HW, nc, s.W, xd + ((h + s.pt) * Wp + s.pl) * 16);
    } else {
      for (int64_t h = 0; h < s.H; h += row_group)
        TransposeIn<true>(xc + h * s.W, HW, nc, std::min(row_group, s.H - h) * s.W, xd + ((h + s.pt) * Wp + s.pl) * 16,
                          group_at);
    }
    const float* taps = weights + cb * (T + 1) * 16;
    const __m512 b = _mm512_loadu_ps(taps + T * 16);
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const float* row = xd + oh * s.sh * Wp * 16;
      for (int64_t q = 0; q < n_col_blocks; ++q) {
        const int64_t o0 = q * s.OW / n_col_blocks, o1 = (q + 1) * s.OW / n_col_blocks;
        if (row_fns != nullptr)
          row_fns[o1 - o0](row + o0 * col_step, s.dh * Wp * 16, s.kh, taps, b, rt, od + (oh * s.OW + o0) * 16);
        else
          kLanesFns[o1 - o0](row + o0 * col_step, col_step, tap_off, T, taps, b, rt, od + (oh * s.OW + o0) * 16);
      }
    }
    // channels-last result -> planes
    float* out = y + (n * C + c0) * P;
    for (int64_t p = 0; p < P; p += 16) {
      const int64_t np = std::min<int64_t>(16, P - p);
      __m512 r[16];
      UnrollInline<16>([&](auto q) { r[q] = q < np ? _mm512_loadu_ps(od + (p + q) * 16) : _mm512_setzero_ps(); });
      Transpose16(r);
      const __mmask16 km = LaneMask(np);
      UnrollInline<16>([&](auto l) {
        if (l < nc) _mm512_mask_storeu_ps(out + l * P + p, km, r[l]);
      });
    }
    if (tail.n && rt.kind == RegisterTail::kNone)
      for (int64_t l = 0; l < nc; ++l) ApplyChannelTail(tail, out + l * P, P, c0 + l);
  });
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

using SegmentFn = void (*)(const DepthwiseArgs&, RowRing&, int64_t, int64_t, int64_t);

template <int KH, int KW, int SH, int SW>
SegmentFn SegmentFor(int64_t OW) {
  if (OW <= 8) return DepthwiseSegment<KH, KW, SH, SW, 1, Ymm>;
  return OW <= 16 ? DepthwiseSegment<KH, KW, SH, SW, 1, Zmm> : DepthwiseSegment<KH, KW, SH, SW, 2, Zmm>;
}

template <int KH, int KW>
SegmentFn SegmentFor(const ConvShape& s) {
  switch (s.sh * 10 + s.sw) {
    case 11: return SegmentFor<KH, KW, 1, 1>(s.OW);
    case 12: return SegmentFor<KH, KW, 1, 2>(s.OW);
    case 21: return SegmentFor<KH, KW, 2, 1>(s.OW);
    default: return SegmentFor<KH, KW, 2, 2>(s.OW);
  }
}

// The register kernel for this shape, or null (none for the shape, or no AVX-512).
SegmentFn RegisterSegment(const ConvShape& s) {
  if (ActiveIsa() < Isa::kAvx512 || s.dh != 1 || s.dw != 1 || s.sh > 2 || s.sw > 2) return nullptr;
  if (s.kh == 3 && s.kw == 3) return SegmentFor<3, 3>(s);
  if (s.kh == 5 && s.kw == 5) return SegmentFor<5, 5>(s);
  return nullptr;
}

// The channels-in-lanes kernel takes the shape where it measured faster than the register kernels (AVX-512, one
// output channel per input channel, strides 1-2, no dilation): 3x3 up to 28 x 28 outputs (beyond, a 3x3 kernel's
// row reuse in the register kernels wins), kernels of 25 taps or more up to 56 x 56.
bool LanesPath(const ConvShape& s) {
  if (ActiveIsa() < Isa::kAvx512 || s.M != s.C || s.dh != 1 || s.dw != 1 || s.sh > 2 || s.sw > 2) return false;
  const int64_t T = s.kh * s.kw, limit = T >= 25 ? 56 : 28;
  return T <= kLanesMaxTaps && s.OH <= limit && s.OW <= limit;
}

// Output rows split evenly into tasks of about kTaskWork multiply-adds, a multiple of 4 of them (so 2 or 4 threads
// share the work evenly), and 4 from kTaskWork / 2 on: a small map's stride-2 or 5x5 conv (40-70 us) is worth a
// second thread (any split gives the same bits, an output's sum never crosses a task).
void DepthwiseRegister(SegmentFn segment, const DepthwiseArgs& a, int threads) {
  constexpr int64_t kTaskWork = int64_t{1} << 18;
  const ConvShape& s = a.s;
  const int64_t units = s.N * s.M * s.OH, work = units * s.OW * s.kh * s.kw;
  int64_t tasks = work < kTaskWork / 2 ? 1 : std::max<int64_t>(4, (work / kTaskWork + 3) / 4 * 4);
  tasks = std::min(tasks, units);
  const int64_t wq = (s.W + s.pl + s.pr + s.sw - 1) / s.sw, reach = (s.OW + 31) / 32 * 32 + s.kw;
  const int64_t pitch = (std::max(wq, reach) + 15) / 16 * 16;
  ParallelFor(threads, tasks, [&](int64_t task) {
    RowRing ring(s, pitch);
    const int64_t u0 = task * units / tasks, u1 = (task + 1) * units / tasks;
    for (int64_t u = u0; u < u1;) {
      const int64_t plane = u / s.OH, oh0 = u % s.OH, oh1 = std::min(s.OH, oh0 + (u1 - u));
      segment(a, ring, plane, oh0, oh1);
      u += oh1 - oh0;
    }
  });
}
#endif

}  // namespace

void DepthwiseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                    const ConvTail& tail) {
#if NPU_EP_X86
  if (LanesPath(s)) return DepthwiseLanes(s, x, w, bias, y, threads, tail);
  if (const SegmentFn segment = RegisterSegment(s))
    return DepthwiseRegister(segment, {s, x, w, bias, y, tail, RegisterTail::Of(tail)}, threads);
#endif
  if (s.sw == 1 || RowsKernel(s)) return DepthwiseFloatPadded(s, x, w, bias, y, threads, tail);
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  conv_detail::ParallelItems(threads, s.N * s.M, P * T, [&](int64_t task) {
    const int64_t n = task / s.M, m = task % s.M, c = m / mult, jm = m % mult;
    const float* plane = x + (n * s.C + c) * s.H * s.W;
    float* out = y + task * P;
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      float* dst = out + oh * s.OW;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = t / s.kw, j = t % s.kw;
        const float wt = w[(c * T + t) * mult + jm];
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        if (ih < 0 || ih >= s.H) {
          MulAddZero(dst, s.OW, wt, t == 0);
          continue;
        }
        const int64_t off = j * s.dw - s.pl;
        const Span sp = Valid(off, s.sw, s.W, s.OW);
        MulAddZero(dst, sp.lo, wt, t == 0);
        MulAdd(dst + sp.lo, plane + ih * s.W + sp.lo * s.sw + off, s.sw, sp.hi - sp.lo, wt, t == 0);
        MulAddZero(dst + sp.hi, s.OW - sp.hi, wt, t == 0);
      }
      if (bias != nullptr)
        for (int64_t o = 0; o < s.OW; ++o) dst[o] = dst[o] + bias[m];
    }
    if (tail.n) ApplyChannelTail(tail, out, P, m);
  });
}

}  // namespace npu_ep::kern
