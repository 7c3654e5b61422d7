// Binary element-wise ops with ONNX (numpy) broadcasting for kernels/ops/elementwise.py: float16 Add/Sub/Mul/Div
// (`kernels.binary_f16`), float16 comparisons (`kernels.compare_f16`, exact: both sides widen exactly) and
// int32/int64 Div (`kernels.div_int`), and variadic Sum/Mean/Max/Min of same-shape float32/float16 arrays
// (`kernels.variadic_float`), and the plain dtypes' Add/Sub/Mul/Div, Max/Min, comparisons and logic
// (`kernels.binary_num`).
// The reference model computes a float16 op in float32 and rounds once on store (numpy's half loops do the same);
// both operands widen exactly and float32's 24-bit significand is at least 2 * 11 + 2 bits, so the rounded result
// is the correctly rounded float16 one either way and binary_f16 gives the reference's bits (NaN for NaN).
// Integer Div truncates toward zero (C++ division, ORT's CPU Div); INT_MIN / -1 wraps to INT_MIN as the reference's
// numpy does; a zero divisor makes the call return None, so the reference raises its error naming the node.
// Broadcasting: broadcast.h's merged axes, each row a contiguous output run.
#if !defined(__clang__)     // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the variadic fold's loops vectorize (plain float operations: O3 changes no value)
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "broadcast.h"
#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

enum BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3 };

constexpr int64_t kTaskElems = 16384;  // output elements per parallel task

template <int Op>
inline float Apply(float a, float b) {
  if constexpr (Op == kAdd) return a + b;
  if constexpr (Op == kSub) return a - b;
  if constexpr (Op == kMul) return a * b;
  return a / b;
}

inline float Widen(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}

inline uint16_t Narrow(float f) {  // round to nearest, ties to even (numpy's astype, F16C's vcvtps2ph)
  const _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}

// y[i] = a[i * sa] op b[i * sb] for i < n; sa, sb in {0, 1} (0: one element repeated).
template <int Op>
void RowScalar(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Narrow(Apply<Op>(Widen(a[i * sa]), Widen(b[i * sb])));
}

#if NPU_EP_X86
constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <int Op>
__attribute__((target("avx2,f16c"))) inline __m256 ApplyAvx2(__m256 a, __m256 b) {
  if constexpr (Op == kAdd) return _mm256_add_ps(a, b);
  if constexpr (Op == kSub) return _mm256_sub_ps(a, b);
  if constexpr (Op == kMul) return _mm256_mul_ps(a, b);
  return _mm256_div_ps(a, b);
}

__attribute__((target("avx2,f16c"))) inline __m256 Load8(const uint16_t* p, int64_t stride) {
  return stride ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))) : _mm256_set1_ps(_cvtsh_ss(*p));
}

template <int Op>
__attribute__((target("avx2,f16c"))) void RowF16c(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb,
                                                  uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = ApplyAvx2<Op>(Load8(a + i * sa, sa), Load8(b + i * sb, sb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, kNearest));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(Apply<Op>(_cvtsh_ss(a[i * sa]), _cvtsh_ss(b[i * sb])), kNearest);
}
#endif

using RowFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t);

template <int Op>
RowFn RowFor() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return &RowF16c<Op>;
#endif
  return &RowScalar<Op>;
}

RowFn RowFor(int op) {
  switch (op) {
    case kAdd: return RowFor<kAdd>();
    case kSub: return RowFor<kSub>();
    case kMul: return RowFor<kMul>();
    case kDiv: return RowFor<kDiv>();
    default:
      throw std::invalid_argument("binary_f16: op must be 0 (Add), 1 (Sub), 2 (Mul) or 3 (Div), got " +
                                  std::to_string(op));
  }
}

bool IsHalf(const py::array& x) { return x.dtype().kind() == 'f' && x.itemsize() == 2; }

