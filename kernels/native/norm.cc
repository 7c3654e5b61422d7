// The normalizations of kernels/ops/norm.py, skip_layernorm.py and norm_channel.py (`kernels.norm_rows`,
// `kernels.norm_channels`), float32 or float16 in memory, computed in float32 as the reference model computes them:
// - rows (LayerNormalization, RMSNormalization / SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization,
//   SkipLayerNormalization): x viewed as [rows, d], each row normalized on its own, with the optional statistics
//   outputs (mean, inv_std_var: one float32 per row) and Skip*'s sum s = x + skip (+ bias);
// - channels (BatchNormalization in inference, InstanceNormalization, GroupNormalization): x viewed as
//   [n, c, spatial]; BatchNorm is y = x * a[c] + b[c], the others normalize each (n, group) run of c / groups
//   channels and then scale and shift per channel.
// Sums run in 16 independent float32 lanes added pairwise at the end (the reference's numpy sums differ in order
// only: within float tolerance), except SkipSimplified's sum of squares, which is sequential as ORT's CPU kernel
// and the reference sum it (its output has their bits). Element-wise steps do the reference's operations in its
// order without fused multiply-adds, at SSE2, AVX2 or AVX-512 width. Rows are split into fixed tasks, so the bits do
// not depend on the threads.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the lane sums and the element-wise loops vectorize
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // the reference's separate multiply and add roundings
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "as_array.h"
#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "norm_matmul.h"
#include "scratch.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

// The row and plane functions are inlined into one copy per instruction set (RowsAvx2, ...), where they vectorize
// at that width; their 16 lanes keep the bits the same on every copy.
#define NORM_INLINE inline __attribute__((always_inline))

constexpr int64_t kTaskElems = 16384;  // elements per parallel task (whole rows or planes)
constexpr int kLanes = 16;
thread_local std::vector<float> t_scratch;  // a task's float32 rows (scratch.h)

enum class RowKind { kLayer = 0, kRms = 1, kSkipRms = 2, kSkipLayer = 3 };
enum class ChannelKind { kAffine = 0, kGroup = 1 };

using Params = py::array_t<float, py::array::c_style | py::array::forcecast>;

NORM_INLINE float LaneTotal(float* lanes) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) lanes[k] += lanes[k + w];
  return lanes[0];
}

// sum(v) in 16 lanes (element j in lane j % 16), added pairwise.
NORM_INLINE float Sum(const float* v, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] += v[j + k];
  for (int k = 0; j < n; ++j, ++k) lanes[k] += v[j];
  return LaneTotal(lanes);
}

// sum((v - c)^2) in 16 lanes; c = 0 gives the sum of squares.
NORM_INLINE float SumSquares(const float* v, int64_t n, float c) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float t = v[j + k] - c;
      lanes[k] += t * t;
    }
  for (int k = 0; j < n; ++j, ++k) {
    const float t = v[j] - c;
    lanes[k] += t * t;
  }
  return LaneTotal(lanes);
}

// A float32 or float16 row read as float32: the row itself (float32) or `buf` holding its widened copy.
NORM_INLINE const float* Widened(const void* base, bool half, int64_t at, int64_t n, float* buf) {
  if (!half) return static_cast<const float*>(base) + at;
  HalfToFloatRow(static_cast<const uint16_t*>(base) + at, buf, n);
  return buf;
}

// Stores a float32 row into `base` at `at` (float16: rounded to nearest even).
NORM_INLINE void Store(const float* v, void* base, bool half, int64_t at, int64_t n) {
  if (half) {
    FloatToHalfRow(v, static_cast<uint16_t*>(base) + at, n);
  } else if (static_cast<float*>(base) + at != v) {
    std::copy(v, v + n, static_cast<float*>(base) + at);
  }
}

struct RowCall {
  RowKind kind;
  bool half;
  int64_t rows, d, skip_rows;
  float eps;
  double eps_d;
  const void *x, *skip;
  const float *bias, *scale, *shift;  // Skip*'s bias added to s; the scale (gamma) and shift (beta) of y
  void *y, *sum;
  float *mean, *inv;
  Sdot64 sdot;  // RMS rows' sum of squares: the BLAS dot the reference's numpy calls (null: SumSquares' lanes)
};

