// Cast between numeric dtypes (`kernels.cast`), for kernels/ops/elementwise.py, with numpy's astype results (the
// reference model): to float32/float64 and float to float16 a C++ conversion (round to nearest even, exact where the
// type holds the value; float32 <-> float16 in F16C lanes); integer to integer wraps modulo 2^bits, as C and numpy;
// to bool x != 0 (NaN is true); float to integer truncates toward zero where the value fits, and the call returns
// None when one does not (NaN, Inf, out of range: numpy's result is the platform's, so the reference runs).
// Integer to float16 is not taken (None): numpy rounds it in its own order. The loops are built for AVX2 too, taken
// on hosts that run it, and 64-bit integers to float for AVX-512DQ.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the conversion loops vectorize
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 32768;  // elements per parallel task

using Half = _Float16;

template <typename T>
constexpr bool kFloat = std::is_floating_point_v<T> || std::is_same_v<T, Half>;

// y = x converted for n elements; false when a value has no defined conversion here (float to integer out of range).
template <typename S, typename D>
__attribute__((always_inline)) inline bool ConvertRow(const S* x, D* y, int64_t n) {
  if constexpr (std::is_same_v<D, bool>) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] != S(0);
    return true;
  } else if constexpr (std::is_same_v<S, bool>) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(x);  // a compare, not a branch per element
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<D>(static_cast<int>(bytes[i] != 0));
    return true;
  } else if constexpr (kFloat<S> && !kFloat<D>) {
    // fits: trunc(v) in [min, max], i.e. min - 1 < v < max + 1 (both bounds exact in double up to 32 bits; for 64
    // bits the lower bound rounds to -2^63, declining -2^63 itself: the reference then gives it)
    constexpr double lo = static_cast<double>(std::numeric_limits<D>::min()) - 1.0;
    constexpr double hi = static_cast<double>(std::numeric_limits<D>::max()) + 1.0;
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      const bool fits = v > lo && v < hi;
      ok &= fits;
      y[i] = fits ? static_cast<D>(v) : D(0);
    }
    return ok;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<D>(x[i]);
    return true;
  }
}

template <typename S, typename D>
bool ConvertRowDefault(const S* x, D* y, int64_t n) {
  return ConvertRow(x, y, n);
}

#if NPU_EP_X86
// The same loops in 8 lanes (SSE2's 4 leave a conversion from int32 or bytes at numpy's AVX2 loops' half speed).
template <typename S, typename D>
__attribute__((target("avx2"))) bool ConvertRowAvx2(const S* x, D* y, int64_t n) {
  return ConvertRow(x, y, n);
}

// 64-bit integers to float in AVX-512DQ lanes (vcvtqq2ps and kin: AVX2 has no such lanes, so its loop is scalar);
// they round as the scalar conversion does, to nearest even.
template <typename S, typename D>
__attribute__((target("avx2,avx512f,avx512dq,avx512vl"))) bool ConvertRowAvx512Dq(const S* x, D* y, int64_t n) {
  return ConvertRow(x, y, n);
}

// float32 <-> float16 in 16 lanes (the same conversion instructions as F16C's 8, so the same bits).
__attribute__((target("avx512f"))) void FloatToHalfAvx512(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (i < n) FloatToHalfRow(s + i, d + i, n - i);
}

__attribute__((target("avx512f"))) void HalfToFloatAvx512(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  if (i < n) HalfToFloatRow(s + i, d + i, n - i);
}

bool HasAvx512Dq() {
  static const bool yes = __builtin_cpu_supports("avx512dq");
  return yes;
}

template <typename S, typename D>
constexpr bool kWideIntToFloat = sizeof(S) == 8 && std::is_integral_v<S> && std::is_floating_point_v<D>;
#endif

template <typename S, typename D>
bool Convert(const S* x, D* y, int64_t n) {
  if constexpr (std::is_same_v<S, Half> && std::is_same_v<D, float>) {
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return HalfToFloatAvx512(reinterpret_cast<const uint16_t*>(x), y, n), true;
#endif
    return HalfToFloatRow(reinterpret_cast<const uint16_t*>(x), y, n), true;
  }
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Half>) {
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return FloatToHalfAvx512(x, reinterpret_cast<uint16_t*>(y), n), true;
#endif
    return FloatToHalfRow(x, reinterpret_cast<uint16_t*>(y), n), true;
  }
