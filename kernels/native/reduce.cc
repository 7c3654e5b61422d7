// Integer ReduceSum over trailing axes (`kernels.reduce_sum_int`), for the bound step of kernels/ops/reduce.py; float32
// row maxima (`kernels.reduce_max_rows`: ReduceMax over trailing axes, GlobalMaxPool, exact: a maximum rounds nothing);
// float32/float16 sums, means, maxima, minima, products, sums of squares, L1 and L2 norms and integer maxima and
// minima over any one run of axes
// (`kernels.reduce_axis`, below); ArgMax/ArgMin over one axis (`kernels.arg_extreme`).
// The reference accumulates integer sums in float64 and saturates at the type's limits, as ORT's CPU kernel does.
// Where every partial sum is an integer below 2^53 in magnitude (the row's sum of |x| is), float64 adds exactly in
// any order, so the exact integer sum, saturated, has the reference's bits; any other row makes the call return None
// and the reference runs. A decoder's attention-mask sum is the case that matters: one call instead of five numpy
// calls. Rows are summed in int64 in vector lanes (int32 rows shorter than 2^22 need no magnitude check), tasks of
// rows over the threads.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // reduce_axis's lane and column loops vectorize
// No fused multiply-add in a sum of squares (GCC's default contracts where the target has FMA, as the AVX-512
// builds do): x * x rounded, then added, as the reference's multiply and add.reduce, on every ISA.
#pragma GCC optimize("fp-contract=off")
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <string>
#include <stdexcept>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "ordered_dtypes.h"
#include "intrinsics.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr uint64_t kExact = uint64_t{1} << 53;  // float64 holds every integer below this
constexpr int64_t kMagnitudeChunk = 1024;  // 1024 magnitudes below 2^53 sum below 2^63: no uint64 overflow

// The sum of row[0, cols), exact in int64 when every partial sum of |x| stays below 2^53 (then float64 adds
// exactly in any order); false where it does not. Checked = false: int32 rows shorter than 2^22 (their sum of |x|
// stays below 2^53). Chunks check the magnitudes with one OR and one sum each, so the loops vectorize.
template <bool Checked, typename T>
inline __attribute__((always_inline)) bool SumRowBody(const T* row, int64_t cols, int64_t* out) {
  if constexpr (!Checked) {
    int64_t sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += row[c];
    *out = sum;
    return true;
  } else {
    uint64_t sum = 0, magnitude = 0;  // the sum wraps as two's complement: exact once |sum| < 2^53
    for (int64_t c0 = 0; c0 < cols; c0 += kMagnitudeChunk) {
      const int64_t c1 = std::min(cols, c0 + kMagnitudeChunk);
      uint64_t bits = 0, chunk = 0;
      for (int64_t c = c0; c < c1; ++c) {
        const uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(row[c]));
        const uint64_t a = static_cast<int64_t>(v) < 0 ? uint64_t{0} - v : v;
        bits |= a, chunk += a, sum += v;
      }
      if (bits >= kExact || (magnitude += chunk) >= kExact) return false;
    }
    *out = static_cast<int64_t>(sum);
    return true;
  }
}

template <bool Checked, typename T>
inline __attribute__((always_inline)) bool SumRowsBody(const T* x, int64_t r0, int64_t r1, int64_t cols, T* y) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t sum;
    if (!SumRowBody<Checked>(x + r * cols, cols, &sum)) return false;
    y[r] = static_cast<T>(std::clamp<int64_t>(sum, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  }
  return true;
}

template <bool Checked, typename T>
bool SumRowsBase(const T* x, int64_t r0, int64_t r1, int64_t cols, T* y) {
  return SumRowsBody<Checked>(x, r0, r1, cols, y);
}
#if NPU_EP_X86
template <bool Checked, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) bool SumRowsAvx512(const T* x, int64_t r0, int64_t r1,
                                                                        int64_t cols, T* y) {
  return SumRowsBody<Checked>(x, r0, r1, cols, y);
}
template <bool Checked, typename T>
__attribute__((target("avx2"))) bool SumRowsAvx2(const T* x, int64_t r0, int64_t r1, int64_t cols, T* y) {
  return SumRowsBody<Checked>(x, r0, r1, cols, y);
}
#endif

template <bool Checked, typename T>
bool SumRows(const T* x, int64_t r0, int64_t r1, int64_t cols, T* y) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return SumRowsAvx512<Checked>(x, r0, r1, cols, y);
  if (ActiveIsa() >= Isa::kAvx2) return SumRowsAvx2<Checked>(x, r0, r1, cols, y);
#endif
  return SumRowsBase<Checked>(x, r0, r1, cols, y);
}

// Row sums of x [rows, cols] into y, saturated to T, tasks of rows over the threads (rows are independent: the
// same bits at any thread count); false if a row's sum of |x| reaches 2^53.
template <typename T>
bool SumRowsSplit(const T* x, int64_t rows, int64_t cols, int threads, T* y) {
  const bool checked = !std::is_same_v<T, int32_t> || cols >= (int64_t{1} << 22);
  const int64_t rows_per_task = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  std::atomic<bool> exact{true};
  ParallelFor(ThreadsFor(threads, rows * cols), (rows + rows_per_task - 1) / rows_per_task, [&](int64_t t) {
    const int64_t r0 = t * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
    if (exact.load(std::memory_order_relaxed) &&
        !(checked ? SumRows<true>(x, r0, r1, cols, y) : SumRows<false>(x, r0, r1, cols, y)))
      exact.store(false, std::memory_order_relaxed);
  });
  return exact.load();
}