// s = x + skip (+ bias) of row r into `s` (float32).
NORM_INLINE void SkipSum(const RowCall& c, int64_t r, float* s, float* tmp) {
  const float* x = Widened(c.x, c.half, r * c.d, c.d, s);
  const float* k = Widened(c.skip, c.half, (r % c.skip_rows) * c.d, c.d, tmp);
  for (int64_t j = 0; j < c.d; ++j) s[j] = x[j] + k[j];
  if (c.bias != nullptr)
    for (int64_t j = 0; j < c.d; ++j) s[j] += c.bias[j];
}

// One row of LayerNormalization into y: mean, var = E[(x - mean)^2], y = (x - mean) * (1 / sqrt(var + eps)) *
// scale (+ shift).
NORM_INLINE void LayerRow(const RowCall& c, const float* x, float* y, int64_t r) {
  const int64_t d = c.d;
  const float mean = Sum(x, d) / static_cast<float>(d);
  const float var = SumSquares(x, d, mean) / static_cast<float>(d) + c.eps;
  const float inv = 1.0f / std::sqrt(var);
  for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mean) * inv * c.scale[j];
  if (c.shift != nullptr)
    for (int64_t j = 0; j < d; ++j) y[j] += c.shift[j];
  if (c.mean != nullptr) c.mean[r] = mean;
  if (c.inv != nullptr) c.inv[r] = inv;
}

// One row of RMSNormalization: y = (x * scale) * rsqrt(sum(x^2) / d + eps), the rsqrt in double rounded once.
NORM_INLINE void RmsRow(const RowCall& c, const float* x, float* y, int64_t r) {
  const float squares = c.sdot != nullptr ? c.sdot(c.d, x, 1, x, 1) : SumSquares(x, c.d, 0.0f);
  const double ms = static_cast<double>(squares) / static_cast<double>(c.d) + c.eps_d;
  const float inv = static_cast<float>(1.0 / std::sqrt(ms));
  for (int64_t j = 0; j < c.d; ++j) y[j] = x[j] * c.scale[j] * inv;
  if (c.inv != nullptr) c.inv[r] = inv;
}

// One row of SkipLayerNormalization on s, ORT's one-pass statistics: var = E[s^2] - mean^2,
// y = (s - mean) / sqrt(var + eps) * gamma (+ beta).
NORM_INLINE void SkipLayerRow(const RowCall& c, const float* s, float* y, int64_t r) {
  const float n = static_cast<float>(c.d);
  const float mean = Sum(s, c.d) / n;
  const float var = SumSquares(s, c.d, 0.0f) / n - mean * mean;
  const float std = std::sqrt(var + c.eps);
  for (int64_t j = 0; j < c.d; ++j) y[j] = (s[j] - mean) / std * c.scale[j];
  if (c.shift != nullptr)
    for (int64_t j = 0; j < c.d; ++j) y[j] += c.shift[j];
  if (c.mean != nullptr) c.mean[r] = mean;
  if (c.inv != nullptr) c.inv[r] = 1.0f / std;
}

constexpr int64_t kSkipRmsBlock = 16;  // rows whose sequential sums of squares interleave

#if NPU_EP_X86
// total[k] = s_k[0]^2 + s_k[1]^2 + ... summed in order for the n <= 16 rows s_k = s + k * d, row k in lane k: 16 x 16
// tiles transposed in registers, so one vector add per column; a tail tile's missing columns are +0, which leaves a
// sum of squares (+0 or more, or NaN) as it is (lanes from n on sum zeros).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void SquaresInOrder16(const float* s, int64_t d, int64_t n,
                                                                           float* total) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < d; j += 16) {
    const __mmask16 m = static_cast<__mmask16>(d - j >= 16 ? 0xFFFF : (1u << (d - j)) - 1u);
    __m512 r[16];
    for (int k = 0; k < 16; ++k) r[k] = k < n ? _mm512_maskz_loadu_ps(m, s + k * d + j) : _mm512_setzero_ps();
    Transpose16x16Ps(r);
    for (int k = 0; k < 16; ++k) acc = _mm512_add_ps(acc, _mm512_mul_ps(r[k], r[k]));
  }
  _mm512_storeu_ps(total, acc);
}
#endif

