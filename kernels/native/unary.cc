// Unary element-wise ops of plain dtypes for kernels/ops/elementwise.py and activation.py, threaded over large
// tensors (numpy's ufunc runs on one thread): Relu/Abs/Neg/Sqrt/Not (`kernels.unary_num`) and Clip by one-element
// bounds (`kernels.clip_num`, also of unsigned integers). Each gives the reference's bits: IEEE float32/float64
// operations (sqrt correctly rounded), integers wrapping as ORT's (Abs and Neg of INT_MIN are INT_MIN, numpy's too).
// Relu of floats is the reference's clip(x, 0, inf): +0 where x < 0, NaN and -0 kept; of integers max(x, 0). Clip is
// numpy's clip ufunc: max(x, lo) keeps x on a tie and a NaN x, min(., hi) likewise; a NaN bound makes the call return
// None (the reference runs). The loops are plain C++ compiled per instruction set (one clone per ISA, the same
// operations in each).
#if !defined(__clang__)     // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3", "no-math-errno")  // the loops vectorize (sqrt sets no errno: no value changes)
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

#include "cpu.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

enum UnaryNumOp : int { kRelu = 0, kAbs = 1, kNeg = 2, kSqrt = 3, kNot = 4, kClip = 5 };

constexpr int64_t kTaskElems = 32768;       // elements per parallel task (8/16-bit: as many bytes as float32's)
constexpr int64_t kMinParallel = 1 << 16;  // elements from which a call splits over threads (8/16-bit: 1 MB)

// 8/16-bit elements go 64/32 per instruction: a split pays only from more elements than the wider types'.
inline int64_t TaskElems(int64_t itemsize) { return itemsize <= 2 ? 4 * kTaskElems / itemsize : kTaskElems; }
inline int64_t MinParallelElems(int64_t itemsize) {
  return itemsize <= 2 ? (int64_t{1} << 20) / itemsize : kMinParallel;
}

template <int Op, typename T>
inline T Apply(T x, T lo, T hi) {
  if constexpr (Op == kNot) {
    return !x;
  } else if constexpr (Op == kClip) {
    const T y = (x < lo) ? lo : x;  // NaN x and ties keep x
    return (y > hi) ? hi : y;
  } else if constexpr (std::is_floating_point_v<T>) {
    if constexpr (Op == kRelu) return x < T(0) ? T(0) : x;
    if constexpr (Op == kAbs) return std::fabs(x);
    if constexpr (Op == kNeg) return -x;
    return std::sqrt(x);
  } else {
    using U = std::make_unsigned_t<T>;
    const T neg = static_cast<T>(U{0} - static_cast<U>(x));  // wraps: -INT_MIN == INT_MIN
    if constexpr (Op == kRelu) return x > T(0) ? x : T(0);
    if constexpr (Op == kAbs) return x < T(0) ? neg : x;
    return neg;
  }
}

template <int Op, typename T>
__attribute__((always_inline)) inline void RowBody(const void* xv, void* yv, int64_t n, T lo, T hi) {
  if constexpr (Op == kNot) {  // on the bytes (a bool loop does not vectorize)
    const auto* x = static_cast<const uint8_t*>(xv);
    auto* y = static_cast<uint8_t*>(yv);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] == 0;
  } else {
    const T* x = static_cast<const T*>(xv);
    T* y = static_cast<T*>(yv);
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<Op, T>(x[i], lo, hi);
  }
}

template <int Op, typename T>
void RowDefault(const void* x, void* y, int64_t n, const void* lo, const void* hi) {
  RowBody<Op, T>(x, y, n, lo ? *static_cast<const T*>(lo) : T{}, hi ? *static_cast<const T*>(hi) : T{});
}

#if NPU_EP_X86
// Sqrt in lanes (std::sqrt's loop does not vectorize where it may set errno): vsqrtps/vsqrtpd, correctly rounded
__attribute__((target("avx2"))) int64_t SqrtLanesAvx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2"))) int64_t SqrtLanesAvx2(const double* x, double* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
  return i;
}

__attribute__((target("avx512f"))) int64_t SqrtLanesAvx512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx512f"))) int64_t SqrtLanesAvx512(const double* x, double* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(y + i, _mm512_sqrt_pd(_mm512_loadu_pd(x + i)));
  return i;
}

// max(a, b) and min(a, b) in lanes of T (8/16-bit, signed or not).
template <typename T>
__attribute__((target("avx512f,avx512bw"))) inline __m512i MaxOf(__m512i a, __m512i b) {
  if constexpr (std::is_same_v<T, uint8_t>) return _mm512_max_epu8(a, b);
  if constexpr (std::is_same_v<T, int8_t>) return _mm512_max_epi8(a, b);
  if constexpr (std::is_same_v<T, uint16_t>) return _mm512_max_epu16(a, b);
  if constexpr (std::is_same_v<T, int16_t>) return _mm512_max_epi16(a, b);
}