template <typename T>
py::object Reduce(const py::array& x, int threads) {
  const int64_t rows = x.shape(0), cols = x.shape(1);
  py::array_t<T> y(std::vector<py::ssize_t>{rows});
  const T* src = static_cast<const T*>(x.data());
  T* dst = y.mutable_data();
  bool exact;
  {
    py::gil_scoped_release release;
    exact = SumRowsSplit(src, rows, cols, threads, dst);
  }
  if (!exact) return py::none();
  return std::move(y);
}

py::object ReduceSumIntPy(const py::array& x, int threads) {
  if (x.ndim() != 2 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("reduce_sum_int: x must be a C-contiguous [rows, cols] array");
  if (x.dtype().is(py::dtype::of<int32_t>())) return Reduce<int32_t>(x, threads);
  if (x.dtype().is(py::dtype::of<int64_t>())) return Reduce<int64_t>(x, threads);
  throw std::invalid_argument("reduce_sum_int: x must be int32 or int64, got " + std::string(py::str(x.dtype())));
}

// A float ReduceMean as the reference computes it: numpy's add.reduce (passed in: its pairwise sums and their
// bits), then every sum divided by the element count in place, one correctly rounded division in the array's
// dtype each, as numpy's y / count.
py::object ReduceMeanFloatPy(const py::object& add_reduce, const py::array& x, const py::object& axes, bool keepdims,
                             int64_t count) {
  const bool f32 = x.dtype().equal(py::dtype::of<float>()), f64 = x.dtype().equal(py::dtype::of<double>());
  if (!f32 && !f64) throw std::invalid_argument("reduce_mean_float: x must be float32 or float64");
  if (count <= 0 || (f32 && count > (int64_t{1} << 24)))
    throw std::invalid_argument("reduce_mean_float: count " + std::to_string(count) + " out of range");
  py::object r = add_reduce(x, py::arg("axis") = axes, py::arg("dtype") = x.dtype(), py::arg("keepdims") = keepdims);
  if (!py::isinstance<py::array>(r)) return py::none();  // a numpy scalar (0-d result): the reference runs
  auto y = py::reinterpret_borrow<py::array>(r);
  if (!(y.flags() & (py::array::c_style | py::array::f_style)) || !y.writeable() || !y.dtype().equal(x.dtype()))
    return py::none();  // sums not in one contiguous run: the reference runs
  const int64_t n = y.size();
  if (f32) {
    float* v = static_cast<float*>(y.mutable_data());
    const auto c = static_cast<float>(count);
    for (int64_t i = 0; i < n; ++i) v[i] /= c;
  } else {
    double* v = static_cast<double*>(y.mutable_data());
    const auto c = static_cast<double>(count);
    for (int64_t i = 0; i < n; ++i) v[i] /= c;
  }
  return std::move(y);
}

// The maximum of x[0, n) (n >= 1), NaN if any is NaN (numpy's maximum); -0.0 and +0.0 in either order.
float MaxOfRowScalar(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != x[i]) return x[i];
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) float MaxOfRowAvx512(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = ninf, m1 = ninf;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);  // a NaN in either
    m0 = _mm512_max_ps(a, m0), m1 = _mm512_max_ps(b, m1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 a = _mm512_mask_loadu_ps(ninf, k, x + i);
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(a, m0);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
#endif

// Row maxima of a float32 [rows, cols] array (cols >= 1): GlobalMaxPool's channels, ReduceMax over trailing axes.
py::array ReduceMaxRowsPy(const py::array_t<float, py::array::c_style>& x, int threads) {
  if (x.ndim() != 2 || x.shape(1) < 1)
    throw std::invalid_argument("reduce_max_rows: x must be a float32 [rows, cols] array with cols >= 1");
  const int64_t rows = x.shape(0), cols = x.shape(1);
  py::array_t<float> y(std::vector<py::ssize_t>{rows});
  const float* src = x.data();
  float* dst = y.mutable_data();
  py::gil_scoped_release release;
#if NPU_EP_X86
  const bool avx512 = ActiveIsa() >= Isa::kAvx512;
#endif
  constexpr int64_t kRowsPerTask = 16;
  ParallelFor(ThreadsFor(threads, rows * cols), (rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) {
#if NPU_EP_X86
      if (avx512) {
        dst[r] = MaxOfRowAvx512(src + r * cols, cols);
        continue;
      }
#endif
      dst[r] = MaxOfRowScalar(src + r * cols, cols);
    }
  });
  return std::move(y);
}

// --- ReduceSum / Mean / Max / Min / Prod / SumSquare / L1 / L2 over one run of axes (`kernels.reduce_axis`) ------
// x viewed as [outer, n, inner] (the caller merges adjacent axes), reduced over n. float32 and float16 (widened,
// accumulated in float32 and rounded once: the reference's dtype=float32 sums) sum, average, take maxima or
// minima, multiply, sum squares or magnitudes (L2: the square root of the sum of squares); int32/int64 take maxima
// and minima (exact). Rows (inner 1): 32 running lanes (element j in lane j % 32
// after the first 32) folded in halves at the end; columns (inner > 1): each column accumulated down the n rows in
// order, from its first row (numpy's order for a non-trailing axis), blocks of 256 columns per task. Maxima and
// minima keep a NaN once seen (numpy's maximum). The same operations in the same order on every ISA (the AVX2
// and AVX-512 builds of a loop are the same source; rows of 32 or more on AVX-512 take FoldRow32Avx512, the same
// lanes in intrinsics): the bits do not depend on the host or the thread count.
enum Reduction : int { kSum = 0, kMean = 1, kMax = 2, kMin = 3, kProd = 4, kSumSquare = 5, kL1 = 6, kL2 = 7 };