// SkipSimplifiedLayerNormalization rows [first, last) with ORT's operations: s = x + skip (+ bias), s^2 summed in
// order in float32, float32 division and sqrt, y = s / rms * gamma. Rows go in blocks of kSkipRmsBlock whose
// sequential sums run side by side (in the lanes on AVX-512), so the adds of different rows overlap instead of each
// waiting on the previous add of its own row; each row's sum is the same sequence, so the bits are ORT's.
template <bool kWide>
NORM_INLINE void SkipRmsRows(const RowCall& c, int64_t first, int64_t last) {
  const int64_t d = c.d;
  float *s = Grow(t_scratch, (kSkipRmsBlock + 2) * d), *tmp = s + kSkipRmsBlock * d, *out = tmp + d;
  for (int64_t r0 = first; r0 < last; r0 += kSkipRmsBlock) {
    const int64_t n = std::min(kSkipRmsBlock, last - r0);
    for (int64_t k = 0; k < n; ++k) {
      SkipSum(c, r0 + k, s + k * d, tmp);
      if (c.sum != nullptr) Store(s + k * d, c.sum, c.half, (r0 + k) * d, d);
    }
    float total[kSkipRmsBlock] = {};
#if NPU_EP_X86
    if (kWide && n > 1) {
      SquaresInOrder16(s, d, n, total);
    } else
#endif
        if (n == kSkipRmsBlock) {
      for (int64_t j = 0; j < d; ++j)
        for (int64_t k = 0; k < kSkipRmsBlock; ++k) total[k] += s[k * d + j] * s[k * d + j];
    } else {
      for (int64_t k = 0; k < n; ++k)
        for (int64_t j = 0; j < d; ++j) total[k] += s[k * d + j] * s[k * d + j];
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t r = r0 + k;
      const float* v = s + k * d;
      const float rms = std::sqrt(total[k] / static_cast<float>(d) + c.eps);
      float* y = c.half ? out : static_cast<float*>(c.y) + r * d;
      for (int64_t j = 0; j < d; ++j) y[j] = v[j] / rms * c.scale[j];
      Store(y, c.y, c.half, r * d, d);
      if (c.mean != nullptr) c.mean[r] = 0.0f;
      if (c.inv != nullptr) c.inv[r] = 1.0f / rms;
    }
  }
}

template <bool kWide = false>
NORM_INLINE void RowsImpl(const RowCall& c, int64_t first, int64_t last) {
  if (c.kind == RowKind::kSkipRms) return SkipRmsRows<kWide>(c, first, last);
  float *in = Grow(t_scratch, 3 * c.d), *tmp = in + c.d, *out = tmp + c.d;
  const bool skip = c.kind == RowKind::kSkipRms || c.kind == RowKind::kSkipLayer;
  for (int64_t r = first; r < last; ++r) {
    const float* x = in;
    if (skip) {
      SkipSum(c, r, in, tmp);
      if (c.sum != nullptr) Store(in, c.sum, c.half, r * c.d, c.d);
    } else {
      x = Widened(c.x, c.half, r * c.d, c.d, in);
    }
    float* y = c.half ? out : static_cast<float*>(c.y) + r * c.d;
    switch (c.kind) {
      case RowKind::kLayer: LayerRow(c, x, y, r); break;
      case RowKind::kRms: RmsRow(c, x, y, r); break;
      case RowKind::kSkipRms: break;  // SkipRmsRows
      case RowKind::kSkipLayer: SkipLayerRow(c, x, y, r); break;
    }
    Store(y, c.y, c.half, r * c.d, c.d);
  }
}

void RowsBase(const RowCall& c, int64_t first, int64_t last) { RowsImpl(c, first, last); }
#if NPU_EP_X86
__attribute__((target("avx2"))) void RowsAvx2(const RowCall& c, int64_t first, int64_t last) {
  RowsImpl(c, first, last);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) void RowsAvx512(const RowCall& c, int64_t first, int64_t last) {
  RowsImpl<true>(c, first, last);
}
#endif

#if NPU_EP_X86
// A float32 vector stored as T (float16 rounded to nearest even, as FloatToHalfRow); loads: LoadFloats16.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline void Store16(T* y, __mmask16 m, __m512 v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __asm__("" : "+v"(h));  // keeps vcvtps2ph's register form: its store form is several times slower on Zen
    _mm256_mask_storeu_epi16(y, m, h);
  } else {
    _mm512_mask_storeu_ps(y, m, v);
  }
}

// LaneTotal of 16 lanes in a register: the same pairwise adds (lanes[k] + lanes[k + w], w = 8, 4, 2, 1).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline float LaneTotal16(__m512 v) {
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)));
}

constexpr int64_t kRmsBlock = 4;  // rows whose scalar steps (a dot call, a division and square root) overlap