// a op b over the broadcast of C-order a and b by a row function (a, its unit stride, b, its unit stride, y, n),
// into ``out`` or a new array of a's dtype (Out: of bool).
template <typename T, typename Row, typename Out = T>
py::array RunBinary(const char* fn, const Row& row, const py::array& a, const py::array& b, const py::object& out,
                    int threads) {
  const Broadcast<2> p = PlanBroadcast<2>(fn, {&a, &b});
  py::array y = BroadcastResult(fn, std::is_same_v<Out, bool> ? py::dtype::of<bool>() : a.dtype(), p, out);
  if (p.total == 0) return y;
  const auto* pa = static_cast<const T*>(a.data());
  const auto* pb = static_cast<const T*>(b.data());
  auto* py_ = static_cast<Out*>(y.mutable_data());
  ParallelRuns(p, threads, kTaskElems,
               [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& unit, int64_t at, int64_t len) {
                 row(pa + off[0], unit[0], pb + off[1], unit[1], py_ + at, len);
               });
  return y;
}

py::array BinaryF16Py(int op, const py::array& a, const py::array& b, const py::object& out, int threads) {
  if (!IsHalf(a) || !IsHalf(b) || !(a.flags() & py::array::c_style) || !(b.flags() & py::array::c_style))
    throw std::invalid_argument("binary_f16: a and b must be C-order float16 arrays, got " +
                                std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                                std::string(py::str(b.dtype())) + ShapeText(b));
  return RunBinary<uint16_t>("binary_f16", RowFor(op), a, b, out, threads);
}

enum CompareOp : int { kEqual = 0, kLess = 1, kLessOrEqual = 2, kGreater = 3, kGreaterOrEqual = 4 };

template <int Op>
inline bool Compare(float a, float b) {  // IEEE: false with a NaN, -0 == +0 (numpy's float16 comparisons)
  if constexpr (Op == kEqual) return a == b;
  if constexpr (Op == kLess) return a < b;
  if constexpr (Op == kLessOrEqual) return a <= b;
  if constexpr (Op == kGreater) return a > b;
  return a >= b;
}

template <int Op>
void CompareRowScalar(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, bool* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Compare<Op>(Widen(a[i * sa]), Widen(b[i * sb]));
}

#if NPU_EP_X86
template <int Op>
__attribute__((target("avx2,f16c"))) void CompareRowF16c(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb,
                                                         bool* y, int64_t n) {
  constexpr int kPredicate = Op == kEqual         ? _CMP_EQ_OQ
                             : Op == kLess        ? _CMP_LT_OQ
                             : Op == kLessOrEqual ? _CMP_LE_OQ
                             : Op == kGreater     ? _CMP_GT_OQ
                                                  : _CMP_GE_OQ;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i m = _mm256_castps_si256(_mm256_cmp_ps(Load8(a + i * sa, sa), Load8(b + i * sb, sb), kPredicate));
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));  // -1 / 0
    const __m128i bools = _mm_and_si128(_mm_packs_epi16(words, words), _mm_set1_epi8(1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), bools);  // 8 bytes of 0 / 1
  }
  for (; i < n; ++i) y[i] = Compare<Op>(_cvtsh_ss(a[i * sa]), _cvtsh_ss(b[i * sb]));
}
#endif

using CompareFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, bool*, int64_t);

template <int Op>
CompareFn CompareFor() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return &CompareRowF16c<Op>;
#endif
  return &CompareRowScalar<Op>;
}

py::array CompareF16Py(int op, const py::array& a, const py::array& b, const py::object& out, int threads) {
  if (!IsHalf(a) || !IsHalf(b) || !(a.flags() & py::array::c_style) || !(b.flags() & py::array::c_style))
    throw std::invalid_argument("compare_f16: a and b must be C-order float16 arrays, got " +
                                std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                                std::string(py::str(b.dtype())) + ShapeText(b));
  CompareFn row = nullptr;
  switch (op) {
    case kEqual: row = CompareFor<kEqual>(); break;
    case kLess: row = CompareFor<kLess>(); break;
    case kLessOrEqual: row = CompareFor<kLessOrEqual>(); break;
    case kGreater: row = CompareFor<kGreater>(); break;
    case kGreaterOrEqual: row = CompareFor<kGreaterOrEqual>(); break;
    default:
      throw std::invalid_argument(
          "compare_f16: op must be 0 (Equal), 1 (Less), 2 (LessOrEqual), 3 (Greater) or 4 "
          "(GreaterOrEqual), got " +
          std::to_string(op));
  }
  return RunBinary<uint16_t, CompareFn, bool>("compare_f16", row, a, b, out, threads);
}