// An element as the reduction adds it: squared (SumSquare, L2), its magnitude (L1), else itself.
template <int R, typename A>
inline A Pre(A v) {
  if constexpr (R == kSumSquare || R == kL2) return v * v;
  if constexpr (R == kL1) return v < 0 ? -v : v;
  return v;
}

template <int R, typename A>
inline A Combine(A acc, A v) {
  if constexpr (R == kMax) return ((v > acc) | (v != v)) ? v : acc;  // a NaN, once in, stays; | not ||: no branch
  if constexpr (R == kMin) return ((v < acc) | (v != v)) ? v : acc;
  if constexpr (R == kProd) return acc * v;
  return acc + v;
}

constexpr int kLanes = 32;  // four AVX2 / two AVX-512 vectors of running sums: the adds' latency hidden

template <int R, typename A>
inline __attribute__((always_inline)) A FoldRowBody(const A* x, int64_t n) {
  if (n < kLanes) {
    A acc = Pre<R>(x[0]);
    for (int64_t j = 1; j < n; ++j) acc = Combine<R>(acc, Pre<R>(x[j]));
    return acc;
  }
  A lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = Pre<R>(x[l]);
  int64_t j = kLanes;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = Combine<R>(lanes[l], Pre<R>(x[j + l]));
  for (int l = 0; j + l < n; ++l) lanes[l] = Combine<R>(lanes[l], Pre<R>(x[j + l]));
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = Combine<R>(lanes[l], lanes[l + w]);
  return lanes[0];
}

template <int R, typename A>
inline __attribute__((always_inline)) void CombineColumnsBody(A* acc, const A* v, int64_t len) {
  for (int64_t c = 0; c < len; ++c) acc[c] = Combine<R>(acc[c], Pre<R>(v[c]));
}

template <int R, typename A>
A FoldRowBase(const A* x, int64_t n) {
  return FoldRowBody<R>(x, n);
}
template <int R, typename A>
void CombineColumnsBase(A* acc, const A* v, int64_t len) {
  CombineColumnsBody<R>(acc, v, len);
}
#if NPU_EP_X86
template <int R, typename A>
__attribute__((target("avx512f,avx512bw"))) A FoldRowAvx512(const A* x, int64_t n) {
  return FoldRowBody<R>(x, n);
}
template <int R, typename A>
__attribute__((target("avx512f,avx512bw"))) void CombineColumnsAvx512(A* acc, const A* v, int64_t len) {
  CombineColumnsBody<R>(acc, v, len);
}
template <int R, typename A>
__attribute__((target("avx2"))) A FoldRowAvx2(const A* x, int64_t n) {
  return FoldRowBody<R>(x, n);
}
template <int R, typename A>
__attribute__((target("avx2"))) void CombineColumnsAvx2(A* acc, const A* v, int64_t len) {
  CombineColumnsBody<R>(acc, v, len);
}
#endif

template <int R, typename A>
A FoldRow(const A* x, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return FoldRowAvx512<R>(x, n);
  if (ActiveIsa() >= Isa::kAvx2) return FoldRowAvx2<R>(x, n);
#endif
  return FoldRowBase<R>(x, n);
}

template <int R, typename A>
void CombineColumns(A* acc, const A* v, int64_t len) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return CombineColumnsAvx512<R>(acc, v, len);
  if (ActiveIsa() >= Isa::kAvx2) return CombineColumnsAvx2<R>(acc, v, len);
#endif
  CombineColumnsBase<R>(acc, v, len);
}

// The accumulator of T: float for float16 (stored as uint16_t), T itself otherwise.
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>;

// x[0, len) as accumulators: x itself, or widened into buf (float16).
template <typename T>
const Acc<T>* Widened(const T* x, int64_t len, Acc<T>* buf) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    HalfToFloatRow(x, buf, len);
    return buf;
  } else {
    return x;
  }
}

// y[0, len) = acc (Mean: divided by count, in the accumulator's type, as the reference's y / count; L2: its square
// root), rounded to T.
template <int R, typename T>
void Store(Acc<T>* acc, int64_t len, int64_t count, T* y) {
  if constexpr (R == kMean) {
    const auto c = static_cast<Acc<T>>(count);
    for (int64_t i = 0; i < len; ++i) acc[i] /= c;
  }
  if constexpr (R == kL2)
    for (int64_t i = 0; i < len; ++i) acc[i] = std::sqrt(acc[i]);
  if constexpr (std::is_same_v<T, uint16_t>)
    FloatToHalfRow(acc, y, len);
  else
    std::copy(acc, acc + len, y);
}

#if NPU_EP_X86
// Rows of float32 or float16 (widened in the load) folded in 32 lanes on AVX-512: the lanes, tail and halving folds
// of FoldRowBody in its order and with its operations (Combine(acc, v) for a sum is acc + v; for a maximum
// v > acc ? v : acc, which vmaxps(v, acc) is), so the same bits. Maxima and minima note a NaN in a compare per load
// and take FoldRowBody's row instead, where NaN's propagation decides.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 PreV(__m512 v) {
  if constexpr (R == kSumSquare || R == kL2) return _mm512_mul_ps(v, v);
  if constexpr (R == kL1) {  // v < 0 ? -v : v (-0.0 and NaN kept as they are)
    const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_sub_ps(v, neg, _mm512_setzero_ps(), v);
  }
  return v;
}