// RmsRow's float16 rows on AVX-512, kRmsBlock at a time: x widened 16 halves at a time into the float32 rows the
// sums of squares read, y = (x * scale) * inv rounded to float16 in the lanes (RowsImpl's scratch y row and its
// separate rounding pass left out): the same operations, so the same bits.
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void RmsHalfRowsAvx512(const RowCall& c, int64_t first,
                                                                                 int64_t last) {
  constexpr __mmask16 kAll = 0xFFFF;
  const int64_t d = c.d, full = d & ~int64_t{15};
  const auto tail = static_cast<__mmask16>((1u << (d - full)) - 1u);
  float* in = Grow(t_scratch, kRmsBlock * d);
  for (int64_t r0 = first; r0 < last; r0 += kRmsBlock) {
    const int64_t n = std::min(kRmsBlock, last - r0);
    for (int64_t k = 0; k < n; ++k) {
      const uint16_t* x = static_cast<const uint16_t*>(c.x) + (r0 + k) * d;
      float* w = in + k * d;
      for (int64_t j = 0; j < full; j += 16) _mm512_storeu_ps(w + j, LoadFloats16(x + j, kAll));
      if (tail) _mm512_mask_storeu_ps(w + full, tail, LoadFloats16(x + full, tail));
    }
    float inv[kRmsBlock];
    for (int64_t k = 0; k < n; ++k) {
      const float* w = in + k * d;
      const float squares = c.sdot != nullptr ? c.sdot(d, w, 1, w, 1) : SumSquares(w, d, 0.0f);
      const double ms = static_cast<double>(squares) / static_cast<double>(d) + c.eps_d;
      inv[k] = static_cast<float>(1.0 / std::sqrt(ms));
    }
    for (int64_t k = 0; k < n; ++k) {
      const float* w = in + k * d;
      uint16_t* y = static_cast<uint16_t*>(c.y) + (r0 + k) * d;
      const __m512 iv = _mm512_set1_ps(inv[k]);
      for (int64_t j = 0; j < full; j += 16)
        Store16(y + j, kAll, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(c.scale + j)), iv));
      if (tail)
        Store16(
            y + full, tail,
            _mm512_mul_ps(
                _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, w + full), _mm512_maskz_loadu_ps(tail, c.scale + full)), iv));
      if (c.inv != nullptr) c.inv[r0 + k] = inv[k];
    }
  }
}
#endif

#if NPU_EP_X86
constexpr int64_t kLayerBlock = 4;  // rows whose lane sums interleave

// y[j, j + 16) of one LayerRow: ((x - mean) * inv) * scale (+ shift), rounded to T.
template <typename T, bool kShift>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline void LayerOut16(const RowCall& c, const T* x, T* y,
                                                                                 int64_t j, __mmask16 m, __m512 mean,
                                                                                 __m512 inv) {
  __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(LoadFloats16(x + j, m), mean), inv),
                           _mm512_maskz_loadu_ps(m, c.scale + j));
  if constexpr (kShift) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, c.shift + j));
  Store16(y + j, m, v);
}

