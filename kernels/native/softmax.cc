// Softmax over the last axis of a float32 array (`kernels.softmax_last_axis`), and Softmax or LogSoftmax over any
// axis of float32 or float16 (`kernels.softmax_axis`: x viewed as [outer, n, inner], normalized over n, no
// transpose; float16 widened per task, computed in float32, rounded once), the native
// kernels behind kernels/ops/softmax.py. Rows (inner 1): one pass per row (max, exp and sum, then the scaling);
// columns (inner > 1): 16 columns at a time walked down the n rows. Fixed tasks on up to `threads` threads, so the
// bits do not depend on the thread count. An exported decoder's prefill materializes its attention scores (8 heads
// x 512 x 512 per layer); numpy's five passes over them on one core were 10-20% of the prefill. The exp is a
// polynomial of its own (Cephes' expf: within 2 ulp; on AVX-512 the same polynomial with fused multiply-adds), so
// results match the reference model within float tolerance, not bit for bit; a softmax holding a NaN or an infinite
// maximum is NaN, as the reference's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // the scalar tail and the SSE2 lanes: the same operations, the same bits
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr float kExpLow = -87.33654f;  // below this exp(x) is under float32's smallest normal: 0 here
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// ThreadsFor's work per element: an exp and three passes (a 128 x 384 softmax, ORT's medium case, pays for a second
// thread, as ORT's CPU EP splits it).
constexpr int64_t kWorkPerElement = 32;

// exp(x) for x <= 0, never NaN (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r, times 2^n);
// 0 below kExpLow. The SSE2 lanes below do these very operations in this order: the same bits on every host.
inline float ExpNonPositive(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  const float fn = xc * kLog2e + 0.5f;
  float nf = static_cast<float>(static_cast<int32_t>(fn));  // truncation, then floor (fn < 0.5 here)
  if (nf > fn) nf -= 1.0f;
  const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = p * r + kP[i];
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;  // 2^n: n >= -126 after the clamp
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < kExpLow ? 0.0f : p * scale;
}

#if defined(__SSE2__)
inline __m128 Exp4(__m128 x) {
  const __m128 low = _mm_set1_ps(kExpLow), one = _mm_set1_ps(1.0f);
  const __m128 xc = _mm_max_ps(x, low);
  const __m128 fn = _mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(kLog2e)), _mm_set1_ps(0.5f));
  __m128 nf = _mm_cvtepi32_ps(_mm_cvttps_epi32(fn));
  nf = _mm_sub_ps(nf, _mm_and_ps(_mm_cmpgt_ps(nf, fn), one));
  const __m128 r = _mm_sub_ps(_mm_sub_ps(xc, _mm_mul_ps(nf, _mm_set1_ps(kLn2Hi))), _mm_mul_ps(nf, _mm_set1_ps(kLn2Lo)));
  __m128 p = _mm_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(kP[i]));
  p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(r, r)), r), one);
  const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nf), _mm_set1_epi32(127)), 23));
  return _mm_andnot_ps(_mm_cmplt_ps(x, low), _mm_mul_ps(p, scale));
}
#endif

#if NPU_EP_X86
// Exp4's polynomial on 16 lanes with fused multiply-adds (fewer operations and roundings: within the same 2 ulp of
// exp, its bits may differ from Exp4's by an ulp): 0 below kExpLow.
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(kExpLow), one = _mm512_set1_ps(1.0f);
  const __m512 xc = _mm512_max_ps(x, low);
  const __m512 fn = _mm512_fmadd_ps(xc, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f));
  const __m512 nf = _mm512_roundscale_ps(fn, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Hi), xc));
  __m512 p = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), one);
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, low, _CMP_NLT_UQ), p, nf);  // p 2^n
}

inline __mmask16 Lanes16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1); }
#endif