template <typename T>
__attribute__((target("avx512f,avx512bw"))) inline __m512i MinOf(__m512i a, __m512i b) {
  if constexpr (std::is_same_v<T, uint8_t>) return _mm512_min_epu8(a, b);
  if constexpr (std::is_same_v<T, int8_t>) return _mm512_min_epi8(a, b);
  if constexpr (std::is_same_v<T, uint16_t>) return _mm512_min_epu16(a, b);
  if constexpr (std::is_same_v<T, int16_t>) return _mm512_min_epi16(a, b);
}

// Clip of 8/16-bit integers in whole vectors (64 or 32 lanes, the tail masked): max(x, lo) then min(., hi), the
// scalar Apply's values (integers have no NaN or signed zero to tell the orders apart).
template <typename T>
__attribute__((target("avx512f,avx512bw"))) void ClipLanesAvx512(const T* x, T* y, int64_t n, T lo, T hi) {
  constexpr int64_t kLanes = 64 / sizeof(T);
  const __m512i lov =
      sizeof(T) == 1 ? _mm512_set1_epi8(static_cast<char>(lo)) : _mm512_set1_epi16(static_cast<short>(lo));
  const __m512i hiv =
      sizeof(T) == 1 ? _mm512_set1_epi8(static_cast<char>(hi)) : _mm512_set1_epi16(static_cast<short>(hi));
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + kLanes);
    const __m512i c = _mm512_loadu_si512(x + i + 2 * kLanes), d = _mm512_loadu_si512(x + i + 3 * kLanes);
    _mm512_storeu_si512(y + i, MinOf<T>(MaxOf<T>(a, lov), hiv));
    _mm512_storeu_si512(y + i + kLanes, MinOf<T>(MaxOf<T>(b, lov), hiv));
    _mm512_storeu_si512(y + i + 2 * kLanes, MinOf<T>(MaxOf<T>(c, lov), hiv));
    _mm512_storeu_si512(y + i + 3 * kLanes, MinOf<T>(MaxOf<T>(d, lov), hiv));
  }
  for (; i < n; i += kLanes) {
    const int64_t left = std::min(kLanes, n - i);
    if constexpr (sizeof(T) == 1) {
      const __mmask64 k = left == 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
      _mm512_mask_storeu_epi8(y + i, k, MinOf<T>(MaxOf<T>(_mm512_maskz_loadu_epi8(k, x + i), lov), hiv));
    } else {
      const __mmask32 k = left == 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
      _mm512_mask_storeu_epi16(y + i, k, MinOf<T>(MaxOf<T>(_mm512_maskz_loadu_epi16(k, x + i), lov), hiv));
    }
  }
}

template <int Op, typename T>
__attribute__((target("avx2"))) void RowAvx2(const void* x, void* y, int64_t n, const void* lo, const void* hi) {
  if constexpr (Op == kSqrt) {
    const int64_t i = SqrtLanesAvx2(static_cast<const T*>(x), static_cast<T*>(y), n);
    x = static_cast<const T*>(x) + i;
    y = static_cast<T*>(y) + i;
    n -= i;
  }
  RowBody<Op, T>(x, y, n, lo ? *static_cast<const T*>(lo) : T{}, hi ? *static_cast<const T*>(hi) : T{});
}

template <int Op, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void RowAvx512(const void* x, void* y, int64_t n, const void* lo,
                                                                    const void* hi) {
  if constexpr (Op == kSqrt) {
    const int64_t i = SqrtLanesAvx512(static_cast<const T*>(x), static_cast<T*>(y), n);
    x = static_cast<const T*>(x) + i;
    y = static_cast<T*>(y) + i;
    n -= i;
  }
  if constexpr (Op == kClip && std::is_integral_v<T> && sizeof(T) <= 2) {
    return ClipLanesAvx512<T>(static_cast<const T*>(x), static_cast<T*>(y), n, *static_cast<const T*>(lo),
                              *static_cast<const T*>(hi));
  }
  RowBody<Op, T>(x, y, n, lo ? *static_cast<const T*>(lo) : T{}, hi ? *static_cast<const T*>(hi) : T{});
}
#endif

using RowFn = void (*)(const void*, void*, int64_t, const void*, const void*);

template <int Op, typename T>
RowFn RowFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return &RowAvx512<Op, T>;
  if (isa >= Isa::kAvx2) return &RowAvx2<Op, T>;
#endif
  return &RowDefault<Op, T>;
}

template <typename T>
RowFn RowForType(int op) {
  constexpr bool kFloat = std::is_floating_point_v<T>, kBool = std::is_same_v<T, bool>;
  switch (op) {
    case kRelu:
      if constexpr (!kBool) return RowFor<kRelu, T>();
      break;
    case kAbs:
      if constexpr (!kBool) return RowFor<kAbs, T>();
      break;
    case kNeg:
      if constexpr (!kBool) return RowFor<kNeg, T>();
      break;
    case kSqrt:
      if constexpr (kFloat) return RowFor<kSqrt, T>();
      break;
    case kNot:
      if constexpr (kBool) return RowFor<kNot, T>();
      break;
    case kClip:
      if constexpr (!kBool) return RowFor<kClip, T>();
      break;
    default: break;
  }
  return nullptr;
}