// y[i] = a[i * sa] / b[i * sb] truncated toward zero; a zero divisor sets `zero` (its quotient is left 0).
template <typename T>
void DivRow(const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n, std::atomic<bool>& zero) {
  using U = std::make_unsigned_t<T>;
  bool any_zero = false;
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i * sa], d = b[i * sb];
    any_zero |= d == 0;
    // -1: negation in unsigned arithmetic (INT_MIN / -1 wraps to INT_MIN instead of trapping)
    y[i] = d == -1 ? static_cast<T>(U{0} - static_cast<U>(x)) : d == 0 ? T{0} : static_cast<T>(x / d);
  }
  if (any_zero) zero.store(true, std::memory_order_relaxed);
}

#if NPU_EP_X86
// int32 DivRow in 4 lanes of float64: the quotient of two int32 values rounded to float64 truncates to the exact
// one (its error |a / b| 2^-53 is below 1 / |b|, the least distance of a non-integer quotient from an integer), and
// vcvttpd2dq turns INT_MIN / -1 = 2^31 into 0x80000000, INT_MIN: the wrap.
__attribute__((target("avx2"))) void DivRowI32Avx2(const int32_t* a, int64_t sa, const int32_t* b, int64_t sb,
                                                   int32_t* y, int64_t n, std::atomic<bool>& zero) {
  const __m128i zeros = _mm_setzero_si128(), ones = _mm_set1_epi32(1);
  __m128i zero_seen = zeros;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i x = sa ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)) : _mm_set1_epi32(*a);
    const __m128i d = sb ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)) : _mm_set1_epi32(*b);
    const __m128i is_zero = _mm_cmpeq_epi32(d, zeros);
    zero_seen = _mm_or_si128(zero_seen, is_zero);
    const __m256d q = _mm256_div_pd(_mm256_cvtepi32_pd(x), _mm256_cvtepi32_pd(_mm_blendv_epi8(d, ones, is_zero)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm_andnot_si128(is_zero, _mm256_cvttpd_epi32(q)));
  }
  if (!_mm_testz_si128(zero_seen, zero_seen)) zero.store(true, std::memory_order_relaxed);
  if (i < n) DivRow(a + i * sa, sa, b + i * sb, sb, y + i, n - i, zero);
}
#endif

template <typename T>
py::object DivInt(const py::array& a, const py::array& b, const py::object& out, int threads) {
  std::atomic<bool> zero{false};
#if NPU_EP_X86
  const bool lanes = std::is_same_v<T, int32_t> && ActiveIsa() >= Isa::kAvx2;
#else
  const bool lanes = false;
#endif
  const auto row = [&zero, lanes](const T* x, int64_t sx, const T* d, int64_t sd, T* q, int64_t n) {
#if NPU_EP_X86
    if constexpr (std::is_same_v<T, int32_t>) {
      if (lanes) return DivRowI32Avx2(x, sx, d, sd, q, n, zero);
    }
#endif
    (void)lanes;
    DivRow(x, sx, d, sd, q, n, zero);
  };
  py::array y = RunBinary<T>("div_int", row, a, b, out, threads);
  if (zero.load()) return py::none();  // the reference raises, naming the node and the zero divisors
  return std::move(y);
}

