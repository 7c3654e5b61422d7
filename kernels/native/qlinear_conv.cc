// QLinearConv native kernels: dense and grouped convs as implicit GEMM on the int8 GEMM (int8_gemm.h) with
// exact int32 sums, depthwise convs computed directly; MLAS requantization, or the sums themselves (ConvInteger).
//
// QLinearConv (dense or grouped): the input is re-laid out once per image as a padded byte image in the int8 GEMM's
// B' representation (uint8 x - 128 = x with the sign bit flipped; pads hold x_zp), in channel quads: [Hp, CC/4,
// Wp, 4], channels of a group padded to a multiple of 4 with x_zp too (their weights are zero, and x_zp - x_zp is
// zero anyway). Weights are the GEMM's A ([Mg, kh*kw*Cg4], zero point per row); output pixels are its columns,
// packed straight from that image: 4 consecutive k of one pixel are one quad of one tap, one int32, and at unit
// width stride 16 pixels of one output row are 64 consecutive bytes (one load; an AVX-512 gather otherwise).
// Tasks are (group, block of pixels); each packs its block, runs the GEMM on one thread and requantizes its
// columns, so the bits never depend on the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "conv.h"
#include "conv_geometry.h"
#include "qdq_lut.h"
#include "cpu.h"
#include "int8_gemm.h"
#include "scratch.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {

namespace {

// y[o] = requantize(acc[o] + bias) for o in [0, n) (int32 add wraps, as int32 hardware).
void RequantizeRowScalar(const int32_t* acc, int64_t n, int32_t bias, float mult, int32_t zp, bool is_signed,
                         uint8_t* y) {
  for (int64_t o = 0; o < n; ++o)
    y[o] = Requantize(static_cast<int32_t>(static_cast<uint32_t>(acc[o]) + static_cast<uint32_t>(bias)), mult, zp,
                      is_signed);
}

#if NPU_EP_X86
__attribute__((target("avx512f,avx512bw,avx512vl"))) void RequantizeRowAvx512(const int32_t* acc, int64_t n,
                                                                              int32_t bias, float mult, int32_t zp,
                                                                              bool is_signed, uint8_t* y) {
  const float z = static_cast<float>(zp);
  const __m512 lo = _mm512_set1_ps((is_signed ? -128.0f : 0.0f) - z);
  const __m512 hi = _mm512_set1_ps((is_signed ? 127.0f : 255.0f) - z);
  const __m512 mv = _mm512_set1_ps(mult), zv = _mm512_set1_ps(z);
  const __m512i bv = _mm512_set1_epi32(bias);
  for (int64_t o = 0; o < n; o += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - o >= 16 ? 0xFFFF : (1u << (n - o)) - 1);
    const __m512i v = _mm512_add_epi32(_mm512_maskz_loadu_epi32(k, acc + o), bv);
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), mv);
    f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
    f = _mm512_add_ps(_mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
    _mm_mask_storeu_epi8(y + o, k, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(f)));
  }
}
#endif

void RequantizeRow(const int32_t* acc, int64_t n, int32_t bias, float mult, int32_t zp, bool is_signed, uint8_t* y) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return RequantizeRowAvx512(acc, n, bias, mult, zp, is_signed, y);
#endif
  RequantizeRowScalar(acc, n, bias, mult, zp, is_signed, y);
}

// The requantized row, then the fused output table if any (in place, while the row is in cache).
void RequantizeRow(const int32_t* acc, int64_t n, int32_t bias, float mult, int32_t zp, bool is_signed, uint8_t* y,
                   const uint8_t* lut) {
  RequantizeRow(acc, n, bias, mult, zp, is_signed, y);
  if (lut != nullptr) LutRow(y, n, lut, y);
}

// acc[o] += xp[o * stride] * w for o in [0, n): xp holds x - x_zp as int32 (padding 0); int32 wraps.
void IntMulAddScalar(int32_t* acc, const int32_t* xp, int64_t stride, int64_t n, int32_t w) {
  for (int64_t o = 0; o < n; ++o)
    acc[o] = static_cast<int32_t>(static_cast<uint32_t>(acc[o]) +
                                  static_cast<uint32_t>(xp[o * stride]) * static_cast<uint32_t>(w));
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) void IntMulAddAvx512(int32_t* acc, const int32_t* xp, int64_t stride, int64_t n,
                                                        int32_t w) {
  const __m512i wv = _mm512_set1_epi32(w);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t o = 0; o < n; o += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - o >= 16 ? 0xFFFF : (1u << (n - o)) - 1);
    __m512i v;
    if (stride == 1) {
      v = _mm512_maskz_loadu_epi32(k, xp + o);
    } else {  // stride 2: the even lanes of 32 source values, loads masked to the 2n - 1 the outputs read
      const int64_t left = 2 * (n - o) - 1;
      const __mmask16 k0 = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
      const __mmask16 k1 = static_cast<__mmask16>(left >= 32 ? 0xFFFF : left <= 16 ? 0 : (1u << (left - 16)) - 1);
      v = _mm512_permutex2var_epi32(_mm512_maskz_loadu_epi32(k0, xp + 2 * o), even,
                                    _mm512_maskz_loadu_epi32(k1, xp + 2 * o + 16));
    }
    const __m512i a = _mm512_maskz_loadu_epi32(k, acc + o);
    _mm512_mask_storeu_epi32(acc + o, k, _mm512_add_epi32(a, _mm512_mullo_epi32(v, wv)));
  }
}
#endif

void IntMulAdd(int32_t* acc, const int32_t* xp, int64_t stride, int64_t n, int32_t w) {
  if (n <= 0) return;
#if NPU_EP_X86
  if ((stride == 1 || stride == 2) && ActiveIsa() >= Isa::kAvx512) return IntMulAddAvx512(acc, xp, stride, n, w);
#endif
  IntMulAddScalar(acc, xp, stride, n, w);
}