// The row function of op on x's dtype (float32/float64, int8/int16/int32/int64, bool for Not, unsigned for Clip),
// or null.
RowFn RowForDtype(int op, const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return RowForType<float>(op);
  if (kind == 'f' && size == 8) return RowForType<double>(op);
  if (kind == 'i' && size == 1) return RowForType<int8_t>(op);
  if (kind == 'i' && size == 2) return RowForType<int16_t>(op);
  if (kind == 'i' && size == 4) return RowForType<int32_t>(op);
  if (kind == 'i' && size == 8) return RowForType<int64_t>(op);
  if (kind == 'b' && size == 1) return RowForType<bool>(op);
  if (kind == 'u' && op == kClip) {  // numpy's clip of unsigned integers (the other ops take signed ones)
    if (size == 1) return RowFor<kClip, uint8_t>();
    if (size == 2) return RowFor<kClip, uint16_t>();
    if (size == 4) return RowFor<kClip, uint32_t>();
    if (size == 8) return RowFor<kClip, uint64_t>();
  }
  return nullptr;
}

py::array Run(const char* fn, RowFn row, const py::array& x, const py::object& out, int threads, const void* lo,
              const void* hi) {
  const py::dtype dt = x.dtype();
  // out, or null when it is not an array (a default py::array would be a new empty numpy array per call)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(dt, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    if (!y || !y.dtype().equal(dt) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
      throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " + std::string(py::str(dt)) +
                                  " array of " + std::to_string(x.size()) + " elements");
  }
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  const int64_t n = x.size(), size = dt.itemsize(), task_elems = TaskElems(size);
  const int64_t task = n >= 4 * task_elems ? task_elems : std::max<int64_t>(1024, (n + 3) / 4);
  RunMoving(static_cast<size_t>(n * size), [&] {
    ParallelFor(n < MinParallelElems(size) ? 1 : threads, (n + task - 1) / task, [&](int64_t t) {
      const int64_t begin = t * task;
      row(src + begin * size, dst + begin * size, std::min(n, begin + task) - begin, lo, hi);
    });
  });
  return y;
}

void CheckX(const char* fn, const py::array& x) {
  if (!(x.flags() & py::array::c_style)) throw std::invalid_argument(std::string(fn) + ": x must be C-order");
}

py::array UnaryNumPy(int op, const py::array& x, const py::object& out, int threads) {
  CheckX("unary_num", x);
  const RowFn row = op == kClip ? nullptr : RowForDtype(op, x.dtype());
  if (!row)
    throw std::invalid_argument("unary_num: op " + std::to_string(op) + " (0 Relu, 1 Abs, 2 Neg, 3 Sqrt, 4 Not) of " +
                                std::string(py::str(x.dtype())) + " has no kernel");
  return Run("unary_num", row, x, out, threads, nullptr, nullptr);
}

template <typename T>
bool IsNan(const void* p) {
  if constexpr (std::is_floating_point_v<T>) {
    const T v = *static_cast<const T*>(p);
    return v != v;
  } else {
    (void)p;
    return false;
  }
}

py::object ClipNumPy(const py::array& x, const py::array& lo, const py::array& hi, const py::object& out, int threads) {
  CheckX("clip_num", x);
  const RowFn row = RowForDtype(kClip, x.dtype());
  if (!row || !lo.dtype().equal(x.dtype()) || !hi.dtype().equal(x.dtype()) || lo.size() != 1 || hi.size() != 1)
    throw std::invalid_argument(
        "clip_num: x must be float32/float64/(u)int8/16/32/64 and lo, hi one element "
        "of its dtype, got " +
        std::string(py::str(x.dtype())) + ", " + std::string(py::str(lo.dtype())) + ", " +
        std::string(py::str(hi.dtype())));
  const bool nan_bound =
      x.dtype().kind() == 'f' && (x.itemsize() == 4 ? IsNan<float>(lo.data()) || IsNan<float>(hi.data())
                                                    : IsNan<double>(lo.data()) || IsNan<double>(hi.data()));
  if (nan_bound) return py::none();  // numpy's clip fills NaN: left to the reference
  return Run("clip_num", row, x, out, threads, lo.data(), hi.data());
}

}  // namespace

void BindUnaryNum(py::module_& m) {
  m.def("unary_num", &UnaryNumPy, py::arg("op"), py::arg("x"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "op(x) of a C-order float32/float64/int8/int16/int32/int64 array (0 Relu, 1 Abs, 2 Neg, 3 Sqrt: floats; 4 Not: "
        "bool), the reference's bits (integers wrap), into out (ORT's buffer) or a new array of x's shape");
  m.def("clip_num", &ClipNumPy, py::arg("x"), py::arg("lo"), py::arg("hi"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "numpy's clip(x, lo, hi) of a C-order float32/float64/(u)int8/16/32/64 array by one-element bounds of its "
        "dtype (ties and NaN keep x), into out or a new array; None for a NaN bound (numpy fills NaN)");
}

}  // namespace npu_ep::kern