void SoftmaxRow(const float* x, int64_t n, float* y) {
  float m = x[0];
  bool nan = false;
  int64_t j = 0;
#if defined(__SSE2__)
  __m128 vm = _mm_set1_ps(x[0]), vnan = _mm_setzero_ps();
  for (; j + 4 <= n; j += 4) {
    const __m128 v = _mm_loadu_ps(x + j);
    vnan = _mm_or_ps(vnan, _mm_cmpunord_ps(v, v));
    vm = _mm_max_ps(vm, v);
  }
  alignas(16) float lanes4[4];
  _mm_store_ps(lanes4, vm);
  for (float v : lanes4) m = v > m ? v : m;
  nan = _mm_movemask_ps(vnan) != 0;
#endif
  for (; j < n; ++j) {
    nan |= x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  if (nan || std::isinf(m)) {  // the reference: x - max has a NaN, so the row's sum and every value are NaN
    std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight running sums (element j in lane j % 8), added pairwise at the end
  j = 0;
#if defined(__SSE2__)
  const __m128 vmax = _mm_set1_ps(m);
  __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m128 e0 = Exp4(_mm_sub_ps(_mm_loadu_ps(x + j), vmax));
    const __m128 e1 = Exp4(_mm_sub_ps(_mm_loadu_ps(x + j + 4), vmax));
    _mm_storeu_ps(y + j, e0);
    _mm_storeu_ps(y + j + 4, e1);
    s0 = _mm_add_ps(s0, e0);
    s1 = _mm_add_ps(s1, e1);
  }
  _mm_storeu_ps(lanes, s0);
  _mm_storeu_ps(lanes + 4, s1);
#endif
  for (; j < n; ++j) {
    y[j] = ExpNonPositive(x[j] - m);
    lanes[j % 8] += y[j];
  }
  const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  j = 0;
#if defined(__SSE2__)
  const __m128 vsum = _mm_set1_ps(sum);
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(y + j, _mm_div_ps(_mm_loadu_ps(y + j), vsum));
#endif
  for (; j < n; ++j) y[j] /= sum;
}

// The maximum of a row, and whether it holds a NaN.
float RowMaximum(const float* x, int64_t n, bool* nan) {
  float m = x[0];
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    has_nan |= x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  *nan = has_nan;
  return m;
}

// LogSoftmax of one row: (x - max) - log(sum(exp(x - max))), as the reference; a row holding a NaN or an infinite
// maximum is NaN (the reference: x - max has a NaN there).
void LogSoftmaxRow(const float* x, int64_t n, float* y) {
  bool nan = false;
  const float m = RowMaximum(x, n, &nan);
  if (nan || std::isinf(m)) {
    std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
#if defined(__SSE2__)
  const __m128 vmax = _mm_set1_ps(m);
  __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    s0 = _mm_add_ps(s0, Exp4(_mm_sub_ps(_mm_loadu_ps(x + j), vmax)));
    s1 = _mm_add_ps(s1, Exp4(_mm_sub_ps(_mm_loadu_ps(x + j + 4), vmax)));
  }
  _mm_storeu_ps(lanes, s0);
  _mm_storeu_ps(lanes + 4, s1);
#endif
  for (; j < n; ++j) lanes[j % 8] += ExpNonPositive(x[j] - m);
  const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  const float log_sum = std::log(sum);
  for (j = 0; j < n; ++j) y[j] = (x[j] - m) - log_sum;
}

#if NPU_EP_X86
// Softmax (or LogSoftmax: `log`) of one row, 16 lanes per step with a masked tail: the maximum, exp (Exp16, stored
// for softmax) with two running sums per lane (element j in sum (j / 16) % 2, lane j % 16; their sum added by halves
// at the end: two vectors in flight hide the exp's latency), then the product with 1 / sum (a division's throughput
// would bound the row; one more rounding) or (x - max) - log(sum); a row holding a NaN or an infinite maximum is
// NaN, as the reference's.
__attribute__((target("avx512f"))) void SoftmaxRowAvx512(const float* x, int64_t n, bool log, float* y) {
  __m512 m0 = _mm512_set1_ps(x[0]), m1 = m0;
  __mmask16 nan = 0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
    nan |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(v0, m0);
    m1 = _mm512_max_ps(v1, m1);
  }
  for (; j < n; j += 16) {
    const __mmask16 k = Lanes16(n - j);
    const __m512 v = _mm512_mask_loadu_ps(m0, k, x + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(v, m0);
  }
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  if (nan || std::isinf(m)) {
    std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const __m512 vm = _mm512_set1_ps(m);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
    const __m512 e1 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), vm));
    if (!log) {
      _mm512_storeu_ps(y + j, e0);
      _mm512_storeu_ps(y + j + 16, e1);
    }
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  if (j < n) {  // the last 1..31 elements: a full or masked vector into s0, a masked one into s1
    const __mmask16 k0 = Lanes16(n - j), k1 = Lanes16(n - j - 16);
    const __m512 e0 = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, x + j), vm));
    if (!log) _mm512_mask_storeu_ps(y + j, k0, e0);
    s0 = _mm512_mask_add_ps(s0, k0, s0, e0);
    if (k1) {
      const __m512 e1 = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, x + j + 16), vm));
      if (!log) _mm512_mask_storeu_ps(y + j + 16, k1, e1);
      s1 = _mm512_mask_add_ps(s1, k1, s1, e1);
    }
  }
  const float total = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  const __m512 scale = _mm512_set1_ps(log ? std::log(total) : 1.0f / total);
  j = 0;
  if (log) {
    for (; j + 16 <= n; j += 16)
      _mm512_storeu_ps(y + j, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm), scale));
  } else {
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), scale));
  }
  if (j < n) {
    const __mmask16 k = Lanes16(n - j);
    const __m512 v = log ? _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm), scale)
                         : _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + j), scale);
    _mm512_mask_storeu_ps(y + j, k, v);
  }
}
#endif