// Per plane: x - x_zp once into a zero-padded int32 buffer (pitch Wp), so no tap needs bounds checks (padding
// adds (x_zp - x_zp) * w = 0, as the reference). Stride 1: each tap is one multiply-add over the whole output
// plane at pitch Wp (the extra columns are dropped); other strides: one per output row. With a depth multiplier
// (a one-channel image's first conv: 24 outputs of one plane) the planes are converted once, before the outputs.
void DepthwiseInt(const QConv& q) {
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, tail = (s.kw - 1) * s.dw + s.sw;
  const int64_t plane_len = Hp * Wp + tail;
  const bool flat = s.sh == 1 && s.sw == 1;
  const int64_t pitch = flat ? Wp : s.OW;
  const auto convert = [&](int64_t nc, int32_t* xp) {  // xp: plane_len zeros
    const uint8_t* plane = q.x + nc * s.H * s.W;
    for (int64_t h = 0; h < s.H; ++h) {
      int32_t* dst = xp + (h + s.pt) * Wp + s.pl;
      const uint8_t* src = plane + h * s.W;
      if (q.x_signed)
        for (int64_t w = 0; w < s.W; ++w) dst[w] = static_cast<int8_t>(src[w]) - q.x_zp;
      else
        for (int64_t w = 0; w < s.W; ++w) dst[w] = src[w] - q.x_zp;
    }
  };
  std::vector<int32_t> shared;
  if (mult > 1) {
    shared.assign(s.N * s.C * plane_len, 0);
    conv_detail::ParallelItems(q.threads, s.N * s.C, s.H * s.W,
                               [&](int64_t nc) { convert(nc, shared.data() + nc * plane_len); });
  }
  conv_detail::ParallelItems(q.threads, s.N * s.M, P * T, [&](int64_t task) {
    const int64_t n = task / s.M, m = task % s.M, c = m / mult;
    std::vector<int32_t> own(mult > 1 ? 0 : plane_len, 0), acc(s.OH * pitch, 0);
    if (mult == 1) convert(n * s.C + c, own.data());
    const int32_t* xp = mult > 1 ? shared.data() + (n * s.C + c) * plane_len : own.data();
    for (int64_t t = 0; t < T; ++t) {
      const int32_t raw = q.w_signed ? static_cast<int8_t>(q.w[m * T + t]) : q.w[m * T + t];
      const int32_t wt = raw - q.w_zp[m];
      if (wt == 0) continue;
      const int32_t* src = xp + (t / s.kw) * s.dh * Wp + (t % s.kw) * s.dw;
      if (flat) {
        IntMulAdd(acc.data(), src, 1, s.OH * Wp, wt);
      } else {
        for (int64_t oh = 0; oh < s.OH; ++oh) IntMulAdd(acc.data() + oh * pitch, src + oh * s.sh * Wp, s.sw, s.OW, wt);
      }
    }
    if (q.acc_out != nullptr) {
      for (int64_t oh = 0; oh < s.OH; ++oh)
        std::copy(acc.data() + oh * pitch, acc.data() + oh * pitch + s.OW, q.acc_out + task * P + oh * s.OW);
      return;
    }
    const int32_t bias = q.bias != nullptr ? q.bias[m] : 0;
    for (int64_t oh = 0; oh < s.OH; ++oh)
      RequantizeRow(acc.data() + oh * pitch, s.OW, bias, q.mult[m], q.y_zp, q.y_signed, q.y + task * P + oh * s.OW,
                    q.lut);
  });
}

constexpr int64_t kLanes = 16;  // pixels per packed block of B

struct PackGeom {
  const uint8_t* xb;  // padded B' image in channel quads [Hp, CC/4, Wp, 4]
  int64_t Wp, CC, Cg4, T, kq4, kp;
  const int64_t* tap;  // [T]: At(i * dh, j * dw, 0, 0) of tap t = (i, j)
  // byte offset of pixel (row ih, column iw), quad c4 of group g
  int64_t At(int64_t ih, int64_t iw, int64_t g, int64_t c4) const {
    return ((ih * (CC / 4) + g * (Cg4 / 4) + c4) * Wp + iw) * 4;
  }
};

#if NPU_EP_X86
// Pixels [w, w + 64) of 4 channel rows (mask k; src[b] null: a padding channel, pv), each byte ^ f, as [64, 4] bytes
// in out[0..3], 16 pixels each. The byte and word unpacks work within 128-bit lanes, so lane L of q[0..3] holds
// pixels 16 L + [0, 4), [4, 8), [8, 12), [12, 16); two rounds of lane shuffles put them in order.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void Quads64(const uint8_t* const src[4], int64_t w,
                                                                         __mmask64 k, __m512i f, __m512i pv,
                                                                         __m512i (&out)[4]) {
  __m512i r[4];
  for (int b = 0; b < 4; ++b) r[b] = src[b] ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, src[b] + w), f) : pv;
  const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]), hi01 = _mm512_unpackhi_epi8(r[0], r[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(r[2], r[3]), hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
  const __m512i q[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                        _mm512_unpacklo_epi16(hi01, hi23), _mm512_unpackhi_epi16(hi01, hi23)};
  const __m512i t0 = _mm512_shuffle_i32x4(q[0], q[1], 0x44), t1 = _mm512_shuffle_i32x4(q[2], q[3], 0x44);
  const __m512i t2 = _mm512_shuffle_i32x4(q[0], q[1], 0xEE), t3 = _mm512_shuffle_i32x4(q[2], q[3], 0xEE);
  out[0] = _mm512_shuffle_i32x4(t0, t1, 0x88);
  out[1] = _mm512_shuffle_i32x4(t0, t1, 0xDD);
  out[2] = _mm512_shuffle_i32x4(t2, t3, 0x88);
  out[3] = _mm512_shuffle_i32x4(t2, t3, 0xDD);
}

// InterleaveQuad on AVX-512: 64 pixels at a time (Quads64), the last few by masked loads and stores (no scalar tail).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void InterleaveQuadAvx512(const uint8_t* const src[4], int64_t W,
                                                                               uint8_t flip, uint8_t pad,
                                                                               uint8_t* dst) {
  const __m512i f = _mm512_set1_epi8(static_cast<char>(flip)), pv = _mm512_set1_epi8(static_cast<char>(pad));
  for (int64_t w = 0; w < W; w += 64) {
    const int64_t n = std::min<int64_t>(64, W - w);
    const __mmask64 k = n == 64 ? ~0ull : (1ull << n) - 1;
    __m512i out[4];
    Quads64(src, w, k, f, pv, out);
    for (int v = 0; v < 4 && 16 * v < n; ++v) {
      const int64_t left = n - 16 * v;
      _mm512_mask_storeu_epi8(dst + (w + 16 * v) * 4, left >= 16 ? ~0ull : (1ull << (4 * left)) - 1, out[v]);
    }
  }
}
#endif

// Row w of 4 channel rows (src[b] null: a padding channel, which holds pad) as [W, 4] bytes, each byte ^ flip.
void InterleaveQuad(const uint8_t* const src[4], int64_t W, uint8_t flip, uint8_t pad, uint8_t* dst) {
  int64_t w = 0;
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return InterleaveQuadAvx512(src, W, flip, pad, dst);
  if (src[0] && src[1] && src[2] && src[3]) {  // SSE2 (every x86-64): 16 pixels of 4 channels at a time
    const __m128i f = _mm_set1_epi8(static_cast<char>(flip));
    for (; w + 16 <= W; w += 16) {
      __m128i r[4];
      for (int b = 0; b < 4; ++b)
        r[b] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[b] + w)), f);
      const __m128i lo01 = _mm_unpacklo_epi8(r[0], r[1]), hi01 = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i lo23 = _mm_unpacklo_epi8(r[2], r[3]), hi23 = _mm_unpackhi_epi8(r[2], r[3]);
      __m128i* d = reinterpret_cast<__m128i*>(dst + w * 4);
      _mm_storeu_si128(d, _mm_unpacklo_epi16(lo01, lo23));
      _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(lo01, lo23));
      _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(hi01, hi23));
      _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(hi01, hi23));
    }
  }
#endif
  for (; w < W; ++w)
    for (int b = 0; b < 4; ++b) dst[w * 4 + b] = src[b] ? src[b][w] ^ flip : pad;
}