py::object DivIntPy(const py::array& a, const py::array& b, const py::object& out, int threads) {
  const bool c_order = (a.flags() & py::array::c_style) && (b.flags() & py::array::c_style);
  if (c_order && a.dtype().equal(b.dtype())) {
    if (a.dtype().equal(py::dtype::of<int32_t>())) return DivInt<int32_t>(a, b, out, threads);
    if (a.dtype().equal(py::dtype::of<int64_t>())) return DivInt<int64_t>(a, b, out, threads);
  }
  throw std::invalid_argument("div_int: a and b must be C-order arrays of one dtype, int32 or int64, got " +
                              std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                              std::string(py::str(b.dtype())) + ShapeText(b));
}

// Variadic Sum/Mean/Max/Min of N >= 1 same-shape C-order arrays of one dtype, float32 or float16 (widened per
// chunk), folded left to right in float32 as the reference does (Mean: the sum divided by N once), rounded once on
// store: the reference's values. Max/Min as numpy's maximum/minimum: NaN propagated, a tie keeps the left operand.
enum VariadicOp : int { kVarSum = 0, kVarMean = 1, kVarMax = 2, kVarMin = 3 };
constexpr int64_t kVarChunk = 1024;

void LoadFloats(const void* x, bool half, int64_t at, int64_t len, float* dst) {
  if (half) {
    HalfToFloatRow(static_cast<const uint16_t*>(x) + at, dst, len);
  } else {
    std::copy_n(static_cast<const float*>(x) + at, len, dst);
  }
}