#define NPU_EP_REDUCE_COMBINE(V, max, min, mul, add)                                   \
  template <int R>                                                                     \
  __attribute__((target("avx512f,avx512bw,avx512vl"))) inline V CombineV(V acc, V v) { \
    if constexpr (R == kMax) return max(v, acc);                                       \
    if constexpr (R == kMin) return min(v, acc);                                       \
    if constexpr (R == kProd) return mul(acc, v);                                      \
    return add(acc, v);                                                                \
  }
NPU_EP_REDUCE_COMBINE(__m512, _mm512_max_ps, _mm512_min_ps, _mm512_mul_ps, _mm512_add_ps)
NPU_EP_REDUCE_COMBINE(__m256, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _mm256_add_ps)
NPU_EP_REDUCE_COMBINE(__m128, _mm_max_ps, _mm_min_ps, _mm_mul_ps, _mm_add_ps)
#undef NPU_EP_REDUCE_COMBINE

// FoldRowBody of x[0, n) (n >= kLanes); false (a NaN in a maximum or minimum) leaves *out unset.
template <int R, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) bool FoldRow32Avx512(const T* x, int64_t n, float* out) {
  constexpr bool kExtreme = R == kMax || R == kMin;
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 a = LoadFloats16(x, kAll), b = LoadFloats16(x + 16, kAll);
  __mmask16 nan = kExtreme ? _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) : 0;
  __m512 l0 = PreV<R>(a), l1 = PreV<R>(b);
  int64_t j = kLanes;
  for (; j + kLanes <= n; j += kLanes) {
    a = LoadFloats16(x + j, kAll), b = LoadFloats16(x + j + 16, kAll);
    if constexpr (kExtreme) nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    l0 = CombineV<R>(l0, PreV<R>(a)), l1 = CombineV<R>(l1, PreV<R>(b));
  }
  if (const int64_t rem = n - j; rem > 0) {
    const auto k0 = static_cast<__mmask16>(rem >= 16 ? kAll : (1u << rem) - 1);
    const auto k1 = static_cast<__mmask16>(rem <= 16 ? 0 : (1u << (rem - 16)) - 1);
    a = LoadFloats16(x + j, k0), b = LoadFloats16(x + j + 16, k1);
    if constexpr (kExtreme)
      nan |= _mm512_mask_cmp_ps_mask(k0, a, a, _CMP_UNORD_Q) | _mm512_mask_cmp_ps_mask(k1, b, b, _CMP_UNORD_Q);
    l0 = _mm512_mask_mov_ps(l0, k0, CombineV<R>(l0, PreV<R>(a)));
    l1 = _mm512_mask_mov_ps(l1, k1, CombineV<R>(l1, PreV<R>(b)));
  }
  if (kExtreme && nan) return false;
  const __m512 l = CombineV<R>(l0, l1);  // lanes[l] = Combine(lanes[l], lanes[l + 16])
  const __m256 h =
      CombineV<R>(_mm512_castps512_ps256(l), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(l), 1)));
  const __m128 q = CombineV<R>(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = CombineV<R>(q, _mm_movehl_ps(q, q));
  *out = _mm_cvtss_f32(CombineV<R>(p, _mm_shuffle_ps(p, p, 1)));
  return true;
}

// out[r] = the fold of row r of x [rows, n] (n >= kLanes); buf: n floats for a float16 row's FoldRowBody.
template <int R, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void FoldRowsAvx512(const T* x, int64_t rows, int64_t n,
                                                                              float* buf, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    if (!FoldRow32Avx512<R>(row, n, out + r)) out[r] = FoldRowAvx512<R>(Widened(row, n, buf), n);
  }
}
#endif

constexpr int64_t kTaskElems = 32768, kColumnBlock = 256;

template <int R, typename T>
void ReduceView(const T* x, int64_t outer, int64_t n, int64_t inner, int threads, T* y) {
  using A = Acc<T>;
  const int use = ThreadsFor(threads, outer * n * inner);
  if (inner == 1) {
    const int64_t rows_per_task = std::max<int64_t>(1, kTaskElems / n);
    ParallelFor(use, (outer + rows_per_task - 1) / rows_per_task, [&](int64_t t) {
      const int64_t r0 = t * rows_per_task, rows = std::min(outer, r0 + rows_per_task) - r0;
      std::vector<A> buf(std::is_same_v<T, A> ? 0 : n), out(rows);
#if NPU_EP_X86
      if constexpr (std::is_same_v<A, float>) {
        if (n >= kLanes && ActiveIsa() >= Isa::kAvx512) {
          FoldRowsAvx512<R>(x + r0 * n, rows, n, buf.data(), out.data());
          Store<R>(out.data(), rows, n, y + r0);
          return;
        }
      }
#endif
      for (int64_t r = 0; r < rows; ++r) out[r] = FoldRow<R>(Widened(x + (r0 + r) * n, n, buf.data()), n);
      Store<R>(out.data(), rows, n, y + r0);
    });
    return;
  }
  const int64_t blocks = (inner + kColumnBlock - 1) / kColumnBlock;
  ParallelFor(use, outer * blocks, [&](int64_t t) {
    const int64_t o = t / blocks, c = (t % blocks) * kColumnBlock, len = std::min(kColumnBlock, inner - c);
    A acc[kColumnBlock], buf[kColumnBlock];
    const T* at = x + o * n * inner + c;
    const A* first = Widened(at, len, buf);
    for (int64_t i = 0; i < len; ++i) acc[i] = Pre<R>(first[i]);
    for (int64_t r = 1; r < n; ++r) CombineColumns<R>(acc, Widened(at + r * inner, len, buf), len);
    Store<R>(acc, len, n, y + o * inner + c);
  });
}