// One block of up to 16 pixels [p0, p0 + cols) of group g into bp (kp/4 groups of 64 bytes) and their column sums.
void PackBlockScalar(const ConvShape& s, const PackGeom& pg, int64_t g, int64_t p0, int64_t cols, int8_t* bp,
                     int32_t* bsum) {
  for (int64_t q = 0; q < kLanes; ++q) {
    int32_t sum = 0;
    if (q < cols) {
      const int64_t p = p0 + q, oh = p / s.OW, ow = p % s.OW;
      const int64_t base = pg.At(oh * s.sh, ow * s.sw, g, 0);
      for (int64_t t = 0; t < pg.T; ++t) {
        for (int64_t c4 = 0; c4 < pg.Cg4 / 4; ++c4) {
          const uint8_t* src = pg.xb + base + pg.tap[t] + c4 * pg.Wp * 4;
          int8_t* dst = bp + (t * (pg.Cg4 / 4) + c4) * 64 + q * 4;
          for (int b = 0; b < 4; ++b) {
            dst[b] = static_cast<int8_t>(src[b]);
            sum += dst[b];
          }
        }
      }
    } else {
      for (int64_t kq = 0; kq < pg.kq4; ++kq) std::memset(bp + kq * 64 + q * 4, 0, 4);
    }
    bsum[q] = sum;
  }
}

#if NPU_EP_X86
#define NPU_CONV_VNNI "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
__attribute__((target(NPU_CONV_VNNI))) void PackBlockVnni(const ConvShape& s, const PackGeom& pg, int64_t g, int64_t p0,
                                                          int64_t cols, int8_t* bp, int32_t* bsum) {
  // the block's pixels as runs along output rows: lanes [lane, lane + n) are row oh from column ow on
  struct Run {
    int64_t oh, ow, lane, n;
  };
  Run runs[kLanes];
  int n_runs = 0;
  for (int64_t q = 0; q < cols;) {
    const int64_t p = p0 + q, oh = p / s.OW, ow = p % s.OW, n = std::min(cols - q, s.OW - ow);
    runs[n_runs++] = {oh, ow, q, n};
    q += n;
  }
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
  if (s.sw == 1) {  // each run is consecutive int32s of the image
    int64_t base[kLanes];
    for (int r = 0; r < n_runs; ++r) base[r] = pg.At(runs[r].oh * s.sh, runs[r].ow, g, 0);
    for (int64_t t = 0; t < pg.T; ++t) {
      for (int64_t c4 = 0; c4 < pg.Cg4 / 4; ++c4) {
        const int64_t off = pg.tap[t] + c4 * pg.Wp * 4;
        __m512i v = _mm512_setzero_si512();
        for (int r = 0; r < n_runs; ++r) {
          const Run& u = runs[r];
          const uint8_t* src = pg.xb + base[r] + off;
          const __mmask16 lanes = static_cast<__mmask16>(((1u << u.n) - 1u) << u.lane);
          v = u.lane == 0 ? _mm512_maskz_loadu_epi32(lanes, src) : _mm512_mask_expandloadu_epi32(v, lanes, src);
        }
        _mm512_storeu_si512(bp + (t * (pg.Cg4 / 4) + c4) * 64, v);
        sum = _mm512_dpbusd_epi32(sum, ones, v);
      }
    }
  } else {
    alignas(64) int32_t idx[kLanes];
    for (int64_t q = 0; q < kLanes; ++q) {
      const int64_t p = p0 + std::min(q, cols - 1), oh = p / s.OW, ow = p % s.OW;
      idx[q] = static_cast<int32_t>(pg.At(oh * s.sh, ow * s.sw, 0, 0));
    }
    const __mmask16 k = static_cast<__mmask16>(cols >= kLanes ? 0xFFFF : (1u << cols) - 1);
    const __m512i iv = _mm512_load_si512(idx);
    for (int64_t t = 0; t < pg.T; ++t) {
      for (int64_t c4 = 0; c4 < pg.Cg4 / 4; ++c4) {
        const uint8_t* src = pg.xb + pg.tap[t] + pg.At(0, 0, g, c4);
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, iv, src, 1);
        _mm512_storeu_si512(bp + (t * (pg.Cg4 / 4) + c4) * 64, v);
        sum = _mm512_dpbusd_epi32(sum, ones, v);
      }
    }
  }
  _mm512_storeu_si512(bsum, sum);
}

// Dense convs on VNNI (width stride <= 2; strides: DenseFlat's phase planes): the GEMM reads B straight from the
// padded image, nothing is packed. The image is held in quad planes [CC/4, Hp, Wp, 4] of unsigned bytes (int8 x +
// 128), so output pixel (oh, ow) taken at the image's pitch, p = oh * Wp + ow, reads tap (i, j) of quad plane c at
// byte (c * Hp * Wp + i * dh * Wp + j * dw + p) * 4: 16 such pixels are one 64-byte load. The columns ow >= OW of
// that flat index (Wp - OW of every Wp) are computed and dropped (masked stores put each row's run of a block in
// place; the GEMM's columns never leave the registers). vpdpbusd takes the pixels as its unsigned operand and the
// weights (uint8 ones - 128) as signed:
//   sum_k (x' - x_zp')(w - w_zp) = dot(x', w) - x_zp' sum_k w + K x_zp' w_zp - w_zp sum_k x'
// so weights without a zero point (symmetric int8 weights, what int8 QDQ models carry) need no sums over the pixels,
// only one per weight row; else each flat pixel's sum (PixelSums) times w_zp comes off in the epilogue.
struct FlatConv {
  const uint8_t* img;  // the group's first quad plane
  const int64_t* off;  // [Kq / 4]: byte offset of quad k of a pixel (tap and plane)
  int64_t nkq, Kq, Wp, OW, NF;  // NF = OH * Wp flat pixels
  const int8_t* w;              // the group's weight rows, Kq apart
  const int32_t* rterm;         // [Mg]: bias - x_zp' * sum_k w + Kq x_zp' w_zp, wrapping
  const int32_t* wzp;           // [Mg]: the weights' zero points
  const int32_t* psum;          // [blocks * kFlatCols]: sum_k x' of each flat pixel, or null (every w_zp 0)
  const float* mult;            // [Mg]
  int32_t y_zp;
  bool y_signed;
  uint8_t* y;        // the image's and group's first output row, or null
  int32_t* acc_out;  // or the sums' (ConvInteger)
  int64_t P;         // OH * OW, the output rows' pitch
};

constexpr int kFlatVecs = 3;                      // vectors of 16 pixels per register tile
constexpr int64_t kFlatCols = 16 * kFlatVecs;  // flat pixels per block: 8 rows x 48 pixels in 24 accumulators

// The lanes of a block of flat pixels that are output pixels, as runs along output rows: lane l of run s goes to
// output pixel pb + l + d[s].
struct FlatRuns {
  int n = 0;
  uint64_t mask[66];
  int64_t d[66];
};

// The runs of the `lanes` (<= 64) flat pixels from pb, pitch Wp, NF flat pixels of which the first OW a row are
// output pixels.
FlatRuns RunsOf(int64_t pb, int64_t lanes, int64_t NF, int64_t Wp, int64_t OW) {
  FlatRuns u;
  for (int64_t l = 0; l < lanes && pb + l < NF;) {
    const int64_t p = pb + l, oh = p / Wp, ow = p % Wp, end = std::min(lanes, l + Wp - ow);
    const int64_t valid = std::min(end - l, std::max<int64_t>(0, OW - ow));
    if (valid > 0) {
      u.mask[u.n] = (valid == 64 ? ~0ull : (uint64_t{1} << valid) - 1) << l;
      u.d[u.n++] = -oh * (Wp - OW);
    }
    l = end;
  }
  return u;
}

