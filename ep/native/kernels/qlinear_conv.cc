// QLinearConv native kernels: dense and grouped convs as implicit GEMM on the int8 GEMM (int8_gemm.h) with
// exact int32 sums, depthwise convs computed directly; MLAS requantization.
//
// QLinearConv (dense or grouped): the input is re-laid out once per image as a padded NHWC byte image in the
// int8 GEMM's B' representation (uint8 x - 128 = x with the sign bit flipped; pads hold x_zp), channels of a group
// padded to a multiple of 4 with x_zp too (their weights are zero, and x_zp - x_zp is zero anyway). Weights are
// the GEMM's A ([Mg, kh*kw*Cg4], zero point per row); output pixels are its columns, packed straight from the
// NHWC image: 4 consecutive k of one pixel are 4 channels of one tap, one int32 load (an AVX-512 gather fetches
// 16 pixels at once). Tasks are (group, block of pixels); each packs its block, runs the GEMM on one thread and
// requantizes its columns, so the bits never depend on the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "conv.h"
#include "conv_internal.h"
#include "qlut.h"
#include "cpu.h"
#include "int8_gemm.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {


namespace {

inline uint8_t Requantize(int32_t acc, float mult, int32_t zp, bool is_signed) {
  const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
  const float z = static_cast<float>(zp);
  float v = static_cast<float>(acc) * mult;
  v = std::min(std::max(v, lo - z), hi - z);
  v = RoundHalfEven(v) + z;
  const int32_t q = static_cast<int32_t>(v);
  return is_signed ? static_cast<uint8_t>(static_cast<int8_t>(q)) : static_cast<uint8_t>(q);
}

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
// plane at pitch Wp (the extra columns are dropped); other strides: one per output row.
void DepthwiseInt(const QConv& q) {
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, tail = (s.kw - 1) * s.dw + s.sw;
  const bool flat = s.sh == 1 && s.sw == 1;
  const int64_t pitch = flat ? Wp : s.OW;
  conv_detail::ParallelItems(q.threads, s.N * s.M, P * T, [&](int64_t task) {
    const int64_t n = task / s.M, m = task % s.M, c = m / mult;
    const uint8_t* plane = q.x + (n * s.C + c) * s.H * s.W;
    std::vector<int32_t> xp(Hp * Wp + tail, 0), acc(s.OH * pitch, 0);
    for (int64_t h = 0; h < s.H; ++h) {
      int32_t* dst = xp.data() + (h + s.pt) * Wp + s.pl;
      const uint8_t* src = plane + h * s.W;
      if (q.x_signed)
        for (int64_t w = 0; w < s.W; ++w) dst[w] = static_cast<int8_t>(src[w]) - q.x_zp;
      else
        for (int64_t w = 0; w < s.W; ++w) dst[w] = src[w] - q.x_zp;
    }
    for (int64_t t = 0; t < T; ++t) {
      const int32_t raw = q.w_signed ? static_cast<int8_t>(q.w[m * T + t]) : q.w[m * T + t];
      const int32_t wt = raw - q.w_zp[m];
      if (wt == 0) continue;
      const int32_t* src = xp.data() + (t / s.kw) * s.dh * Wp + (t % s.kw) * s.dw;
      if (flat) {
        IntMulAdd(acc.data(), src, 1, s.OH * Wp, wt);
      } else {
        for (int64_t oh = 0; oh < s.OH; ++oh)
          IntMulAdd(acc.data() + oh * pitch, src + oh * s.sh * Wp, s.sw, s.OW, wt);
      }
    }
    const int32_t bias = q.bias != nullptr ? q.bias[m] : 0;
    for (int64_t oh = 0; oh < s.OH; ++oh)
      RequantizeRow(acc.data() + oh * pitch, s.OW, bias, q.mult[m], q.y_zp, q.y_signed, q.y + task * P + oh * s.OW,
                    q.lut);
  });
}

constexpr int64_t kLanes = 16;  // pixels per packed block of B

struct PackGeom {
  const uint8_t* xb;  // padded NHWC B' image [Hp, Wp, CC]
  int64_t Wp, CC, Cg4, T, kq4, kp;
};

// One block of up to 16 pixels [p0, p0 + cols) of group g into bp (kp/4 groups of 64 bytes) and their column sums.
void PackBlockScalar(const ConvShape& s, const PackGeom& pg, int64_t g, int64_t p0, int64_t cols, int8_t* bp,
                     int32_t* bsum) {
  for (int64_t q = 0; q < kLanes; ++q) {
    int32_t sum = 0;
    if (q < cols) {
      const int64_t p = p0 + q, oh = p / s.OW, ow = p % s.OW;
      const uint8_t* base = pg.xb + (oh * s.sh * pg.Wp + ow * s.sw) * pg.CC + g * pg.Cg4;
      for (int64_t t = 0; t < pg.T; ++t) {
        const uint8_t* src = base + ((t / s.kw) * s.dh * pg.Wp + (t % s.kw) * s.dw) * pg.CC;
        for (int64_t c4 = 0; c4 < pg.Cg4 / 4; ++c4) {
          int8_t* dst = bp + (t * (pg.Cg4 / 4) + c4) * 64 + q * 4;
          for (int b = 0; b < 4; ++b) {
            dst[b] = static_cast<int8_t>(src[c4 * 4 + b]);
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
__attribute__((target(NPU_CONV_VNNI))) void PackBlockVnni(const ConvShape& s, const PackGeom& pg, int64_t g,
                                                          int64_t p0, int64_t cols, int8_t* bp, int32_t* bsum) {
  alignas(64) int32_t idx[kLanes];
  for (int64_t q = 0; q < kLanes; ++q) {
    const int64_t p = p0 + std::min(q, cols - 1), oh = p / s.OW, ow = p % s.OW;
    idx[q] = static_cast<int32_t>((oh * s.sh * pg.Wp + ow * s.sw) * pg.CC + g * pg.Cg4);
  }
  const __mmask16 k = static_cast<__mmask16>(cols >= kLanes ? 0xFFFF : (1u << cols) - 1);
  const __m512i iv = _mm512_load_si512(idx), ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t t = 0; t < pg.T; ++t) {
    const uint8_t* src = pg.xb + ((t / s.kw) * s.dh * pg.Wp + (t % s.kw) * s.dw) * pg.CC;
    for (int64_t c4 = 0; c4 < pg.Cg4 / 4; ++c4) {
      const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, iv, src + c4 * 4, 1);
      _mm512_storeu_si512(bp + (t * (pg.Cg4 / 4) + c4) * 64, v);
      sum = _mm512_dpbusd_epi32(sum, ones, v);
    }
  }
  _mm512_storeu_si512(bsum, sum);
}
#endif

void DenseInt(const QConv& q) {
  const ConvShape& s = q.s;
  const int64_t T = s.kh * s.kw, Cg = s.Cg(), Cg4 = (Cg + 3) / 4 * 4, Kq = T * Cg4;
  const int64_t kp = std::max<int64_t>(64, (Kq + 63) / 64 * 64), P = s.P(), Mg = s.Mg();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, CC = s.group * Cg4;
  const uint8_t flip = q.x_signed ? 0x00 : 0x80;  // B' = x - 128 for uint8 x: the sign bit flipped
  const int32_t bzp = q.x_zp - (q.x_signed ? 0 : 128);
  const uint8_t pad = static_cast<uint8_t>(static_cast<int8_t>(bzp));
  // pixels per task: B's packed block about 256 KiB, a multiple of 32 (the GEMM's column task)
  const int64_t chunk = std::clamp<int64_t>((256 * 1024 / kp) / 32 * 32, 64, 1024);
  const int64_t n_chunks = (P + chunk - 1) / chunk;
  std::vector<uint8_t> xb(Hp * Wp * CC);
  using PackFn = void (*)(const ConvShape&, const PackGeom&, int64_t, int64_t, int64_t, int8_t*, int32_t*);
  PackFn pack = PackBlockScalar;
#if NPU_EP_X86
  if (ActiveIsa() == Isa::kAvx512Vnni && Hp * Wp * CC < (int64_t{1} << 31)) pack = PackBlockVnni;
#endif
  const PackGeom pg{xb.data(), Wp, CC, Cg4, T, kp / 4, kp};
  const int threads = ThreadsFor(q.threads, P * Kq * Mg * s.group);
  for (int64_t n = 0; n < s.N; ++n) {
    conv_detail::ParallelItems(threads, Hp, Wp * CC, [&](int64_t h) {
      uint8_t* row = xb.data() + h * Wp * CC;
      std::fill(row, row + Wp * CC, pad);
      if (h < s.pt || h >= s.pt + s.H) return;
      for (int64_t c = 0; c < s.C; ++c) {
        const uint8_t* src = q.x + ((n * s.C + c) * s.H + h - s.pt) * s.W;
        uint8_t* dst = row + s.pl * CC + (c / Cg) * Cg4 + c % Cg;
        for (int64_t w = 0; w < s.W; ++w) dst[w * CC] = src[w] ^ flip;
      }
    });
    conv_detail::ParallelItems(threads, s.group * n_chunks, chunk * Kq * Mg, [&](int64_t task) {
      const int64_t g = task / n_chunks, p0 = (task % n_chunks) * chunk, cols = std::min(chunk, P - p0);
      const int64_t np16 = (cols + kLanes - 1) / kLanes * kLanes;
      std::vector<int8_t> bp(np16 * kp);
      std::vector<int32_t> bsum(np16), bzpv(np16, bzp), acc(Mg * cols);
      for (int64_t b = 0; b < np16 / kLanes; ++b) {
        int8_t* blk = bp.data() + b * kp * kLanes;
        pack(s, pg, g, p0 + b * kLanes, std::min(kLanes, cols - b * kLanes), blk, bsum.data() + b * kLanes);
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
      gm.bp = bp.data();
      gm.bsum = bsum.data();
      gm.bzp = bzpv.data();
      gm.acc = acc.data();
      gm.threads = 1;
      Int8MatMul(gm);
      for (int64_t m = 0; m < Mg; ++m) {
        const int64_t mo = g * Mg + m;
        RequantizeRow(acc.data() + m * cols, cols, q.bias != nullptr ? q.bias[mo] : 0, q.mult[mo], q.y_zp,
                      q.y_signed, q.y + (n * s.M + mo) * P + p0, q.lut);
      }
    });
  }
}

}  // namespace

void QLinearConv(const QConv& q) {
  if (q.s.N == 0) return;
  if (q.depthwise)
    DepthwiseInt(q);
  else
    DenseInt(q);
}

}  // namespace npu_ep::kern