#if NPU_EP_X86
  if constexpr (kWideIntToFloat<S, D>) {
    if (ActiveIsa() >= Isa::kAvx512 && HasAvx512Dq()) return ConvertRowAvx512Dq(x, y, n);
  }
  if (ActiveIsa() >= Isa::kAvx2) return ConvertRowAvx2(x, y, n);
#endif
  return ConvertRowDefault(x, y, n);
}

template <typename S, typename D>
py::object CastAs(const py::array& x, py::array& y, int threads) {
  if constexpr (std::is_same_v<D, Half> && !kFloat<S> && !std::is_same_v<S, bool>) {
    return py::none();  // integer to float16: numpy's own rounding order (the reference runs)
  } else {
    const auto* src = static_cast<const S*>(x.data());
    auto* dst = static_cast<D*>(y.mutable_data());
    const int64_t n = x.size();
    std::atomic<bool> ok{true};
    RunMoving(static_cast<size_t>(n) * std::max(sizeof(S), sizeof(D)), [&] {
      ParallelFor(ThreadsFor(threads, n), (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
        const int64_t begin = t * kTaskElems, len = std::min(n, begin + kTaskElems) - begin;
        if (!Convert(src + begin, dst + begin, len)) ok.store(false, std::memory_order_relaxed);
      });
    });
    if (!ok.load()) return py::none();
    return y;
  }
}

// f(T{}) for the C++ type of a numpy dtype; false if it is not one of the twelve numeric types in native byte order.
// Read from the descriptor's kind and size (no dtype objects made per call).
template <typename F>
bool WithType(const py::dtype& dt, F&& f) {
  if (dt.byteorder() == '>') return false;
  const auto size = dt.itemsize();
  switch (dt.kind()) {
    case 'b': return size == 1 && (f(bool{}), true);
    case 'i':
      if (size == 1) return f(int8_t{}), true;
      if (size == 2) return f(int16_t{}), true;
      if (size == 4) return f(int32_t{}), true;
      if (size == 8) return f(int64_t{}), true;
      return false;
    case 'u':
      if (size == 1) return f(uint8_t{}), true;
      if (size == 2) return f(uint16_t{}), true;
      if (size == 4) return f(uint32_t{}), true;
      if (size == 8) return f(uint64_t{}), true;
      return false;
    case 'f':
      if (size == 2) return f(Half{}), true;
      if (size == 4) return f(float{}), true;
      if (size == 8) return f(double{}), true;
      return false;
    default: return false;
  }
}

py::object CastPy(const py::array& x, const py::dtype& to, const py::object& out, int threads) {
  if (!(x.flags() & py::array::c_style)) throw std::invalid_argument("cast: x must be a C-order array");
  // out, or null when it is not an array (no empty array made to hold nothing)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(to, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    if (!y || !y.dtype().equal(to) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
      throw std::invalid_argument("cast: out must be a writeable C-order " + std::string(py::str(to)) + " array of " +
                                  std::to_string(x.size()) + " elements");
  }
  py::object result;
  bool known = false;
  WithType(x.dtype(), [&](auto s) {
    known = WithType(to, [&](auto d) { result = CastAs<decltype(s), decltype(d)>(x, y, threads); });
  });
  if (!known)
    throw std::invalid_argument("cast: " + std::string(py::str(x.dtype())) + " to " + std::string(py::str(to)) +
                                " is not a cast between numeric dtypes");
  return result;
}

}  // namespace

void BindCast(py::module_& m) {
  m.def("cast", &CastPy, py::arg("x"), py::arg("to"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "C-order x as dtype `to` with numpy's astype values (bool, int8..uint64, float16/32/64), into out (ORT's "
        "buffer) or a new array; None where numpy's result is the platform's (a float out of the integer's range, "
        "NaN, Inf) and for integer to float16");
}

}  // namespace npu_ep::kern