template <typename T>
T* At(T* base, int64_t i) {  // base + i for a masked store whose lane 0 may lie outside the array
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(i) * sizeof(T));
}

// V vectors of int32 sums requantized (Requantize's steps; the clip leaves no NaN: max(NaN, lo) is lo, as MLAS) to
// the first 16 V bytes of a vector.
#define NPU_CONV_512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"
template <int V>
__attribute__((target(NPU_CONV_512), always_inline)) inline __m512i RequantizeBytes(const __m512i* sum, __m512 mv,
                                                                                    __m512 lo, __m512 hi, __m512i zv) {
  __m128i q[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
  _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) {
    const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum[v]), mv), lo), hi);
    q[v] = _mm512_cvtepi32_epi8(
        _mm512_add_epi32(_mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv));
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])), _mm256_set_m128i(q[3], q[2]), 1);
}

// R weight rows (the first `rows` real; a short tile repeats its last row) x 16 V flat pixels from pb (V <
// kFlatVecs: the last block, when no more of its pixels are left).
template <int R, int V>
__attribute__((target(NPU_CONV_VNNI))) void FlatTile(const FlatConv& f, int64_t m0, int rows, int64_t pb,
                                                     const FlatRuns& u) {
  const uint8_t* b = f.img + pb * 4;
  const int8_t* a[R];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) a[r] = f.w + (m0 + std::min(r, rows - 1)) * f.Kq;
  __m512i acc[R][V];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_si512();
  }
  for (int64_t kq = 0; kq < f.nkq; ++kq) {
    const uint8_t* bk = b + f.off[kq];
    __m512i bv[V];
    _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_si512(bk + 64 * v);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a[r] + 4 * kq, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) acc[r][v] = DpbusdTied(acc[r][v], bv[v], av);
    }
  }
  const float z = static_cast<float>(f.y_zp);
  const __m512 lo = _mm512_set1_ps((f.y_signed ? -128.0f : 0.0f) - z);
  const __m512 hi = _mm512_set1_ps((f.y_signed ? 127.0f : 255.0f) - z);
  const __m512i zv = _mm512_set1_epi32(f.y_zp);
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const int64_t m = m0 + r;
    const __m512i t = _mm512_set1_epi32(f.rterm[m]);
    __m512i sum[V];
    _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) sum[v] = _mm512_add_epi32(acc[r][v], t);
    if (f.psum != nullptr && f.wzp[m] != 0) {  // - w_zp sum_k x'
      const __m512i z = _mm512_set1_epi32(-f.wzp[m]);
      _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) sum[v] =
          _mm512_add_epi32(sum[v], _mm512_mullo_epi32(_mm512_loadu_si512(f.psum + pb + 16 * v), z));
    }
    if (f.acc_out != nullptr) {
      int32_t* row = f.acc_out + m * f.P;
      for (int s = 0; s < u.n; ++s) {
        _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) _mm512_mask_storeu_epi32(
            At(row, pb + u.d[s] + 16 * v), static_cast<__mmask16>(u.mask[s] >> (16 * v)), sum[v]);
      }
      continue;
    }
    const __m512i bytes = RequantizeBytes<V>(sum, _mm512_set1_ps(f.mult[m]), lo, hi, zv);
    uint8_t* row = f.y + m * f.P;
    for (int s = 0; s < u.n; ++s) _mm512_mask_storeu_epi8(At(row, pb + u.d[s]), u.mask[s], bytes);
  }
}

// y = x ^ 0x80 (uint8 x - 128 as int8) for n bytes.
__attribute__((target(NPU_CONV_512))) void FlipSigns(const uint8_t* x, int64_t n, int8_t* y) {
  const __m512i f = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 k = n - i >= 64 ? ~0ull : (1ull << (n - i)) - 1;
    _mm512_mask_storeu_epi8(y + i, k, _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, x + i), f));
  }
}

// FlatTile with R the tile's rows rounded up to 8, 4, 2 or 1.
template <int V>
void TileRows(const FlatConv& f, int64_t m0, int rows, int64_t pb, const FlatRuns& u) {
  if (rows > 4)
    FlatTile<8, V>(f, m0, rows, pb, u);
  else if (rows > 2)
    FlatTile<4, V>(f, m0, rows, pb, u);
  else if (rows == 2)
    FlatTile<2, V>(f, m0, rows, pb, u);
  else
    FlatTile<1, V>(f, m0, rows, pb, u);
}

// Row sums of int8 weights [M, Kq].
__attribute__((target(NPU_CONV_VNNI))) void WeightSums(const int8_t* w, int64_t M, int64_t Kq, int32_t* sums) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t m = 0; m < M; ++m) {
    __m512i s = _mm512_setzero_si512();
    for (int64_t k = 0; k < Kq; k += 64) {
      const __mmask64 mask = Kq - k >= 64 ? ~0ull : (1ull << (Kq - k)) - 1;
      s = _mm512_dpbusd_epi32(s, ones, _mm512_maskz_loadu_epi8(mask, w + m * Kq + k));
    }
    sums[m] = _mm512_reduce_add_epi32(s);
  }
}

// The output pixel index of flat pixel p (the first output pixel at or after it).
int64_t FlatToOut(int64_t p, int64_t Wp, int64_t OW) { return p / Wp * OW + std::min(p % Wp, OW); }

bool FlatApplies(const QConv& q) { return ActiveIsa() >= Isa::kAvx512Vnni && q.s.sw <= 2; }

// Each flat pixel's sum_k x' over its taps and a group's quad planes: the quad sums of every position summed over
// the planes (q), then over the taps (psum, [n] from flat pixel 0).
__attribute__((target(NPU_CONV_VNNI))) void PixelSums(const uint8_t* img, int64_t planes, int64_t stride, int64_t len,
                                                      const int64_t* off, int64_t T, int64_t per_tap, int32_t* q,
                                                      int64_t n, int32_t* psum) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < len; i += 16) {
    __m512i v = _mm512_setzero_si512();
    for (int64_t c = 0; c < planes; ++c)
      v = _mm512_dpbusd_epi32(v, _mm512_loadu_si512(img + (c * stride + i) * 4), ones);
    _mm512_storeu_si512(q + i, v);
  }
  for (int64_t p = 0; p < n; p += 16) {
    __m512i v = _mm512_setzero_si512();
    for (int64_t t = 0; t < T; ++t) v = _mm512_add_epi32(v, _mm512_loadu_si512(q + off[t * per_tap] / 4 + p));
    _mm512_storeu_si512(psum + p, v);
  }
}

thread_local std::vector<uint8_t> t_flat_image;
thread_local std::vector<int32_t> t_flat_rterm;
thread_local std::vector<int64_t> t_flat_off;
thread_local std::vector<int8_t> t_flat_w;
thread_local std::vector<int32_t> t_flat_wzp, t_flat_q, t_flat_psum;