template <typename T>
void ReduceViewOf(int op, const T* x, int64_t outer, int64_t n, int64_t inner, int threads, T* y) {
  switch (op) {
    case kSum: return ReduceView<kSum>(x, outer, n, inner, threads, y);
    case kMean: return ReduceView<kMean>(x, outer, n, inner, threads, y);
    case kMax: return ReduceView<kMax>(x, outer, n, inner, threads, y);
    case kMin: return ReduceView<kMin>(x, outer, n, inner, threads, y);
    default: break;
  }
  if constexpr (!std::is_integral_v<T> || std::is_same_v<T, uint16_t>) {  // the float-only reductions
    switch (op) {
      case kProd: return ReduceView<kProd>(x, outer, n, inner, threads, y);
      case kSumSquare: return ReduceView<kSumSquare>(x, outer, n, inner, threads, y);
      case kL1: return ReduceView<kL1>(x, outer, n, inner, threads, y);
      default: return ReduceView<kL2>(x, outer, n, inner, threads, y);
    }
  }
}

py::array ReduceAxisPy(const py::array& x, int op, int64_t outer, int64_t n, int64_t inner, int threads) {
  const py::dtype dt = x.dtype();
  const bool f32 = dt.equal(py::dtype::of<float>()), f16 = dt.kind() == 'f' && dt.itemsize() == 2;
  const bool ints = dt.equal(py::dtype::of<int32_t>()) || dt.equal(py::dtype::of<int64_t>());
  if (!(x.flags() & py::array::c_style) || !(f32 || f16 || ints) || op < kSum || op > kL2 ||
      (ints && op != kMax && op != kMin))
    throw std::invalid_argument(
        "reduce_axis: op " + std::to_string(op) + " of a " + std::string(py::str(dt)) +
        " array: expects a C-contiguous float32/float16 array (sum 0, mean 1, max 2, min 3, prod 4, "
        "sum of squares 5, L1 6, L2 7) "
        "or int32/int64 (max, min)");
  if (outer < 0 || n <= 0 || inner <= 0 || outer * n * inner != static_cast<int64_t>(x.size()))
    throw std::invalid_argument("reduce_axis: [outer, n, inner] = [" + std::to_string(outer) + ", " +
                                std::to_string(n) + ", " + std::to_string(inner) + "] does not cover x's " +
                                std::to_string(x.size()) + " elements");
  py::array y(dt, std::vector<py::ssize_t>{outer * inner});
  const void* src = x.data();
  void* dst = y.mutable_data();
  py::gil_scoped_release release;
  if (f32)
    ReduceViewOf(op, static_cast<const float*>(src), outer, n, inner, threads, static_cast<float*>(dst));
  else if (f16)
    ReduceViewOf(op, static_cast<const uint16_t*>(src), outer, n, inner, threads, static_cast<uint16_t*>(dst));
  else if (dt.itemsize() == 4)
    ReduceViewOf(op, static_cast<const int32_t*>(src), outer, n, inner, threads, static_cast<int32_t*>(dst));
  else
    ReduceViewOf(op, static_cast<const int64_t*>(src), outer, n, inner, threads, static_cast<int64_t*>(dst));
  return y;
}

// --- ArgMax / ArgMin over one axis (`kernels.arg_extreme`) ---------------------------------------------------------
// x viewed as [outer, n, inner], the index along n of each extreme as int64, as ORT's CPU kernel: the first index
// of the extreme (the last with select_last_index). Over NaN, ORT keeps the first element and replaces it by each
// later one that compares greater (less; or equal too with `last`), so a NaN first element wins and a later NaN
// never does; a rank-1 input without select_last_index (`nan_first`) takes the first NaN instead (Eigen's
// maxCoeff there). Rows: float rows of 16 or more on AVX-512 in one pass (ArgRowAvx512), others the extreme by the
// lane folds above, then the first (last) index holding it, or the scan where the extreme is NaN; columns: the scan,
// a block of 256 columns at a time down the n rows.

// ORT's scan over one row (the NaN rows).
template <typename A>
int64_t ArgScan(const A* x, int64_t n, bool is_max, bool last, bool nan_first) {
  A cur = x[0];
  int64_t at = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (nan_first && x[j] != x[j]) return j;
    if (j > 0 && ((is_max ? x[j] > cur : x[j] < cur) || (last && x[j] == cur))) cur = x[j], at = j;
  }
  return at;
}

template <typename A>
int64_t ArgRow(const A* x, int64_t n, bool is_max, bool last, bool nan_first) {
  const A m = is_max ? FoldRow<kMax>(x, n) : FoldRow<kMin>(x, n);
  if (m != m) return ArgScan(x, n, is_max, last, nan_first);
  if (last) {
    for (int64_t j = n - 1; j > 0; --j)
      if (x[j] == m) return j;
    return 0;
  }
  for (int64_t j = 0; j < n; ++j)
    if (x[j] == m) return j;
  return 0;
}