// A row's softmax (log: LogSoftmax) on the host's widest path.
void NormalizeRow(const float* x, int64_t n, bool log, float* y) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return SoftmaxRowAvx512(x, n, log, y);
#endif
  (log ? LogSoftmaxRow : SoftmaxRow)(x, n, y);
}

// Softmax (or LogSoftmax: `log`) over the n rows of `cols` columns of x (rows `stride` apart): one column's values
// are one softmax. Scalar, column by column.
void SoftmaxColumnsScalar(const float* x, int64_t n, int64_t stride, int64_t cols, bool log, float* y) {
  for (int64_t c = 0; c < cols; ++c) {
    float m = x[c];
    bool nan = false;
    for (int64_t r = 0; r < n; ++r) {
      const float v = x[r * stride + c];
      nan |= v != v;
      m = v > m ? v : m;
    }
    if (nan || std::isinf(m)) {
      for (int64_t r = 0; r < n; ++r) y[r * stride + c] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float sum = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      const float e = ExpNonPositive(x[r * stride + c] - m);
      if (!log) y[r * stride + c] = e;
      sum += e;
    }
    const float log_sum = log ? std::log(sum) : 0.0f;
    for (int64_t r = 0; r < n; ++r)
      y[r * stride + c] = log ? (x[r * stride + c] - m) - log_sum : y[r * stride + c] / sum;
  }
}