// Cloned per instruction set: plain float32 adds, compares and selects (the same values in every clone).
__attribute__((target_clones("avx512f", "avx2", "default"))) void Combine(int op, float* __restrict acc,
                                                                          const float* __restrict v, int64_t len) {
  switch (op) {
    case kVarSum:
    case kVarMean:
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + v[i];
      break;
    case kVarMax:
      for (int64_t i = 0; i < len; ++i) acc[i] = (acc[i] >= v[i] || acc[i] != acc[i]) ? acc[i] : v[i];
      break;
    default:
      for (int64_t i = 0; i < len; ++i) acc[i] = (acc[i] <= v[i] || acc[i] != acc[i]) ? acc[i] : v[i];
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void DivideBy(float* acc, float d, int64_t len) {
  for (int64_t j = 0; j < len; ++j) acc[j] = acc[j] / d;
}

py::array VariadicFloatPy(int op, int threads, const py::object& out, const py::args& args) {
  if (op < kVarSum || op > kVarMin)
    throw std::invalid_argument("variadic_float: op must be 0 (Sum), 1 (Mean), 2 (Max) or 3 (Min), got " +
                                std::to_string(op));
  if (args.size() == 0) throw std::invalid_argument("variadic_float: no inputs");
  std::vector<py::array> xs;
  for (const auto& a : args) {
    if (!py::isinstance<py::array>(a)) throw std::invalid_argument("variadic_float: inputs must be arrays");
    xs.push_back(py::reinterpret_borrow<py::array>(a));
  }
  const py::array& x0 = xs[0];
  const bool half = IsHalf(x0), f32 = x0.dtype().is(py::dtype::of<float>());
  for (const auto& x : xs)
    if (!(half || f32) || !x.dtype().is(x0.dtype()) || !(x.flags() & py::array::c_style) || x.ndim() != x0.ndim() ||
        !std::equal(x.shape(), x.shape() + x.ndim(), x0.shape()))
      throw std::invalid_argument(
          "variadic_float: inputs must be C-order float32 or float16 arrays of one dtype and "
          "shape, got " +
          std::string(py::str(x.dtype())) + ShapeText(x) + " beside " + std::string(py::str(x0.dtype())) +
          ShapeText(x0));
  // out, or null when it is not an array (no empty array made to hold nothing)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(x0.dtype(), std::vector<py::ssize_t>(x0.shape(), x0.shape() + x0.ndim()));
  } else {
    if (!y || !y.dtype().is(x0.dtype()) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x0.size())
      throw std::invalid_argument(
          "variadic_float: out must be a writeable C-order array of the inputs' dtype and "
          "size");
  }
  const int64_t n = x0.size(), count = static_cast<int64_t>(xs.size());
  const float scale = static_cast<float>(count);
  std::vector<const void*> src;
  for (const auto& x : xs) src.push_back(x.data());
  void* dst = y.mutable_data();
  RunMoving(static_cast<size_t>(n * count) * static_cast<size_t>(x0.itemsize()), [&] {
    const int64_t tasks = (n + kTaskElems - 1) / kTaskElems;
    ParallelFor(ThreadsFor(threads, n * count), tasks, [&](int64_t t) {
      float acc[kVarChunk], v[kVarChunk];
      const int64_t end = std::min(n, (t + 1) * kTaskElems);
      for (int64_t i = t * kTaskElems; i < end; i += kVarChunk) {
        const int64_t len = std::min(kVarChunk, end - i);
        LoadFloats(src[0], half, i, len, acc);
        for (int64_t k = 1; k < count; ++k) {
          LoadFloats(src[static_cast<size_t>(k)], half, i, len, v);
          Combine(op, acc, v, len);
        }
        if (op == kVarMean) DivideBy(acc, scale, len);
        if (half) {
          FloatToHalfRow(acc, static_cast<uint16_t*>(dst) + i, len);
        } else {
          std::copy_n(acc, len, static_cast<float*>(dst) + i);
        }
      }
    });
  });
  return y;
}

// Binary ops of plain dtypes (`kernels.binary_num`), threaded over large tensors where numpy's ufunc runs on one
// thread: Add/Sub/Mul (integers wrap as ORT's), Div (floats), Max/Min, comparisons (bool out), And/Or/Xor of bool
// and a Mean of two floats ((a + b) / 2: the reference's fold, the sum then one divide).
// Max/Min as numpy's maximum/minimum: a NaN in either operand propagates (the first one's when both are NaN) and a
// tie (-0 against +0) gives the second operand. IEEE float operations in the input dtype: the reference's bits (but
// which NaN an Add or Mul of two NaNs gives: the compiler may swap their operands, and numpy's loops do).
enum NumOp : int {
  kNAdd = 0,
  kNSub = 1,
  kNMul = 2,
  kNDiv = 3,
  kNMax = 4,
  kNMin = 5,
  kNEqual = 6,
  kNLess = 7,
  kNLessOrEqual = 8,
  kNGreater = 9,
  kNGreaterOrEqual = 10,
  kNAnd = 11,
  kNOr = 12,
  kNXor = 13,
  kNMean = 14
};
constexpr int64_t kNumMinParallel = 1 << 16;  // output elements from which a call splits over threads

template <int Op, typename T>
inline auto NumApply(T a, T b) {
  if constexpr (Op == kNEqual) return a == b;
  if constexpr (Op == kNLess) return a < b;
  if constexpr (Op == kNLessOrEqual) return a <= b;
  if constexpr (Op == kNGreater) return a > b;
  if constexpr (Op == kNGreaterOrEqual) return a >= b;
  if constexpr (Op == kNAnd) return a && b;
  if constexpr (Op == kNOr) return a || b;
  if constexpr (Op == kNXor) return a != b;
  if constexpr (Op == kNMean) return (a + b) / T(2);
  if constexpr (Op == kNMax || Op == kNMin) {
    const bool first = Op == kNMax ? a > b : a < b;
    if constexpr (std::is_floating_point_v<T>) return (first || a != a) ? a : b;
    return first ? a : b;
  }
  if constexpr (Op <= kNDiv) {
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (Op == kNAdd) return a + b;
      if constexpr (Op == kNSub) return a - b;
      if constexpr (Op == kNMul) return a * b;
      return a / b;
    } else {  // in the unsigned type: wraps
      using U = std::make_unsigned_t<T>;
      const U ua = static_cast<U>(a), ub = static_cast<U>(b);
      if constexpr (Op == kNAdd) return static_cast<T>(static_cast<U>(ua + ub));
      if constexpr (Op == kNSub) return static_cast<T>(static_cast<U>(ua - ub));
      return static_cast<T>(static_cast<U>(ua * ub));
    }
  }
}