// LayerRow's rows on AVX-512, kLayerBlock at a time: each row's sums in its own 16 lanes in Sum's and SumSquares'
// order, its y with LayerRow's operations, so LayerRow's bits; the rows' adds overlap instead of each waiting on the
// previous add of its own row (one vector of lanes per row is a chain of d / 16 dependent adds). x widened in the
// loads and y rounded in the lanes (float16), no scratch rows.
template <typename T, bool kShift>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void LayerRowsAvx512(const RowCall& c, int64_t first,
                                                                               int64_t last) {
  constexpr __mmask16 kAll = 0xFFFF;
  const int64_t d = c.d, full = d & ~int64_t{15};
  const auto tail = static_cast<__mmask16>((1u << (d - full)) - 1u);
  const float fd = static_cast<float>(d);
  for (int64_t r0 = first; r0 < last; r0 += kLayerBlock) {
    const int64_t n = std::min(kLayerBlock, last - r0);
    const T* x0 = static_cast<const T*>(c.x) + r0 * d;  // rows past `last` read row r0 again, their results unused
    const T* x1 = n > 1 ? x0 + d : x0;
    const T* x2 = n > 2 ? x0 + 2 * d : x0;
    const T* x3 = n > 3 ? x0 + 3 * d : x0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < full; j += 16) {
      a0 = _mm512_add_ps(a0, LoadFloats16(x0 + j, kAll)), a1 = _mm512_add_ps(a1, LoadFloats16(x1 + j, kAll));
      a2 = _mm512_add_ps(a2, LoadFloats16(x2 + j, kAll)), a3 = _mm512_add_ps(a3, LoadFloats16(x3 + j, kAll));
    }
    if (tail) {
      a0 = _mm512_mask_add_ps(a0, tail, a0, LoadFloats16(x0 + full, tail));
      a1 = _mm512_mask_add_ps(a1, tail, a1, LoadFloats16(x1 + full, tail));
      a2 = _mm512_mask_add_ps(a2, tail, a2, LoadFloats16(x2 + full, tail));
      a3 = _mm512_mask_add_ps(a3, tail, a3, LoadFloats16(x3 + full, tail));
    }
    const float mean[kLayerBlock] = {LaneTotal16(a0) / fd, LaneTotal16(a1) / fd, LaneTotal16(a2) / fd,
                                     LaneTotal16(a3) / fd};
    const __m512 m0 = _mm512_set1_ps(mean[0]), m1 = _mm512_set1_ps(mean[1]), m2 = _mm512_set1_ps(mean[2]),
                 m3 = _mm512_set1_ps(mean[3]);
    a0 = a1 = a2 = a3 = _mm512_setzero_ps();
    __m512 t0, t1, t2, t3;
    for (int64_t j = 0; j < full; j += 16) {
      t0 = _mm512_sub_ps(LoadFloats16(x0 + j, kAll), m0), t1 = _mm512_sub_ps(LoadFloats16(x1 + j, kAll), m1);
      t2 = _mm512_sub_ps(LoadFloats16(x2 + j, kAll), m2), t3 = _mm512_sub_ps(LoadFloats16(x3 + j, kAll), m3);
      a0 = _mm512_add_ps(a0, _mm512_mul_ps(t0, t0)), a1 = _mm512_add_ps(a1, _mm512_mul_ps(t1, t1));
      a2 = _mm512_add_ps(a2, _mm512_mul_ps(t2, t2)), a3 = _mm512_add_ps(a3, _mm512_mul_ps(t3, t3));
    }
    if (tail) {
      t0 = _mm512_sub_ps(LoadFloats16(x0 + full, tail), m0), t1 = _mm512_sub_ps(LoadFloats16(x1 + full, tail), m1);
      t2 = _mm512_sub_ps(LoadFloats16(x2 + full, tail), m2), t3 = _mm512_sub_ps(LoadFloats16(x3 + full, tail), m3);
      a0 = _mm512_mask_add_ps(a0, tail, a0, _mm512_mul_ps(t0, t0));
      a1 = _mm512_mask_add_ps(a1, tail, a1, _mm512_mul_ps(t1, t1));
      a2 = _mm512_mask_add_ps(a2, tail, a2, _mm512_mul_ps(t2, t2));
      a3 = _mm512_mask_add_ps(a3, tail, a3, _mm512_mul_ps(t3, t3));
    }
    const float squares[kLayerBlock] = {LaneTotal16(a0), LaneTotal16(a1), LaneTotal16(a2), LaneTotal16(a3)};
    for (int64_t k = 0; k < n; ++k) {
      const int64_t r = r0 + k;
      const float inv = 1.0f / std::sqrt(squares[k] / fd + c.eps);
      const __m512 mv = _mm512_set1_ps(mean[k]), iv = _mm512_set1_ps(inv);
      const T* x = x0 + k * d;
      T* y = static_cast<T*>(c.y) + r * d;
      for (int64_t j = 0; j < full; j += 16) LayerOut16<T, kShift>(c, x, y, j, kAll, mv, iv);
      if (tail) LayerOut16<T, kShift>(c, x, y, full, tail, mv, iv);
      if (c.mean != nullptr) c.mean[r] = mean[k];
      if (c.inv != nullptr) c.inv[r] = inv;
    }
  }
}
#endif