// InterleaveQuadAvx512 into the two column phases of a padded row (pixel w at padded column pl + w: phase
// (pl + w) % 2, index (pl + w) / 2), each 32 pixels' quads split into even and odd ones in registers; the rows
// first filled with pad (their padding columns).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void InterleaveQuadPhases2(const uint8_t* const src[4], int64_t W,
                                                                                uint8_t flip, uint8_t pad, int64_t pl,
                                                                                int64_t Wph, uint8_t* phase0,
                                                                                uint8_t* phase1) {
  std::memset(phase0, pad, Wph * 4);
  std::memset(phase1, pad, Wph * 4);
  uint8_t* const dst[2] = {phase0, phase1};
  const __m512i f = _mm512_set1_epi8(static_cast<char>(flip)), pv = _mm512_set1_epi8(static_cast<char>(pad));
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  for (int64_t w = 0; w < W; w += 64) {
    const int64_t n = std::min<int64_t>(64, W - w);
    const __mmask64 k = n == 64 ? ~0ull : (1ull << n) - 1;
    __m512i out[4];
    Quads64(src, w, k, f, pv, out);
    for (int v = 0; v < 2 && 32 * v < n; ++v) {
      const int64_t nv = std::min<int64_t>(32, n - 32 * v), cb = pl + w + 32 * v;  // padded column of its first
      const int64_t ne = (nv + 1) / 2, no = nv / 2;
      const __m512i e = _mm512_permutex2var_epi32(out[2 * v], ie, out[2 * v + 1]);
      const __m512i o = _mm512_permutex2var_epi32(out[2 * v], io, out[2 * v + 1]);
      _mm512_mask_storeu_epi32(dst[cb % 2] + cb / 2 * 4, static_cast<__mmask16>((1u << ne) - 1), e);
      _mm512_mask_storeu_epi32(dst[(cb + 1) % 2] + (cb + 1) / 2 * 4, static_cast<__mmask16>((1u << no) - 1), o);
    }
  }
}

