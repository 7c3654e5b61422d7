// Native convolution kernels: float im2col (the GEMM runs on numpy's BLAS), float and integer depthwise convs
// computed directly, and QLinearConv as implicit GEMM on the int8 GEMM (int8_gemm.h) with exact int32 sums.
//
// QLinearConv (dense or grouped): the input is re-laid out once per image as a padded NHWC byte image in the
// int8 GEMM's B' representation (uint8 x - 128 = x with the sign bit flipped; pads hold x_zp), channels of a group
// padded to a multiple of 4 with x_zp too (their weights are zero, and x_zp - x_zp is zero anyway). Weights are
// the GEMM's A ([Mg, kh*kw*Cg4], zero point per row); output pixels are its columns, packed straight from the
// NHWC image: 4 consecutive k of one pixel are 4 channels of one tap, one int32 load (an AVX-512 gather fetches
// 16 pixels at once). Tasks are (group, block of pixels); each packs its block, runs the GEMM on one thread and
// requantizes its columns, so the bits never depend on the thread count.
//
// No fused multiply-add anywhere in this file (fp-contract off): the float kernels do the reference's float32
// operations in the reference's order.
#include "conv.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "int8_gemm.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC optimize("fp-contract=off")

namespace npu_ep::kern {

void ConvShape::Finish() {
  auto bad = [](const std::string& why) { throw std::invalid_argument("conv: " + why); };
  if (N < 0 || C <= 0 || H <= 0 || W <= 0) bad("input must be [N, C > 0, H > 0, W > 0]");
  if (group <= 0 || M <= 0 || C % group || M % group)
    bad("group " + std::to_string(group) + " must divide C=" + std::to_string(C) + " and M=" + std::to_string(M));
  if (kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0)
    bad("kernel, strides and dilations must be positive");
  if (pt < 0 || pl < 0 || pb < 0 || pr < 0) bad("pads must be >= 0");
  const int64_t ekh = (kh - 1) * dh + 1, ekw = (kw - 1) * dw + 1;
  if (H + pt + pb < ekh || W + pl + pr < ekw)
    bad("the padded input " + std::to_string(H + pt + pb) + "x" + std::to_string(W + pl + pr) +
        " is smaller than the dilated kernel " + std::to_string(ekh) + "x" + std::to_string(ekw));
  OH = (H + pt + pb - ekh) / sh + 1;
  OW = (W + pl + pr - ekw) / sw + 1;
}

namespace {

// Work (element operations) below which a kernel runs on the calling thread alone: handing tasks to other
// threads costs more than it saves there, and on a loaded host a helper that is descheduled mid-task stalls the
// whole op. The split itself never changes the bits.
constexpr int64_t kMinParallelWork = int64_t{1} << 20;
inline int ThreadsFor(int threads, int64_t work) { return work < kMinParallelWork ? 1 : threads; }

// Outputs o in [lo, hi) read inside the input: 0 <= o * stride + off < in.
struct Span {
  int64_t lo, hi;
};
inline Span Valid(int64_t off, int64_t stride, int64_t in, int64_t out) {
  int64_t lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t hi = in - off <= 0 ? 0 : (in - off - 1) / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
  return {lo, hi};
}

// ---- float ------------------------------------------------------------------------------------------------------

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

}  // namespace

void Im2ColFloat(const ConvShape& s, const float* x, int64_t n, float* cols, int threads) {
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), rows = s.group * K;
  const int64_t per_task = std::max<int64_t>(1, 16384 / std::max<int64_t>(P, 1));
  ParallelFor(ThreadsFor(threads, rows * P), (rows + per_task - 1) / per_task, [&](int64_t task) {
    for (int64_t r = task * per_task; r < std::min(rows, (task + 1) * per_task); ++r) {
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
    }
  });
}

void DenseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, Sgemm64 sgemm,
                int threads) {
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  const int64_t T = s.kh * s.kw, K = s.Cg() * T, P = s.P(), Mg = s.Mg();
  // pixels per task: the block's patch matrix about 512 KiB
  const int64_t block = std::clamp<int64_t>((131072 / K) / 16 * 16, 64, 4096);
  const int64_t n_blocks = (P + block - 1) / block;
  const int nt = ThreadsFor(threads, s.N * P * K * Mg * s.group);
  ParallelFor(nt, s.N * s.group * n_blocks, [&](int64_t task) {
    const int64_t n = task / (s.group * n_blocks), g = (task / n_blocks) % s.group, p0 = (task % n_blocks) * block;
    const int64_t cols = std::min(block, P - p0);
    std::vector<float> patch(K * cols);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t c = k / T, i = (k % T) / s.kw, j = k % s.kw;
      const float* plane = x + ((n * s.C) + g * s.Cg() + c) * s.H * s.W;
      const int64_t off_w = j * s.dw - s.pl;
      const Span sp = Valid(off_w, s.sw, s.W, s.OW);
      float* dst = patch.data() + k * cols;
      for (int64_t p = p0; p < p0 + cols;) {  // one output row segment at a time
        const int64_t oh = p / s.OW, ow0 = p % s.OW, ow1 = std::min(s.OW, ow0 + (p0 + cols - p));
        float* d = dst + (p - p0) - ow0;  // d[ow] is pixel (oh, ow)
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        if (ih < 0 || ih >= s.H) {
          std::fill(d + ow0, d + ow1, 0.0f);
        } else {
          const float* row = plane + ih * s.W + off_w;
          const int64_t lo = std::clamp(sp.lo, ow0, ow1), hi = std::clamp(sp.hi, lo, ow1);
          std::fill(d + ow0, d + lo, 0.0f);
          if (s.sw == 1)
            std::memcpy(d + lo, row + lo, (hi - lo) * sizeof(float));
          else
            for (int64_t o = lo; o < hi; ++o) d[o] = row[o * s.sw];
          std::fill(d + hi, d + ow1, 0.0f);
        }
        p += ow1 - ow0;
      }
    }
    float* out = y + (n * s.M + g * Mg) * P + p0;
    sgemm(kRowMajor, kTrans, kNoTrans, Mg, cols, K, 1.0f, w + g * K * Mg, Mg, patch.data(), cols, 0.0f, out, P);
    if (bias != nullptr)
      for (int64_t m = 0; m < Mg; ++m)
        for (int64_t o = 0; o < cols; ++o) out[m * P + o] = out[m * P + o] + bias[g * Mg + m];
  });
}

namespace {

// Stride 1: the plane is copied once into a zero-padded buffer of row pitch Wp, and each tap is ONE multiply-add
// over the whole output plane laid out with the same pitch (the columns past OW are computed and dropped), so
// the work is T long vector loops instead of T * OH short ones. Padded taps multiply the buffer's zeros, as the
// reference does.
void DepthwiseFloatStride1(const ConvShape& s, const float* x, const float* w, const float* bias, float* y,
                           int threads) {
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  const int64_t Hp = s.H + s.pt + s.pb, Wp = s.W + s.pl + s.pr, tail = (s.kw - 1) * s.dw;
  ParallelFor(ThreadsFor(threads, s.N * s.M * P * T), s.N * s.M, [&](int64_t task) {
    const int64_t n = task / s.M, m = task % s.M, c = m / mult, jm = m % mult;
    const float* plane = x + (n * s.C + c) * s.H * s.W;
    std::vector<float> xp(Hp * Wp + tail, 0.0f), acc(s.OH * Wp);
    for (int64_t h = 0; h < s.H; ++h) std::memcpy(&xp[(h + s.pt) * Wp + s.pl], plane + h * s.W, s.W * sizeof(float));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = t / s.kw, j = t % s.kw;
      MulAdd(acc.data(), xp.data() + i * s.dh * Wp + j * s.dw, 1, s.OH * Wp, w[(c * T + t) * mult + jm], t == 0);
    }
    float* out = y + task * P;
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const float* src = acc.data() + oh * Wp;
      float* dst = out + oh * s.OW;
      if (bias != nullptr)
        for (int64_t o = 0; o < s.OW; ++o) dst[o] = src[o] + bias[m];
      else
        std::memcpy(dst, src, s.OW * sizeof(float));
    }
  });
}

}  // namespace

void DepthwiseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads) {
  if (s.sh == 1 && s.sw == 1) return DepthwiseFloatStride1(s, x, w, bias, y, threads);
  const int64_t T = s.kh * s.kw, mult = s.M / s.C, P = s.P();
  ParallelFor(ThreadsFor(threads, s.N * s.M * P * T), s.N * s.M, [&](int64_t task) {
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
  });
}

// ---- integer ----------------------------------------------------------------------------------------------------
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
  ParallelFor(ThreadsFor(q.threads, s.N * s.M * P * T), s.N * s.M, [&](int64_t task) {
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
      RequantizeRow(acc.data() + oh * pitch, s.OW, bias, q.mult[m], q.y_zp, q.y_signed, q.y + task * P + oh * s.OW);
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
    ParallelFor(ThreadsFor(threads, Hp * Wp * CC), Hp, [&](int64_t h) {
      uint8_t* row = xb.data() + h * Wp * CC;
      std::fill(row, row + Wp * CC, pad);
      if (h < s.pt || h >= s.pt + s.H) return;
      for (int64_t c = 0; c < s.C; ++c) {
        const uint8_t* src = q.x + ((n * s.C + c) * s.H + h - s.pt) * s.W;
        uint8_t* dst = row + s.pl * CC + (c / Cg) * Cg4 + c % Cg;
        for (int64_t w = 0; w < s.W; ++w) dst[w * CC] = src[w] ^ flip;
      }
    });
    ParallelFor(threads, s.group * n_chunks, [&](int64_t task) {
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
                      q.y_signed, q.y + (n * s.M + mo) * P + p0);
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