#if NPU_EP_X86
// The same, 16 columns per step (the rows walked down each block of columns three times: maximum, exp and sum,
// scale), the scalar's operations lane by lane but the division: a product with 1 / sum (one more rounding).
__attribute__((target("avx512f"))) void SoftmaxColumnsAvx512(const float* x, int64_t n, int64_t stride, int64_t cols,
                                                             bool log, float* y) {
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 k = Lanes16(cols - c);
    __m512 m = _mm512_maskz_loadu_ps(k, x + c);
    __mmask16 bad = 0;
    for (int64_t r = 0; r < n; ++r) {
      const __m512 v = _mm512_maskz_loadu_ps(k, x + r * stride + c);
      bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_max_ps(v, m);  // v > m ? v : m, NaN lanes marked above
    }
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(m), inf, _CMP_EQ_OQ);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t r = 0; r < n; ++r) {
      const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + r * stride + c), m));
      if (!log) _mm512_mask_storeu_ps(y + r * stride + c, k, e);
      sum = _mm512_add_ps(sum, e);
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, sum);
    for (float& v : sums) v = log ? std::log(v) : 1.0f / v;
    const __m512 scale = _mm512_load_ps(sums), nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < n; ++r) {
      float* out = y + r * stride + c;
      const __m512 v = log ? _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + r * stride + c), m), scale)
                           : _mm512_mul_ps(_mm512_maskz_loadu_ps(k, out), scale);
      _mm512_mask_storeu_ps(out, k, _mm512_mask_mov_ps(v, bad, nan));
    }
  }
}
#endif

void SoftmaxColumns(const float* x, int64_t n, int64_t stride, int64_t cols, bool log, float* y) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return SoftmaxColumnsAvx512(x, n, stride, cols, log, y);
#endif
  SoftmaxColumnsScalar(x, n, stride, cols, log, y);
}

// Softmax (log: LogSoftmax) of x viewed as [outer, n, inner] over n, into y: rows (inner 1) in tasks of 32, else
// blocks of 64 columns of one outer index per task (fixed tasks: the bits do not depend on the thread count).
// `Row`(task's first row, rows) and `Block`(offset of a column block, columns) run one task's share.
template <typename RowFn, typename BlockFn>
void NormalizeTasks(int64_t outer, int64_t n, int64_t inner, int threads, RowFn row, BlockFn block) {
  const int use = ThreadsFor(threads, outer * n * inner * kWorkPerElement);
  if (inner == 1) {
    constexpr int64_t kRowsPerTask = 32;
    ParallelFor(use, (outer + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
      const int64_t r = t * kRowsPerTask;
      row(r, std::min(outer, r + kRowsPerTask) - r);
    });
    return;
  }
  constexpr int64_t kColumnsPerTask = 64;
  const int64_t blocks = (inner + kColumnsPerTask - 1) / kColumnsPerTask;
  ParallelFor(use, outer * blocks, [&](int64_t t) {
    const int64_t o = t / blocks, c = (t % blocks) * kColumnsPerTask;
    block(o * n * inner + c, std::min(kColumnsPerTask, inner - c));
  });
}

void SoftmaxAxisFloat(const float* src, int64_t outer, int64_t n, int64_t inner, bool log, int threads, float* dst) {
  NormalizeTasks(
      outer, n, inner, threads,
      [&](int64_t r0, int64_t rows) {
        for (int64_t r = r0; r < r0 + rows; ++r) NormalizeRow(src + r * n, n, log, dst + r * n);
      },
      [&](int64_t at, int64_t cols) { SoftmaxColumns(src + at, n, inner, cols, log, dst + at); });
}

// float16: each task widens its rows (or its block of columns, packed `cols` wide) into float32, normalizes them with
// the float32 kernels and rounds each result once to float16, as the reference (float32 math, one astype).
void SoftmaxAxisHalf(const uint16_t* src, int64_t outer, int64_t n, int64_t inner, bool log, int threads,
                     uint16_t* dst) {
  NormalizeTasks(
      outer, n, inner, threads,
      [&](int64_t r0, int64_t rows) {
        std::vector<float> in(n), out(n);
        for (int64_t r = r0; r < r0 + rows; ++r) {
          HalfToFloatRow(src + r * n, in.data(), n);
          NormalizeRow(in.data(), n, log, out.data());
          FloatToHalfRow(out.data(), dst + r * n, n);
        }
      },
      [&](int64_t at, int64_t cols) {
        std::vector<float> in(n * cols), out(n * cols);
        for (int64_t r = 0; r < n; ++r) HalfToFloatRow(src + at + r * inner, in.data() + r * cols, cols);
        SoftmaxColumns(in.data(), n, cols, cols, log, out.data());
        for (int64_t r = 0; r < n; ++r) FloatToHalfRow(out.data() + r * cols, dst + at + r * inner, cols);
      });
}