// A strided conv reads its image as sh x sw phase planes (phase (a, b) holds the padded pixels (y sh + a, x sw + b) at
// (y, x)), so output pixel (oh, ow) reads tap (i, j) at phase ((i dh) % sh, (j dw) % sw), pixel (oh + i dh / sh,
// ow + j dw / sw): consecutive output pixels are consecutive again. A valid output never reads past its phase row.
void DenseFlat(const QConv& q) {
  const int32_t* w_sums = q.w_sums;
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, Cg = s.Cg(), Cg4 = (Cg + 3) / 4 * 4, Kq = T * Cg4, nkq = Kq / 4;
  const int64_t P = s.P(), Mg = s.Mg(), CQ = s.group * Cg4 / 4;
  // a row's right pads are the next row's left pads (both hold x_zp'), so at unit width stride the pitch takes the
  // wider side only (fewer dropped columns) where that still holds a whole output row
  const bool shared = s.sw == 1 && std::min(s.pl, s.pr) <= (s.kw - 1) * s.dw;
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + (shared ? std::max(s.pl, s.pr) : s.pl + s.pr);
  const int64_t Hph = (Hp + s.sh - 1) / s.sh, Wph = (Wp + s.sw - 1) / s.sw;  // a phase plane's rows and pitch
  const int64_t phases = s.sh * s.sw, plane = Hph * Wph, NF = s.OH * Wph;
  const int64_t slack = (s.kw - 1) * s.dw + kFlatCols;  // pixels a block's loads may read past the last plane
  const uint8_t flip = q.x_signed ? 0x80 : 0x00;        // x' = x + 128 for int8 x: the sign bit flipped
  const int32_t xzp = q.x_zp + (q.x_signed ? 128 : 0);
  const uint8_t pad = static_cast<uint8_t>(xzp);
  uint8_t* img = Grow(t_flat_image, (CQ * phases * plane + slack + 16) * 4);  // + 16: the pixel sums' last vector
  int32_t* rterm = Grow(t_flat_rterm, s.M);
  int64_t* off = Grow(t_flat_off, nkq);
  // vpdpbusd's signed operand: uint8 weights - 128 (the sign bit flipped), their zero points alike
  const int8_t* w = reinterpret_cast<const int8_t*>(q.w);
  int32_t* wzp = Grow(t_flat_wzp, s.M);
  for (int64_t m = 0; m < s.M; ++m) wzp[m] = q.w_zp[m] - (q.w_signed ? 0 : 128);
  if (!q.w_signed) {
    int8_t* flipped = Grow(t_flat_w, s.M * Kq);
    FlipSigns(q.w, s.M * Kq, flipped);
    w = flipped;
  }
  const bool sums = std::any_of(wzp, wzp + s.M, [](int32_t z) { return z != 0; });
  const auto row_terms = [&](int64_t m0, int64_t m1) {  // rterm of weight rows [m0, m1)
    if (w_sums != nullptr) {  // the given sums of q.w's rows, as those of the flipped rows
      for (int64_t m = m0; m < m1; ++m)
        rterm[m] = static_cast<int32_t>(static_cast<uint32_t>(w_sums[m]) -
                                        (q.w_signed ? 0u : 128u * static_cast<uint32_t>(Kq)));
    } else {
      WeightSums(w + m0 * Kq, m1 - m0, Kq, rterm + m0);
    }
    for (int64_t m = m0; m < m1; ++m)
      rterm[m] =
          static_cast<int32_t>((q.acc_out == nullptr && q.bias != nullptr ? static_cast<uint32_t>(q.bias[m]) : 0) -
                               static_cast<uint32_t>(xzp) * static_cast<uint32_t>(rterm[m]) +
                               static_cast<uint32_t>(Kq) * static_cast<uint32_t>(xzp) * static_cast<uint32_t>(wzp[m]));
  };
  for (int64_t t = 0; t < T; ++t) {
    const int64_t di = (t / s.kw) * s.dh, dj = (t % s.kw) * s.dw;
    const int64_t phase = (di % s.sh) * s.sw + dj % s.sw;
    for (int64_t c4 = 0; c4 < Cg4 / 4; ++c4)
      off[t * (Cg4 / 4) + c4] = ((c4 * phases + phase) * plane + di / s.sh * Wph + dj / s.sw) * 4;
  }
  std::memset(img + CQ * phases * plane * 4, pad, (slack + 16) * 4);
  const int64_t blocks = (NF + kFlatCols - 1) / kFlatCols;
  const int64_t block_work = kFlatCols * Kq * Mg;
  // Tasks of about 4M multiply-adds (a few us: ORT's pool hands them out one by one, so a slow thread takes fewer):
  // blocks of pixels with every weight row while the weights are the smaller operand (a block's B stays in L1 over
  // the row tiles), else tiles of 8 weight rows with every block (a tile's weights stay in L1 over the blocks: small
  // maps of many channels, whose weights would stream from memory once per block)
  const int64_t tiles = (Mg + 7) / 8;
  const bool rows_outer = Mg > blocks * kFlatCols;
  const int64_t unit_work = rows_outer ? 8 * Kq * blocks * kFlatCols : block_work;
  const int64_t per_task =
      std::clamp<int64_t>((int64_t{1} << 22) / std::max<int64_t>(unit_work, 1), 1, rows_outer ? tiles : blocks);
  const int64_t tasks = ((rows_outer ? tiles : blocks) + per_task - 1) / per_task;
  const bool task_sums = rows_outer && w_sums == nullptr;  // each task its rows', while it reads them anyway
  if (!task_sums) row_terms(0, s.M);
  std::vector<FlatRuns> block_runs(rows_outer ? blocks : 0);
  for (int64_t b = 0; b < static_cast<int64_t>(block_runs.size()); ++b)
    block_runs[b] = RunsOf(b * kFlatCols, kFlatCols, NF, Wph, s.OW);
  const int threads = ThreadsFor(q.threads, blocks * block_work * s.group);
  // pixel sums: a group's q over its planes' positions and past them (the blocks' last taps), psum per flat pixel
  const int64_t qlen = (phases * plane + slack + 15) / 16 * 16, plen = blocks * kFlatCols;
  int32_t* qs = sums ? Grow(t_flat_q, qlen) : nullptr;
  int32_t* psum = sums ? Grow(t_flat_psum, s.group * plen) : nullptr;
  const FlatConv base{img, off,  nkq,    Kq,     Wph,        s.OW, NF,        w, rterm,
                      wzp, psum, q.mult, q.y_zp, q.y_signed, q.y,  q.acc_out, P};
  for (int64_t n = 0; n < s.N; ++n) {
    // phase row (y, a) of quad plane cq: padded row y sh + a, its sw column phases
    const auto build_row = [&](int64_t item) {
      const int64_t cq = item / (Hph * s.sh), a = item / Hph % s.sh, y = item % Hph, h = y * s.sh + a;
      uint8_t* dst = img + ((cq * phases + a * s.sw) * plane + y * Wph) * 4;
      if (h < s.pt || h >= s.pt + s.H) {
        for (int64_t b = 0; b < s.sw; ++b) std::memset(dst + b * plane * 4, pad, Wph * 4);
        return;
      }
      const uint8_t* src[4];
      for (int b = 0; b < 4; ++b) {
        const int64_t cc = cq * 4 + b, g = cc / Cg4, c = cc % Cg4;  // group g's channel c, or its padding
        src[b] = c < Cg ? q.x + ((n * s.C + g * Cg + c) * s.H + h - s.pt) * s.W : nullptr;
      }
      if (s.sw == 2) return InterleaveQuadPhases2(src, s.W, flip, pad, s.pl, Wph, dst, dst + plane * 4);
      std::memset(dst, pad, s.pl * 4);
      std::memset(dst + (s.pl + s.W) * 4, pad, (Wph - s.pl - s.W) * 4);
      InterleaveQuad(src, s.W, flip, pad, dst + s.pl * 4);
    };
    if (s.sh == 1 && s.sw == 1 && Wph == s.W) {  // no width padding: a plane's rows are contiguous in x and the image
      for (int64_t cq = 0; cq < CQ; ++cq) {
        uint8_t* dst = img + cq * plane * 4;
        std::memset(dst, pad, s.pt * Wph * 4);
        std::memset(dst + (s.pt + s.H) * Wph * 4, pad, (Hph - s.pt - s.H) * Wph * 4);
        const uint8_t* src[4];
        for (int b = 0; b < 4; ++b) {
          const int64_t cc = cq * 4 + b, g = cc / Cg4, c = cc % Cg4;
          src[b] = c < Cg ? q.x + (n * s.C + g * Cg + c) * s.H * s.W : nullptr;
        }
        InterleaveQuad(src, s.H * s.W, flip, pad, dst + s.pt * Wph * 4);
      }
    } else {
      for (int64_t item = 0; item < CQ * s.sh * Hph; ++item) build_row(item);
    }
    for (int64_t g = 0; sums && g < s.group; ++g)
      PixelSums(img + g * (Cg4 / 4) * phases * plane * 4, Cg4 / 4, phases * plane, qlen, off, T, Cg4 / 4, qs, plen,
                psum + g * plen);
    ParallelFor(threads, s.group * tasks, [&](int64_t task) {
      const int64_t g = task / tasks, i0 = task % tasks * per_task;
      const int64_t t0 = rows_outer ? i0 : 0, t1 = rows_outer ? std::min(tiles, i0 + per_task) : tiles;
      const int64_t b0 = rows_outer ? 0 : i0, b1 = rows_outer ? blocks : std::min(blocks, i0 + per_task);
      FlatConv f = base;
      f.img += g * (Cg4 / 4) * phases * plane * 4;
      f.w += g * Mg * Kq;
      f.rterm += g * Mg;
      f.wzp += g * Mg;
      f.psum = sums ? psum + g * plen : nullptr;
      f.mult += g * Mg;
      if (q.acc_out != nullptr)
        f.acc_out += (n * s.M + g * Mg) * P;
      else
        f.y += (n * s.M + g * Mg) * P;
      if (task_sums) row_terms(g * Mg + 8 * t0, g * Mg + std::min(Mg, 8 * t1));
      const auto tile = [&](int64_t t, int64_t b, const FlatRuns& u) {
        const int rows = static_cast<int>(std::min<int64_t>(8, Mg - 8 * t));
        const int64_t left = NF - b * kFlatCols;
        if (left <= 16)
          TileRows<1>(f, 8 * t, rows, b * kFlatCols, u);
        else if (left <= 32)
          TileRows<2>(f, 8 * t, rows, b * kFlatCols, u);
        else
          TileRows<kFlatVecs>(f, 8 * t, rows, b * kFlatCols, u);
      };
      if (rows_outer) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t b = b0; b < b1; ++b) tile(t, b, block_runs[b]);
      } else {
        for (int64_t b = b0; b < b1; ++b) {
          const FlatRuns u = RunsOf(b * kFlatCols, kFlatCols, NF, Wph, s.OW);
          for (int64_t t = t0; t < t1; ++t) tile(t, b, u);
        }
      }
      if (q.lut != nullptr && f.y != nullptr) {  // the fused output table over the task's rows and output pixels
        const int64_t o0 = FlatToOut(b0 * kFlatCols, Wph, s.OW);
        const int64_t o1 = FlatToOut(std::min(NF, b1 * kFlatCols), Wph, s.OW);
        for (int64_t m = 8 * t0; m < std::min(Mg, 8 * t1); ++m)
          LutRow(f.y + m * P + o0, o1 - o0, q.lut, f.y + m * P + o0);
      }
    });
  }
}

// Depthwise convs on AVX-512 (width stride <= 2): each task's plane as bytes in phase planes (x_zp in the padding;
// DenseFlat's layout at pitch Wph), so every tap is one 16-byte load per 16 consecutive output pixels, widened to
// int32; 64 pixels' sums stay in registers over the taps, and x_zp comes off once per channel:
//   sum_t (x - x_zp) w_t = sum_t x w_t - x_zp sum_t w_t
// (the reference's int32 products and wrapping adds: in any order the same).
constexpr int kDwVecs = 4;
constexpr int64_t kDwCols = 16 * kDwVecs;

struct DwGeom {
  int64_t Hph, Wph, phases, plane, NF, slack;
};

DwGeom DwGeometry(const ConvShape& s) {
  const bool shared = s.sw == 1 && std::min(s.pl, s.pr) <= (s.kw - 1) * s.dw;  // DenseFlat's rule
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + (shared ? std::max(s.pl, s.pr) : s.pl + s.pr);
  const int64_t Hph = (Hp + s.sh - 1) / s.sh, Wph = (Wp + s.sw - 1) / s.sw;
  return {Hph, Wph, s.sh * s.sw, Hph * Wph, s.OH * Wph, (s.kw - 1) * s.dw + kDwCols};
}