// The rows [first, last) on the widest instruction set the host runs (the same bits on each: the 16 lanes).
void RunRows(const RowCall& c, int64_t first, int64_t last) {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512 && c.half && c.kind == RowKind::kRms) return RmsHalfRowsAvx512(c, first, last);
  if (isa >= Isa::kAvx512 && c.kind == RowKind::kLayer)
    return c.half ? (c.shift ? LayerRowsAvx512<uint16_t, true> : LayerRowsAvx512<uint16_t, false>)(c, first, last)
                  : (c.shift ? LayerRowsAvx512<float, true> : LayerRowsAvx512<float, false>)(c, first, last);
  if (isa >= Isa::kAvx512) return RowsAvx512(c, first, last);
  if (isa >= Isa::kAvx2) return RowsAvx2(c, first, last);
#endif
  RowsBase(c, first, last);
}

void RunRowTasks(const RowCall& c, int threads) {
  // SkipSimplified tasks are whole blocks of rows (a partial block sums its rows in fewer lanes)
  const int64_t per_task = c.kind == RowKind::kSkipRms
                               ? kSkipRmsBlock * std::max<int64_t>(1, kTaskElems / (kSkipRmsBlock * c.d))
                               : std::max<int64_t>(1, kTaskElems / std::max<int64_t>(c.d, 1));
  const int64_t tasks = (c.rows + per_task - 1) / per_task;
  const int use = ThreadsFor(threads, c.rows * c.d);
  if (use == 1 || tasks == 1) return RunRows(c, 0, c.rows);  // rows are independent: the same bits
  ParallelFor(use, tasks, [&](int64_t t) { RunRows(c, t * per_task, std::min(c.rows, (t + 1) * per_task)); });
}

std::string Describe(const py::array& a) {
  std::string s = std::string(py::str(a.dtype())) + "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? "," : "") + std::to_string(a.shape(i));
  return s + "]";
}

bool IsHalf(const py::array& x, const char* fn) {
  const char kind = x.dtype().kind();
  const py::ssize_t size = x.itemsize();
  if (kind != 'f' || (size != 2 && size != 4) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order float32 or float16 array, got " + Describe(x));
  return size == 2;
}

// A parameter vector of `n` float32 values (None: nullptr), kept alive in `keep`.
const float* Param(const py::object& v, int64_t n, const char* what, const char* fn, std::vector<Params>& keep) {
  if (v.is_none()) return nullptr;
  keep.push_back(Params::check_(v) ? py::reinterpret_borrow<Params>(v) : Params::ensure(v));  // float32: no call
  if (!keep.back() || keep.back().size() != n)
    throw std::invalid_argument(std::string(fn) + ": " + what + " must hold " + std::to_string(n) + " values");
  return keep.back().data();
}

// The output array like x: `out` (ORT's buffer, checked) or a new one.
py::array OutputLike(const py::array& x, const py::object& out, const char* fn) {
  if (out.is_none()) return py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  auto o = py::reinterpret_borrow<py::array>(out);
  if (!o.dtype().equal(x.dtype()) || o.size() != x.size() || !(o.flags() & py::array::c_style) || !o.writeable())
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " + Describe(x) + ", got " +
                                Describe(o));
  return o;
}

py::object NormRowsPy(const py::array& x, const py::object& skip, const py::object& bias, const py::object& scale,
                      const py::object& shift, int kind, int64_t d, double eps, bool want_mean, bool want_inv,
                      bool want_sum, const py::object& out, int threads, uintptr_t sdot) {
  const char* fn = "norm_rows";
  RowCall c{};
  c.sdot = reinterpret_cast<Sdot64>(sdot);
  c.kind = static_cast<RowKind>(kind);
  c.half = IsHalf(x, fn);
  if (kind < 0 || kind > 3 || d <= 0 || x.size() % d != 0)
    throw std::invalid_argument(std::string(fn) + ": kind " + std::to_string(kind) + " over rows of " +
                                std::to_string(d) + " of " + Describe(x));
  const bool has_skip = c.kind == RowKind::kSkipRms || c.kind == RowKind::kSkipLayer;
  c.rows = x.size() / d;
  c.d = d;
  c.eps = static_cast<float>(eps);
  c.eps_d = eps;
  c.x = x.data();
  std::vector<Params> keep;
  py::array sk = NullArray();
  if (has_skip) {
    sk = py::reinterpret_borrow<py::array>(skip);
    const int64_t n = sk.size();
    if (!sk.dtype().equal(x.dtype()) || !(sk.flags() & py::array::c_style) || n == 0 || n % d != 0 ||
        c.rows % (n / d) != 0)
      throw std::invalid_argument(std::string(fn) + ": skip " + Describe(sk) + " must be C-order rows of " +
                                  std::to_string(d) + " repeating over x " + Describe(x));
    c.skip = sk.data();
    c.skip_rows = n / d;
    c.bias = Param(bias, d, "bias", fn, keep);
  }
  c.scale = Param(scale, d, "scale", fn, keep);
  c.shift = Param(shift, d, "shift", fn, keep);
  if (c.scale == nullptr) throw std::invalid_argument(std::string(fn) + ": scale is required");
  py::array y = OutputLike(x, out, fn);
  c.y = y.mutable_data();
  py::object mean = py::none(), inv = py::none(), sum = py::none();
  if (want_mean) {
    auto a = py::array_t<float>(c.rows);
    c.mean = a.mutable_data();
    mean = a;
  }
  if (want_inv) {
    auto a = py::array_t<float>(c.rows);
    c.inv = a.mutable_data();
    inv = a;
  }
  if (want_sum && has_skip) {
    auto a = py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
    c.sum = a.mutable_data();
    sum = a;
  }
  if (x.size() < kTaskElems) {  // a few microseconds at most: not worth handing the GIL over
    RunRowTasks(c, threads);
  } else {
    py::gil_scoped_release release;
    RunRowTasks(c, threads);
  }
  return py::make_tuple(y, mean, inv, sum);
}