#if NPU_EP_X86
// ArgRow of a float32/float16 row of 16 <= n < 2^31 elements in one pass on AVX-512: two sets of 16 lanes (element j
// in set (j / 16) % 2, lane j % 16), each lane keeping its extreme and the first index holding it (strict compare;
// the last with `last`: or equal), then the row's extreme over the lanes and the least (greatest) index among the
// lanes holding it. That is the first (last) index of an element equal to the extreme, ArgRow's answer (-0.0 and
// +0.0 equal in both). false: the row holds a NaN, ArgRow's scan decides.
template <bool IsMax, bool Last, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) bool ArgRowAvx512(const T* x, int64_t n, int64_t* out) {
  constexpr int kTake = IsMax ? (Last ? _CMP_GE_OQ : _CMP_GT_OQ) : (Last ? _CMP_LE_OQ : _CMP_LT_OQ);
  constexpr __mmask16 kAll = 0xFFFF;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16), step = _mm512_set1_epi32(32);
  // Set 1's lanes past n start as copies of set 0's: a duplicate candidate changes no answer.
  const auto k = static_cast<__mmask16>(n >= 32 ? kAll : (1u << (n - 16)) - 1);
  __m512 b0 = LoadFloats16(x, kAll);
  __m512 b1 = _mm512_mask_mov_ps(b0, k, LoadFloats16(x + 16, k));
  __m512i i0 = iota, i1 = _mm512_mask_mov_epi32(iota, k, _mm512_add_epi32(iota, sixteen));
  __mmask16 nan = _mm512_cmp_ps_mask(b0, b1, _CMP_UNORD_Q);
  __m512i at = _mm512_add_epi32(iota, step);
  int64_t j = 32;
  for (; j + 32 <= n; j += 32, at = _mm512_add_epi32(at, step)) {
    const __m512 a = LoadFloats16(x + j, kAll), b = LoadFloats16(x + j + 16, kAll);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    const __mmask16 t0 = _mm512_cmp_ps_mask(a, b0, kTake), t1 = _mm512_cmp_ps_mask(b, b1, kTake);
    b0 = _mm512_mask_mov_ps(b0, t0, a), i0 = _mm512_mask_mov_epi32(i0, t0, at);
    b1 = _mm512_mask_mov_ps(b1, t1, b), i1 = _mm512_mask_mov_epi32(i1, t1, _mm512_add_epi32(at, sixteen));
  }
  if (const int64_t rem = n - j; rem > 0) {
    const auto k0 = static_cast<__mmask16>(rem >= 16 ? kAll : (1u << rem) - 1);
    const auto k1 = static_cast<__mmask16>(rem <= 16 ? 0 : (1u << (rem - 16)) - 1);
    const __m512 a = LoadFloats16(x + j, k0), b = LoadFloats16(x + j + 16, k1);  // zero past n: no NaN there
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    const __mmask16 t0 = _mm512_mask_cmp_ps_mask(k0, a, b0, kTake), t1 = _mm512_mask_cmp_ps_mask(k1, b, b1, kTake);
    b0 = _mm512_mask_mov_ps(b0, t0, a), i0 = _mm512_mask_mov_epi32(i0, t0, at);
    b1 = _mm512_mask_mov_ps(b1, t1, b), i1 = _mm512_mask_mov_epi32(i1, t1, _mm512_add_epi32(at, sixteen));
  }
  if (nan) return false;
  const float m = IsMax ? _mm512_reduce_max_ps(_mm512_max_ps(b0, b1)) : _mm512_reduce_min_ps(_mm512_min_ps(b0, b1));
  const __m512 mv = _mm512_set1_ps(m);
  const __mmask16 e0 = _mm512_cmp_ps_mask(b0, mv, _CMP_EQ_OQ), e1 = _mm512_cmp_ps_mask(b1, mv, _CMP_EQ_OQ);
  if constexpr (Last) {
    const __m512i none = _mm512_set1_epi32(-1);
    *out = _mm512_reduce_max_epi32(
        _mm512_max_epi32(_mm512_mask_mov_epi32(none, e0, i0), _mm512_mask_mov_epi32(none, e1, i1)));
  } else {
    const __m512i none = _mm512_set1_epi32(std::numeric_limits<int32_t>::max());
    *out = _mm512_reduce_min_epi32(
        _mm512_min_epi32(_mm512_mask_mov_epi32(none, e0, i0), _mm512_mask_mov_epi32(none, e1, i1)));
  }
  return true;
}