// Plane nc of x in byte phase planes at dst (g.phases * g.plane + g.slack bytes, all written). A data row is read
// straight from x, 64 padded columns at a time with x_zp where they fall outside the row (a masked load); at width
// stride 2 the low and high bytes of its words are the two column phases.
__attribute__((target(NPU_CONV_512))) void DwConvert(const QConv& q, const DwGeom& g, int64_t nc, uint8_t* dst) {
  const ConvShape& s = q.s;
  const uint8_t pad = static_cast<uint8_t>(q.x_zp);
  const __m512i pv = _mm512_set1_epi8(static_cast<char>(pad));
  const int64_t step = 64 / s.sw;
  for (int64_t h = 0; h < g.Hph * s.sh; ++h) {
    const int64_t a = h % s.sh, y = h / s.sh;
    uint8_t* out = dst + a * s.sw * g.plane + y * g.Wph;
    if (h < s.pt || h >= s.pt + s.H) {
      for (int64_t b = 0; b < s.sw; ++b) std::memset(out + b * g.plane, pad, g.Wph);
      continue;
    }
    const uint8_t* src = q.x + (nc * s.H + h - s.pt) * s.W;
    for (int64_t x0 = 0; x0 < g.Wph; x0 += step) {
      const int64_t c0 = x0 * s.sw - s.pl;  // the source column of lane 0
      const int64_t lo = std::clamp<int64_t>(-c0, 0, 64), hi = std::clamp<int64_t>(s.W - c0, 0, 64);
      const __mmask64 k = lo >= hi ? 0 : (hi == 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
      const __m512i v = _mm512_mask_loadu_epi8(pv, k, At(src, c0));
      const int64_t n = std::min(step, g.Wph - x0);
      if (s.sw == 1) {
        _mm512_mask_storeu_epi8(out + x0, n == 64 ? ~0ull : (1ull << n) - 1, v);
      } else {
        const __mmask32 kn = n == 32 ? 0xFFFFFFFFu : (1u << n) - 1;
        _mm256_mask_storeu_epi8(out + x0, kn, _mm512_cvtepi16_epi8(v));
        _mm256_mask_storeu_epi8(out + g.plane + x0, kn, _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 8)));
      }
    }
  }
  std::memset(dst + g.phases * g.plane, pad, g.slack);
}

// Every chunk's runs (RunsOf), the same for every plane: chunk k's are [first[k], first[k + 1]).
struct DwRuns {
  std::vector<uint64_t> mask;
  std::vector<int64_t> d;
  std::vector<int64_t> first;
};

// Output channel m of image n (task n M + m) from its byte planes xp.
__attribute__((target(NPU_CONV_512))) void DwPlane(const QConv& q, const DwGeom& g, const int64_t* toff,
                                                   const DwRuns& runs, int64_t task, const uint8_t* xp) {
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, m = task % s.M, P = s.P();
  int32_t wt[64];  // the taps' w - w_zp, T <= 64
  uint32_t wsum = 0;
  for (int64_t t = 0; t < T; ++t) {
    wt[t] = (q.w_signed ? static_cast<int8_t>(q.w[m * T + t]) : static_cast<int32_t>(q.w[m * T + t])) - q.w_zp[m];
    wsum += static_cast<uint32_t>(wt[t]);
  }
  const uint32_t b = q.acc_out == nullptr && q.bias != nullptr ? static_cast<uint32_t>(q.bias[m]) : 0;
  const __m512i bias = _mm512_set1_epi32(static_cast<int32_t>(b - static_cast<uint32_t>(q.x_zp) * wsum));
  const float z = static_cast<float>(q.y_zp);
  const __m512 lo = _mm512_set1_ps((q.y_signed ? -128.0f : 0.0f) - z);
  const __m512 hi = _mm512_set1_ps((q.y_signed ? 127.0f : 255.0f) - z);
  const __m512i zv = _mm512_set1_epi32(q.y_zp);
  const __m512 mv = _mm512_set1_ps(q.acc_out != nullptr ? 0.0f : q.mult[m]);
  for (int64_t pb = 0; pb < g.NF; pb += kDwCols) {
    __m512i acc[kDwVecs];
    _Pragma("GCC unroll 4") for (int v = 0; v < kDwVecs; ++v) acc[v] = _mm512_setzero_si512();
    for (int64_t t = 0; t < T; ++t) {
      if (wt[t] == 0) continue;
      const __m512i wv = _mm512_set1_epi32(wt[t]);
      const uint8_t* src = xp + toff[t] + pb;
      _Pragma("GCC unroll 4") for (int v = 0; v < kDwVecs; ++v) {
        const __m128i x8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * v));
        const __m512i x = q.x_signed ? _mm512_cvtepi8_epi32(x8) : _mm512_cvtepu8_epi32(x8);
        acc[v] = _mm512_add_epi32(acc[v], _mm512_mullo_epi32(x, wv));
      }
    }
    _Pragma("GCC unroll 4") for (int v = 0; v < kDwVecs; ++v) acc[v] = _mm512_add_epi32(acc[v], bias);
    const int64_t r0 = runs.first[pb / kDwCols], r1 = runs.first[pb / kDwCols + 1];
    if (q.acc_out != nullptr) {
      int32_t* out = q.acc_out + task * P;
      for (int64_t r = r0; r < r1; ++r) {
        _Pragma("GCC unroll 4") for (int v = 0; v < kDwVecs; ++v) _mm512_mask_storeu_epi32(
            At(out, pb + runs.d[r] + 16 * v), static_cast<__mmask16>(runs.mask[r] >> (16 * v)), acc[v]);
      }
      continue;
    }
    const __m512i bytes = RequantizeBytes<kDwVecs>(acc, mv, lo, hi, zv);
    uint8_t* y = q.y + task * P;
    for (int64_t r = r0; r < r1; ++r) _mm512_mask_storeu_epi8(At(y, pb + runs.d[r]), runs.mask[r], bytes);
  }
  if (q.lut != nullptr && q.acc_out == nullptr) LutRow(q.y + task * P, P, q.lut, q.y + task * P);
}

bool DwFlatApplies(const QConv& q) { return ActiveIsa() >= Isa::kAvx512 && q.s.sw <= 2 && q.s.kh * q.s.kw <= 64; }

thread_local std::vector<uint8_t> t_dw_plane;

void DepthwiseFlat(const QConv& q) {
  const ConvShape& s = q.s;
  const DwGeom g = DwGeometry(s);
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P(), len = g.phases * g.plane + g.slack;
  int64_t toff[64];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t di = (t / s.kw) * s.dh, dj = (t % s.kw) * s.dw;
    toff[t] = ((di % s.sh) * s.sw + dj % s.sw) * g.plane + di / s.sh * g.Wph + dj / s.sw;
  }
  DwRuns runs;
  for (int64_t pb = 0; pb < g.NF; pb += kDwCols) {
    const FlatRuns u = RunsOf(pb, kDwCols, g.NF, g.Wph, s.OW);
    runs.first.push_back(static_cast<int64_t>(runs.mask.size()));
    runs.mask.insert(runs.mask.end(), u.mask, u.mask + u.n);
    runs.d.insert(runs.d.end(), u.d, u.d + u.n);
  }
  runs.first.push_back(static_cast<int64_t>(runs.mask.size()));
  std::vector<uint8_t> shared;  // a depth multiplier's planes, converted once
  if (mult > 1) {
    shared.resize(s.N * s.C * len);
    conv_detail::ParallelItems(q.threads, s.N * s.C, s.H * s.W,
                               [&](int64_t nc) { DwConvert(q, g, nc, shared.data() + nc * len); });
  }
  conv_detail::ParallelItems(q.threads, s.N * s.M, P * T, [&](int64_t task) {
    const int64_t n = task / s.M, c = task % s.M / mult;
    if (mult > 1) return DwPlane(q, g, toff, runs, task, shared.data() + (n * s.C + c) * len);
    uint8_t* own = Grow(t_dw_plane, len);
    DwConvert(q, g, n * s.C + c, own);
    DwPlane(q, g, toff, runs, task, own);
  });
}
#endif