struct ChannelCall {
  ChannelKind kind;
  bool half;
  int64_t n, c, groups, spatial;
  float eps;
  const void* x;
  const float *scale, *shift;  // per channel (BatchNorm: the folded a and b)
  void* y;
};

// BatchNorm's plane p (of n * c): y = x * a[ch] + b[ch].
NORM_INLINE void AffinePlane(const ChannelCall& k, int64_t p, float* buf) {
  const int64_t ch = p % k.c, at = p * k.spatial;
  const float* x = Widened(k.x, k.half, at, k.spatial, buf);
  float* y = k.half ? buf : static_cast<float*>(k.y) + at;
  const float a = k.scale[ch], b = k.shift[ch];
  for (int64_t j = 0; j < k.spatial; ++j) y[j] = x[j] * a + b;
  Store(y, k.y, k.half, at, k.spatial);
}

// Group g of image i (row r = i * groups + g, its c / groups channels contiguous): mean, var = E[(x - mean)^2],
// y = (x - mean) / sqrt(var + eps) * scale[ch] + shift[ch].
NORM_INLINE void GroupRow(const ChannelCall& k, int64_t r, float* buf) {
  const int64_t per = k.c / k.groups, len = per * k.spatial, at = r * len;
  const float* x = Widened(k.x, k.half, at, len, buf);
  const float mean = Sum(x, len) / static_cast<float>(len);
  const float std = std::sqrt(SumSquares(x, len, mean) / static_cast<float>(len) + k.eps);
  float* y = k.half ? buf : static_cast<float*>(k.y) + at;
  const int64_t ch0 = (r % k.groups) * per;
  for (int64_t q = 0; q < per; ++q) {
    const float a = k.scale[ch0 + q], b = k.shift[ch0 + q];
    const float* xs = x + q * k.spatial;
    float* ys = y + q * k.spatial;
    for (int64_t j = 0; j < k.spatial; ++j) ys[j] = (xs[j] - mean) / std * a + b;
  }
  Store(y, k.y, k.half, at, len);
}

NORM_INLINE void ChannelsImpl(const ChannelCall& k, bool affine, int64_t first, int64_t last, float* buf) {
  for (int64_t u = first; u < last; ++u) {
    if (affine) {
      AffinePlane(k, u, buf);
    } else {
      GroupRow(k, u, buf);
    }
  }
}

void ChannelsBase(const ChannelCall& k, bool affine, int64_t first, int64_t last, float* buf) {
  ChannelsImpl(k, affine, first, last, buf);
}
#if NPU_EP_X86
__attribute__((target("avx2"))) void ChannelsAvx2(const ChannelCall& k, bool affine, int64_t first, int64_t last,
                                                  float* buf) {
  ChannelsImpl(k, affine, first, last, buf);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) void ChannelsAvx512(const ChannelCall& k, bool affine,
                                                                         int64_t first, int64_t last, float* buf) {
  ChannelsImpl(k, affine, first, last, buf);
}
#endif

// Planes or groups [first, last) on the widest instruction set the host runs (the same bits on each).
void RunChannels(const ChannelCall& k, bool affine, int64_t first, int64_t last, float* buf) {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return ChannelsAvx512(k, affine, first, last, buf);
  if (isa >= Isa::kAvx2) return ChannelsAvx2(k, affine, first, last, buf);
#endif
  ChannelsBase(k, affine, first, last, buf);
}