// x (float32 or float16) viewed as [outer, n, inner], normalized over n (NormalizeTasks), into out when given.
py::array SoftmaxAxisPy(const py::array& x, int64_t outer, int64_t n, int64_t inner, bool log, int threads,
                        const py::object& out) {
  const py::dtype dt = x.dtype();
  const bool f32 = dt.equal(py::dtype::of<float>()), f16 = dt.kind() == 'f' && dt.itemsize() == 2;
  if ((!f32 && !f16) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("softmax_axis: x must be a C-contiguous float32 or float16 array, got " +
                                std::string(py::str(x.dtype())));
  if (outer < 0 || n <= 0 || inner <= 0 || outer * n * inner != static_cast<int64_t>(x.size()))
    throw std::invalid_argument("softmax_axis: [outer, n, inner] = [" + std::to_string(outer) + ", " +
                                std::to_string(n) + ", " + std::to_string(inner) + "] does not cover x's " +
                                std::to_string(x.size()) + " elements");
  py::array y = MovementResult("softmax_axis", x.dtype(), DimsOf(x), out);
  const void* src = x.data();
  void* dst = y.mutable_data();
  RunMoving(static_cast<size_t>(x.nbytes()), [&] {
    if (f32)
      SoftmaxAxisFloat(static_cast<const float*>(src), outer, n, inner, log, threads, static_cast<float*>(dst));
    else
      SoftmaxAxisHalf(static_cast<const uint16_t*>(src), outer, n, inner, log, threads, static_cast<uint16_t*>(dst));
  });
  return y;
}

py::array SoftmaxLastAxisPy(const py::array_t<float, py::array::c_style>& x, int threads, const py::object& out) {
  if (x.ndim() < 1) throw std::invalid_argument("softmax_last_axis: x must have rank >= 1");
  const int64_t n = x.shape(x.ndim() - 1), rows = n > 0 ? x.size() / n : 0;
  py::array y = MovementResult("softmax_last_axis", x.dtype(), DimsOf(x), out);
  const float* src = x.data();
  float* dst = static_cast<float*>(y.mutable_data());
  if (rows > 0) {
    RunMoving(static_cast<size_t>(x.nbytes()), [&] {
      constexpr int64_t kRowsPerTask = 32;
      ParallelFor(ThreadsFor(threads, rows * n * kWorkPerElement), (rows + kRowsPerTask - 1) / kRowsPerTask,
                  [&](int64_t t) {
                    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r)
                      NormalizeRow(src + r * n, n, false, dst + r * n);
                  });
    });
  }
  return y;
}

}  // namespace

void BindSoftmax(py::module_& m) {
  m.def("softmax_last_axis", &SoftmaxLastAxisPy, py::arg("x"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "softmax over the last axis of C-contiguous float32 x in one pass per row, rows on up to `threads` "
        "threads (the same bits at any count); its own exp (within 2 ulp): the reference model's within float "
        "tolerance; a row holding a NaN or an infinite maximum is NaN, as the reference's; into out (ORT's buffer: "
        "writeable, C-order, x's dtype and size) when given");
  m.def("softmax_axis", &SoftmaxAxisPy, py::arg("x"), py::arg("outer"), py::arg("n"), py::arg("inner"),
        py::arg("log") = false, py::arg("threads") = 1, py::arg("out") = py::none(),
        "softmax (log: LogSoftmax) of C-contiguous float32 or float16 (float32 math, one rounding) x viewed as [outer, "
        "n, inner] over its n axis, in place "
        "(no transpose): rows when inner is 1, else columns 16 at a time; the same exp as softmax_last_axis, the "
        "same bits at any thread count; a NaN or an infinite maximum makes its softmax NaN, as the reference's; into "
        "out (ORT's buffer: writeable, C-order, x's dtype and size) when given");
}

}  // namespace npu_ep::kern