#define NPU_EP_ARG_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
// An int32 (int64) row's values and their indices in 16 (8) lanes of one width.
template <typename T>
struct IntLanes;
#define NPU_EP_INT_LANES(T, N, M, W)                                                                              \
  template <>                                                                                                     \
  struct IntLanes<T> {                                                                                            \
    static constexpr int kN = N;                                                                                  \
    using Mask = M;                                                                                               \
    NPU_EP_ARG_TARGET static __m512i Load(const T* p, M m) { return _mm512_maskz_loadu_epi##W(m, p); }            \
    template <int P>                                                                                              \
    NPU_EP_ARG_TARGET static M Cmp(M k, __m512i a, __m512i b) {                                                   \
      return _mm512_mask_cmp_epi##W##_mask(k, a, b, P);                                                           \
    }                                                                                                             \
    NPU_EP_ARG_TARGET static __m512i Blend(__m512i a, M m, __m512i b) { return _mm512_mask_mov_epi##W(a, m, b); } \
    NPU_EP_ARG_TARGET static __m512i Set(int64_t v) { return _mm512_set1_epi##W(static_cast<T>(v)); }             \
    NPU_EP_ARG_TARGET static __m512i Add(__m512i a, __m512i b) { return _mm512_add_epi##W(a, b); }                \
    NPU_EP_ARG_TARGET static __m512i Max(__m512i a, __m512i b) { return _mm512_max_epi##W(a, b); }                \
    NPU_EP_ARG_TARGET static __m512i Min(__m512i a, __m512i b) { return _mm512_min_epi##W(a, b); }                \
    NPU_EP_ARG_TARGET static int64_t MaxOf(__m512i v) { return _mm512_reduce_max_epi##W(v); }                     \
    NPU_EP_ARG_TARGET static int64_t MinOf(__m512i v) { return _mm512_reduce_min_epi##W(v); }                     \
    NPU_EP_ARG_TARGET static M Eq(__m512i a, __m512i b) { return _mm512_cmpeq_epi##W##_mask(a, b); }              \
  };
NPU_EP_INT_LANES(int32_t, 16, __mmask16, 32)
NPU_EP_INT_LANES(int64_t, 8, __mmask8, 64)
#undef NPU_EP_INT_LANES

// ArgRowAvx512 of an int32 (int64) row of 16 (8) <= n < 2^31 elements: two sets of 16 (8) lanes, the indices in
// lanes of the values' width; no NaN, so always an answer.
template <bool IsMax, bool Last, typename T>
NPU_EP_ARG_TARGET bool ArgRowIntAvx512(const T* x, int64_t n, int64_t* out) {
  using L = IntLanes<T>;
  using M = typename L::Mask;
  constexpr int kN = L::kN;
  constexpr int kTake = IsMax ? (Last ? _MM_CMPINT_NLT : _MM_CMPINT_NLE) : (Last ? _MM_CMPINT_LE : _MM_CMPINT_LT);
  constexpr auto kAll = static_cast<M>((1u << kN) - 1);
  __m512i iota = L::Set(0);
  for (int l = 1; l < kN; ++l) iota = L::Blend(iota, static_cast<M>(1u << l), L::Set(l));
  const __m512i lanes = L::Set(kN), step = L::Set(2 * kN);
  const auto k = static_cast<M>(n >= 2 * kN ? kAll : (1u << (n - kN)) - 1);  // set 1's lanes past n copy set 0's
  __m512i b0 = L::Load(x, kAll), b1 = L::Blend(b0, k, L::Load(x + kN, k));
  __m512i i0 = iota, i1 = L::Blend(iota, k, L::Add(iota, lanes)), at = L::Add(iota, step);
  int64_t j = 2 * kN;
  for (; j + 2 * kN <= n; j += 2 * kN, at = L::Add(at, step)) {
    const __m512i a = L::Load(x + j, kAll), b = L::Load(x + j + kN, kAll);
    const M t0 = L::template Cmp<kTake>(kAll, a, b0), t1 = L::template Cmp<kTake>(kAll, b, b1);
    b0 = L::Blend(b0, t0, a), i0 = L::Blend(i0, t0, at);
    b1 = L::Blend(b1, t1, b), i1 = L::Blend(i1, t1, L::Add(at, lanes));
  }
  if (const int64_t rem = n - j; rem > 0) {
    const auto k0 = static_cast<M>(rem >= kN ? kAll : (1u << rem) - 1);
    const auto k1 = static_cast<M>(rem <= kN ? 0 : (1u << (rem - kN)) - 1);
    const __m512i a = L::Load(x + j, k0), b = L::Load(x + j + kN, k1);
    const M t0 = L::template Cmp<kTake>(k0, a, b0), t1 = L::template Cmp<kTake>(k1, b, b1);
    b0 = L::Blend(b0, t0, a), i0 = L::Blend(i0, t0, at);
    b1 = L::Blend(b1, t1, b), i1 = L::Blend(i1, t1, L::Add(at, lanes));
  }
  const __m512i m = L::Set(IsMax ? L::MaxOf(L::Max(b0, b1)) : L::MinOf(L::Min(b0, b1)));
  const M e0 = L::Eq(b0, m), e1 = L::Eq(b1, m);
  if constexpr (Last) {
    const __m512i none = L::Set(-1);
    *out = L::MaxOf(L::Max(L::Blend(none, e0, i0), L::Blend(none, e1, i1)));
  } else {
    const __m512i none = L::Set(std::numeric_limits<int32_t>::max());
    *out = L::MinOf(L::Min(L::Blend(none, e0, i0), L::Blend(none, e1, i1)));
  }
  return true;
}
#undef NPU_EP_ARG_TARGET

using ArgRowAvx512Fn = bool (*)(const void*, int64_t, int64_t*);

template <bool IsMax, bool Last, typename T>
bool ArgRowAvx512Of(const void* x, int64_t n, int64_t* out) {
  if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>)
    return ArgRowIntAvx512<IsMax, Last>(static_cast<const T*>(x), n, out);
  else
    return ArgRowAvx512<IsMax, Last>(static_cast<const T*>(x), n, out);
}

// The one-pass row kernel for T on this host and these rows, else nullptr.
template <typename T>
ArgRowAvx512Fn ArgRowKernel(int64_t n, bool is_max, bool last) {
  constexpr bool kFloat = std::is_same_v<Acc<T>, float>,
                 kInt = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
  if constexpr (kFloat || kInt) {
    const int64_t lanes = std::is_same_v<T, int64_t> ? 8 : 16;
    if (n < lanes || n > std::numeric_limits<int32_t>::max() || ActiveIsa() < Isa::kAvx512) return nullptr;
    static constexpr ArgRowAvx512Fn kRows[4] = {ArgRowAvx512Of<false, false, T>, ArgRowAvx512Of<false, true, T>,
                                                ArgRowAvx512Of<true, false, T>, ArgRowAvx512Of<true, true, T>};
    return kRows[(is_max ? 2 : 0) + (last ? 1 : 0)];
  }
  return nullptr;
}
#endif

template <bool IsMax, bool Last, typename A>
void ArgColumns(A* cur, int64_t* at, const A* v, int64_t r, int64_t len) {
  for (int64_t c = 0; c < len; ++c) {
    const bool take = (IsMax ? v[c] > cur[c] : v[c] < cur[c]) || (Last && v[c] == cur[c]);
    cur[c] = take ? v[c] : cur[c];
    at[c] = take ? r : at[c];
  }
}

template <typename A>
using ArgColumnsFn = void (*)(A*, int64_t*, const A*, int64_t, int64_t);

template <typename T>
void ArgView(const T* x, int64_t outer, int64_t n, int64_t inner, bool is_max, bool last, bool nan_first, int threads,
             int64_t* y) {
  using A = Acc<T>;
  const int use = ThreadsFor(threads, outer * n * inner);
  if (inner == 1) {
    const int64_t rows_per_task = std::max<int64_t>(1, kTaskElems / n);
#if NPU_EP_X86
    const ArgRowAvx512Fn one_pass = ArgRowKernel<T>(n, is_max, last);
#endif
    ParallelFor(use, (outer + rows_per_task - 1) / rows_per_task, [&](int64_t t) {
      std::vector<A> buf;
      for (int64_t r = t * rows_per_task; r < std::min(outer, (t + 1) * rows_per_task); ++r) {
#if NPU_EP_X86
        if (one_pass && one_pass(x + r * n, n, y + r)) continue;
#endif
        if (!std::is_same_v<T, A> && buf.empty()) buf.resize(n);
        y[r] = ArgRow(Widened(x + r * n, n, buf.data()), n, is_max, last, nan_first);
      }
    });
    return;
  }
  static constexpr ArgColumnsFn<A> kColumns[4] = {ArgColumns<false, false, A>, ArgColumns<false, true, A>,
                                                  ArgColumns<true, false, A>, ArgColumns<true, true, A>};
  const ArgColumnsFn<A> step = kColumns[(is_max ? 2 : 0) + (last ? 1 : 0)];
  const int64_t blocks = (inner + kColumnBlock - 1) / kColumnBlock;
  ParallelFor(use, outer * blocks, [&](int64_t t) {
    const int64_t o = t / blocks, c = (t % blocks) * kColumnBlock, len = std::min(kColumnBlock, inner - c);
    A cur[kColumnBlock], buf[kColumnBlock];
    int64_t* at = y + o * inner + c;
    const T* src = x + o * n * inner + c;
    const A* first = Widened(src, len, buf);
    std::copy(first, first + len, cur);
    std::fill(at, at + len, int64_t{0});
    for (int64_t r = 1; r < n; ++r) step(cur, at, Widened(src + r * inner, len, buf), r, len);
  });
}

py::array ArgExtremePy(const py::array& x, int64_t outer, int64_t n, int64_t inner, bool is_max, bool last,
                       bool nan_first, int threads) {
  const py::dtype dt = x.dtype();
  if (!(x.flags() & py::array::c_style) || outer < 0 || n <= 0 || inner <= 0 ||
      outer * n * inner != static_cast<int64_t>(x.size()))
    throw std::invalid_argument("arg_extreme: x (" + std::string(py::str(dt)) + ", " + std::to_string(x.size()) +
                                " elements) must be C-contiguous and [outer, n, inner] = [" + std::to_string(outer) +
                                ", " + std::to_string(n) + ", " + std::to_string(inner) + "] cover it, n >= 1");
  py::array_t<int64_t> y(std::vector<py::ssize_t>{outer * inner});
  int64_t* dst = y.mutable_data();
  const void* src = x.data();
  auto run = [&](auto* typed) {
    py::gil_scoped_release release;
    ArgView(typed, outer, n, inner, is_max, last, nan_first, threads, dst);
  };
  ForOrderedDtype(dt, src, true, "arg_extreme", run);
  return std::move(y);
}

}  // namespace

void BindReduce(py::module_& m) {
  m.def("arg_extreme", &ArgExtremePy, py::arg("x"), py::arg("outer"), py::arg("n"), py::arg("inner"), py::arg("is_max"),
        py::arg("last") = false, py::arg("nan_first") = false, py::arg("threads") = 1,
        "ArgMax (is_max) / ArgMin of C-contiguous x viewed as [outer, n, inner] over n, int64 [outer * inner], as "
        "ORT's CPU kernel: the first (last) index of the extreme, ORT's scan over NaN (nan_first: the first NaN)");
  m.def("reduce_axis", &ReduceAxisPy, py::arg("x"), py::arg("op"), py::arg("outer"), py::arg("n"), py::arg("inner"),
        py::arg("threads") = 1,
        "C-contiguous x viewed as [outer, n, inner] reduced over n into a new 1-D array of outer * inner: op 0 sum, 1 "
        "mean, 2 max, 3 min, 4 prod, 5 sum of squares, 6 L1, 7 L2 of float32/float16 (float32 accumulation, one "
        "rounding), 2/3 of int32/int64 (exact); "
        "maxima and minima keep a NaN; the same bits at any thread count and ISA");
  m.def("reduce_max_rows", &ReduceMaxRowsPy, py::arg("x"), py::arg("threads") = 1,
        "row maxima of a C-contiguous float32 [rows, cols >= 1] array, NaN where a row holds one (numpy's "
        "maximum.reduce), on up to `threads` threads");
  m.def("reduce_mean_float", &ReduceMeanFloatPy, py::arg("add_reduce"), py::arg("x"), py::arg("axes"),
        py::arg("keepdims"), py::arg("count"),
        "float32/float64 ReduceMean: add_reduce(x, axis=axes, dtype=x.dtype, keepdims) (numpy's np.add.reduce), "
        "each sum then divided by count in place; None for a 0-d result");
  m.def("reduce_sum_int", &ReduceSumIntPy, py::arg("x"), py::arg("threads") = 1,
        "Row sums of an int32/int64 [rows, cols] array, saturated to its type, equal to ORT's float64 "
        "accumulation, on up to `threads` threads; None when a row's sum of |x| reaches 2^53 (float64 could round "
        "there: the reference runs)");
}

}  // namespace npu_ep::kern