void RunChannelTasks(const ChannelCall& k, int threads) {
  const bool affine = k.kind == ChannelKind::kAffine;
  const int64_t units = affine ? k.n * k.c : k.n * k.groups;
  const int64_t len = affine ? k.spatial : k.c / k.groups * k.spatial;
  const int64_t per_task = std::max<int64_t>(1, kTaskElems / std::max<int64_t>(len, 1));
  const int64_t tasks = (units + per_task - 1) / per_task;
  const int use = ThreadsFor(threads, units * len);
  if (use == 1 || tasks == 1) return RunChannels(k, affine, 0, units, Grow(t_scratch, k.half ? len : 0));
  ParallelFor(use, tasks, [&](int64_t t) {
    float* buf = Grow(t_scratch, k.half ? len : 0);
    RunChannels(k, affine, t * per_task, std::min(units, (t + 1) * per_task), buf);
  });
}

py::array NormChannelsPy(const py::array& x, const py::object& scale, const py::object& shift, int kind, int64_t groups,
                         double eps, const py::object& out, int threads) {
  const char* fn = "norm_channels";
  ChannelCall k{};
  k.kind = static_cast<ChannelKind>(kind);
  k.half = IsHalf(x, fn);
  if (x.ndim() < 2 || (kind != 0 && kind != 1) || (kind == 1 && (groups <= 0 || x.shape(1) % groups != 0)))
    throw std::invalid_argument(std::string(fn) + ": kind " + std::to_string(kind) + " with " + std::to_string(groups) +
                                " groups over x " + Describe(x) +
                                " (needs [N, C, ...] with C divisible by the groups)");
  k.n = x.shape(0);
  k.c = x.shape(1);
  k.groups = kind == 1 ? groups : k.c;
  k.spatial = k.n * k.c == 0 ? 0 : x.size() / (k.n * k.c);
  k.eps = static_cast<float>(eps);
  k.x = x.data();
  std::vector<Params> keep;
  k.scale = Param(scale, k.c, "scale", fn, keep);
  k.shift = Param(shift, k.c, "shift", fn, keep);
  if (k.scale == nullptr || k.shift == nullptr)
    throw std::invalid_argument(std::string(fn) + ": needs scale and shift");
  py::array y = OutputLike(x, out, fn);
  k.y = y.mutable_data();
  if (x.size() == 0) return y;
  if (x.size() < kTaskElems) {
    RunChannelTasks(k, threads);
  } else {
    py::gil_scoped_release release;
    RunChannelTasks(k, threads);
  }
  return y;
}

}  // namespace

void BindNorm(py::module_& m) {
  m.def(
      "norm_rows", &NormRowsPy, py::arg("x"), py::arg("skip"), py::arg("bias"), py::arg("scale"), py::arg("shift"),
      py::arg("kind"), py::arg("d"), py::arg("eps"), py::arg("want_mean") = false, py::arg("want_inv") = false,
      py::arg("want_sum") = false, py::arg("out") = py::none(), py::arg("threads") = 1, py::arg("sdot") = 0,
      "(y, mean | None, inv_std_var | None, sum | None) of x (C-order float32/float16) viewed as rows of d, "
      "kind 0 LayerNormalization, 1 RMS/SimplifiedLayerNormalization, 2 SkipSimplifiedLayerNormalization, "
      "3 SkipLayerNormalization (skip: x's dtype, rows repeating over x; bias added to the sum); scale/shift/bias: "
      "d values (float32); statistics: float32 per row; sum: x + skip (+ bias) in x's dtype; y into out or new; sdot: "
      "the address of a BLAS sdot for kind 1's sum of squares (0: the kernel's own lanes)");
  m.def("norm_channels", &NormChannelsPy, py::arg("x"), py::arg("scale"), py::arg("shift"), py::arg("kind"),
        py::arg("groups"), py::arg("eps"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "x [N, C, ...] (C-order float32/float16): kind 0 y = x * scale[c] + shift[c] (inference BatchNormalization, "
        "folded), kind 1 each (n, group) normalized (float32 statistics, eps) then scaled and shifted per channel "
        "(Instance/GroupNormalization); into out or a new array");
}

}  // namespace npu_ep::kern