template <int Op, typename T>
using NumOut = decltype(NumApply<Op, T>(T{}, T{}));

// y[i] = a[i * sa] op b[i * sb], sa and sb in {0, 1}: one loop per case, so each vectorizes.
template <int Op, typename T>
__attribute__((always_inline)) inline void NumRowBody(const void* av, int64_t sa, const void* bv, int64_t sb, void* yv,
                                                      int64_t n) {
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  auto* y = static_cast<NumOut<Op, T>*>(yv);
  if (sa && sb) {
    for (int64_t i = 0; i < n; ++i) y[i] = NumApply<Op, T>(a[i], b[i]);
  } else if (sa) {
    const T v = *b;
    for (int64_t i = 0; i < n; ++i) y[i] = NumApply<Op, T>(a[i], v);
  } else if (sb) {
    const T u = *a;
    for (int64_t i = 0; i < n; ++i) y[i] = NumApply<Op, T>(u, b[i]);
  } else {
    std::fill_n(y, n, NumApply<Op, T>(*a, *b));
  }
}

template <int Op, typename T>
void NumRowDefault(const void* a, int64_t sa, const void* b, int64_t sb, void* y, int64_t n) {
  NumRowBody<Op, T>(a, sa, b, sb, y, n);
}

#if NPU_EP_X86
template <int Op, typename T>
__attribute__((target("avx2"))) void NumRowAvx2(const void* a, int64_t sa, const void* b, int64_t sb, void* y,
                                                int64_t n) {
  NumRowBody<Op, T>(a, sa, b, sb, y, n);
}

template <int Op, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void NumRowAvx512(const void* a, int64_t sa, const void* b,
                                                                       int64_t sb, void* y, int64_t n) {
  NumRowBody<Op, T>(a, sa, b, sb, y, n);
}
#endif

using NumRowFn = void (*)(const void*, int64_t, const void*, int64_t, void*, int64_t);

template <int Op, typename T>
NumRowFn NumRowFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return &NumRowAvx512<Op, T>;
  if (isa >= Isa::kAvx2) return &NumRowAvx2<Op, T>;
#endif
  return &NumRowDefault<Op, T>;
}

template <typename T>
NumRowFn NumRowForType(int op) {
  constexpr bool kFloat = std::is_floating_point_v<T>, kBool = std::is_same_v<T, bool>;
  switch (op) {
    case kNAdd:
      if constexpr (!kBool) return NumRowFor<kNAdd, T>();
      break;
    case kNSub:
      if constexpr (!kBool) return NumRowFor<kNSub, T>();
      break;
    case kNMul:
      if constexpr (!kBool) return NumRowFor<kNMul, T>();
      break;
    case kNDiv:
      if constexpr (kFloat) return NumRowFor<kNDiv, T>();
      break;
    case kNMax:
      if constexpr (!kBool) return NumRowFor<kNMax, T>();
      break;
    case kNMin:
      if constexpr (!kBool) return NumRowFor<kNMin, T>();
      break;
    case kNEqual: return NumRowFor<kNEqual, T>();
    case kNLess:
      if constexpr (!kBool) return NumRowFor<kNLess, T>();
      break;
    case kNLessOrEqual:
      if constexpr (!kBool) return NumRowFor<kNLessOrEqual, T>();
      break;
    case kNGreater:
      if constexpr (!kBool) return NumRowFor<kNGreater, T>();
      break;
    case kNGreaterOrEqual:
      if constexpr (!kBool) return NumRowFor<kNGreaterOrEqual, T>();
      break;
    case kNAnd:
      if constexpr (kBool) return NumRowFor<kNAnd, T>();
      break;
    case kNOr:
      if constexpr (kBool) return NumRowFor<kNOr, T>();
      break;
    case kNXor:
      if constexpr (kBool) return NumRowFor<kNXor, T>();
      break;
    case kNMean:
      if constexpr (kFloat) return NumRowFor<kNMean, T>();
      break;
    default: break;
  }
  return nullptr;
}