// A pool thread's packed B block, its column sums and zero points, and the int32 sums, kept between calls (sized by
// the block below).
struct Scratch {
  std::vector<int8_t> bp;
  std::vector<int32_t> bsum, bzp, acc;
};
thread_local Scratch t_scratch;

void DenseInt(const QConv& q) {
#if NPU_EP_X86
  if (FlatApplies(q)) return DenseFlat(q);
#endif
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, Cg = s.Cg(), Cg4 = (Cg + 3) / 4 * 4, Kq = T * Cg4;
  const int64_t kp = std::max<int64_t>(64, (Kq + 63) / 64 * 64), P = s.P(), Mg = s.Mg();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, CC = s.group * Cg4;
  const uint8_t flip = q.x_signed ? 0x00 : 0x80;  // B' = x - 128 for uint8 x: the sign bit flipped
  const int32_t bzp = q.x_zp - (q.x_signed ? 0 : 128);
  const uint8_t pad = static_cast<uint8_t>(static_cast<int8_t>(bzp));
  // pixels per task: B's packed block about 256 KiB, a multiple of 32 (the GEMM's column task)
  int64_t chunk = std::clamp<int64_t>((256 * 1024 / kp) / 32 * 32, 64, 1024);
  // one image of one group in a single chunk but worth two threads: two chunks (exact integer sums, so the split
  // never changes a bit; a small net's 16x16 and 32x32 convs had run on one thread)
  if (s.group == 1 && P <= chunk && P >= 64 && P * Kq * Mg >= 2 * kMinParallelWork)
    chunk = ((P + 1) / 2 + 31) / 32 * 32;
  const int64_t n_chunks = (P + chunk - 1) / chunk;
  std::vector<uint8_t> xb(Hp * Wp * CC);
  using PackFn = void (*)(const ConvShape&, const PackGeom&, int64_t, int64_t, int64_t, int8_t*, int32_t*);
  PackFn pack = PackBlockScalar;
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512Vnni && Hp * Wp * CC < (int64_t{1} << 31)) pack = PackBlockVnni;
#endif
  std::vector<int64_t> taps(T);
  const PackGeom pg{xb.data(), Wp, CC, Cg4, T, kp / 4, kp, taps.data()};
  for (int64_t t = 0; t < T; ++t) taps[t] = pg.At((t / s.kw) * s.dh, (t % s.kw) * s.dw, 0, 0);
  const int threads = ThreadsFor(q.threads, P * Kq * Mg * s.group);
  for (int64_t n = 0; n < s.N; ++n) {
    conv_detail::ParallelItems(threads, Hp, Wp * CC, [&](int64_t h) {
      uint8_t* row = xb.data() + h * Wp * CC;
      std::fill(row, row + Wp * CC, pad);
      if (h < s.pt || h >= s.pt + s.H) return;
      for (int64_t cq = 0; cq < CC / 4; ++cq) {  // quad cq: channels 4 cq .. 4 cq + 3 of the image
        const uint8_t* src[4];
        for (int b = 0; b < 4; ++b) {
          const int64_t cc = cq * 4 + b, g = cc / Cg4, c = cc % Cg4;  // group g's channel c, or its padding
          src[b] = c < Cg ? q.x + ((n * s.C + g * Cg + c) * s.H + h - s.pt) * s.W : nullptr;
        }
        InterleaveQuad(src, s.W, flip, pad, row + (cq * Wp + s.pl) * 4);
      }
    });
    conv_detail::ParallelItems(threads, s.group * n_chunks, chunk * Kq * Mg, [&](int64_t task) {
      const int64_t g = task / n_chunks, p0 = (task % n_chunks) * chunk, cols = std::min(chunk, P - p0);
      const int64_t np16 = (cols + kLanes - 1) / kLanes * kLanes;
      Scratch& sc = t_scratch;  // every element below is written before it is read
      int8_t* bp = Grow(sc.bp, np16 * kp);
      int32_t* bsum = Grow(sc.bsum, np16);
      // the GEMM requantizes straight into y (else the table follows, or the sums are the output)
      const bool fused = q.lut == nullptr && q.acc_out == nullptr;
      int32_t* acc = fused ? nullptr : Grow(sc.acc, Mg * cols);
      sc.bzp.assign(np16, bzp);
      for (int64_t b = 0; b < np16 / kLanes; ++b) {
        int8_t* blk = bp + b * kp * kLanes;
        pack(s, pg, g, p0 + b * kLanes, std::min(kLanes, cols - b * kLanes), blk, bsum + b * kLanes);
        std::memset(blk + Kq * kLanes, 0, (kp - Kq) * kLanes);
      }
      Int8Gemm gm;
      gm.a = q.w + g * Mg * Kq;
      gm.a_signed = q.w_signed;
      gm.azp = q.w_zp + g * Mg;
      gm.azp_per_row = true;
      gm.M = Mg;
      gm.K = Kq;
      gm.N = cols;
      gm.kp = kp;
      gm.bp = bp;
      gm.bsum = bsum;
      gm.bzp = sc.bzp.data();
      gm.acc = acc;
      gm.threads = 1;
      if (fused) {
        gm.mult = q.mult + g * Mg;
        gm.mult_per_row = true;
        gm.bias_row = q.bias != nullptr ? q.bias + g * Mg : nullptr;
        gm.y_zp = q.y_zp;
        gm.y_signed = q.y_signed;
        gm.y = q.y + (n * s.M + g * Mg) * P + p0;
        gm.ldy = P;
        return Int8MatMul(gm);
      }
      Int8MatMul(gm);
      if (q.acc_out != nullptr) {
        for (int64_t m = 0; m < Mg; ++m)
          std::copy(acc + m * cols, acc + (m + 1) * cols, q.acc_out + (n * s.M + g * Mg + m) * P + p0);
        return;
      }
      for (int64_t m = 0; m < Mg; ++m) {
        const int64_t mo = g * Mg + m;
        RequantizeRow(acc + m * cols, cols, q.bias != nullptr ? q.bias[mo] : 0, q.mult[mo], q.y_zp, q.y_signed,
                      q.y + (n * s.M + mo) * P + p0, q.lut);
      }
    });
  }
}

}  // namespace

void QLinearConv(const QConv& q) {
  if (q.s.N == 0 || q.s.M == 0 || q.s.P() == 0) return;  // nothing to write
  if (q.depthwise) {
#if NPU_EP_X86
    if (DwFlatApplies(q)) return DepthwiseFlat(q);
#endif
    DepthwiseInt(q);
  } else {
    DenseInt(q);
  }
}

}  // namespace npu_ep::kern