NumRowFn NumRowForDtype(int op, const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return NumRowForType<float>(op);
  if (kind == 'f' && size == 8) return NumRowForType<double>(op);
  if (kind == 'i' && size == 1) return NumRowForType<int8_t>(op);
  if (kind == 'u' && size == 1) return NumRowForType<uint8_t>(op);
  if (kind == 'i' && size == 2) return NumRowForType<int16_t>(op);
  if (kind == 'i' && size == 4) return NumRowForType<int32_t>(op);
  if (kind == 'i' && size == 8) return NumRowForType<int64_t>(op);
  if (kind == 'b' && size == 1) return NumRowForType<bool>(op);
  return nullptr;
}

py::array BinaryNumPy(int op, const py::array& a, const py::array& b, const py::object& out, int threads) {
  const NumRowFn row = a.dtype().equal(b.dtype()) ? NumRowForDtype(op, a.dtype()) : nullptr;
  if (!row || !(a.flags() & py::array::c_style) || !(b.flags() & py::array::c_style))
    throw std::invalid_argument("binary_num: op " + std::to_string(op) + " has no kernel for " +
                                std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                                std::string(py::str(b.dtype())) + ShapeText(b) + " (C-order, one dtype)");
  const Broadcast<2> p = PlanBroadcast<2>("binary_num", {&a, &b});
  const bool bool_out = op >= kNEqual && op <= kNXor;
  py::array y = BroadcastResult("binary_num", bool_out ? py::dtype::of<bool>() : a.dtype(), p, out);
  if (p.total == 0) return y;
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  auto* py_ = static_cast<char*>(y.mutable_data());
  const int64_t in_size = a.itemsize(), out_size = y.itemsize();
  const int64_t task = p.total >= 4 * kTaskElems ? kTaskElems : std::max<int64_t>(1024, (p.total + 3) / 4);
  ParallelRuns(
      p, threads, task,
      [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& unit, int64_t at, int64_t len) {
        row(pa + off[0] * in_size, unit[0], pb + off[1] * in_size, unit[1], py_ + at * out_size, len);
      },
      kNumMinParallel);
  return y;
}

}  // namespace

void BindBinary(py::module_& m) {
  m.def("binary_f16", &BinaryF16Py, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "float16 a op b (op 0 Add, 1 Sub, 2 Mul, 3 Div) with numpy broadcasting, computed in float32 and rounded "
        "once (the reference's bits), into out (a writeable C-order float16 array of the result's size: ORT's "
        "buffer) or a new array; a and b C-order");
  m.def("compare_f16", &CompareF16Py, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "float16 comparison (op 0 Equal, 1 Less, 2 LessOrEqual, 3 Greater, 4 GreaterOrEqual) with numpy broadcasting "
        "as a bool array (false with a NaN, -0 == +0), into out or a new array; a and b C-order");
  m.def("variadic_float", &VariadicFloatPy, py::arg("op"), py::arg("threads"), py::arg("out"),
        "Sum (op 0), Mean (1), Max (2) or Min (3) of the same-shape C-order float32 or float16 arrays that follow, "
        "folded in float32 and rounded once (the reference's values), into out (ORT's buffer) or a new array");
  m.def("div_int", &DivIntPy, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "int32/int64 a / b truncated toward zero (ORT's Div; INT_MIN / -1 wraps) with numpy broadcasting, into out "
        "or a new array; None when a divisor is zero (the reference raises); a and b C-order, one dtype");
  m.def("binary_num", &BinaryNumPy, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "a op b of one plain dtype with numpy broadcasting (0 Add, 1 Sub, 2 Mul, 3 Div (floats), 4 Max, 5 Min, 6 "
        "Equal, 7 Less, 8 LessOrEqual, 9 Greater, 10 GreaterOrEqual (bool out), 11 And, 12 Or, 13 Xor (bool), 14 Mean "
        "of two (floats)), the "
        "reference's bits, into out (ORT's buffer) or a new array; a and b C-order");
}

}  // namespace npu_ep::kern
