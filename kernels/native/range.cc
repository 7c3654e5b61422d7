// Range(start, limit, delta) (`kernels.range_fill`), for kernels/ops/generate.py, as the reference computes it (ORT's
// way): n = max(ceil(double(limit - start) / double(delta)), 0), the difference in the input dtype (integers wrap);
// integers start + i * delta wrapping modulo 2^bits (numpy's arange * delta + start), floats value += delta in the
// dtype from start (ORT's loop, numpy's add.accumulate). Returns None where the reference raises (delta 0, a count
// that is not finite) or for counts beyond 2^31 (the reference then gives its own error or result). The length
// follows the values, so the caller lends ORT's buffer through a callable asked with it (a fresh array of a large
// range costs its page faults, and the bridge's copy after). Integers split over threads from 8 MB (each value
// depends only on its index); floats stay in order on one thread.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the integer loops vectorize (the float one stays in order: no reassociation)
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr double kMaxCount = 2147483648.0;       // 2^31 elements
constexpr int64_t kTaskElems = 1 << 16;             // elements per parallel task
constexpr int64_t kParallelBytes = int64_t{1} << 23;  // a fill is bound by memory: a second thread pays from 8 MB
constexpr int64_t kReleaseGilBytes = int64_t{1} << 16;  // below this the GIL round trip costs more than the fill

template <typename T>
T First(const py::array& a) {
  return *static_cast<const T*>(a.data());
}

// The values, in a function of plain arguments so the running value stays in a register (inline in Fill, GCC kept it
// on the stack across the loop: a store and a reload per element).
template <typename T>
__attribute__((noinline)) void FillValues(T start, T delta, T* out, int64_t n) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // a running unsigned value: GCC vectorizes the induction (i * delta it did not)
    U v = static_cast<U>(start);
    for (int64_t i = 0; i < n; ++i, v += static_cast<U>(delta)) out[i] = static_cast<T>(v);
  } else {
    T v = start;
    for (int64_t i = 0; i < n; ++i, v += delta) out[i] = v;
  }
}

// Integers over tasks of kTaskElems: element i is start + i * delta whichever task writes it.
template <typename T>
void FillSplit(T start, T delta, T* out, int64_t n, int threads) {
  if constexpr (std::is_integral_v<T>) {
    if (n * static_cast<int64_t>(sizeof(T)) >= kParallelBytes && threads > 1) {
      using U = std::make_unsigned_t<T>;
      ParallelFor(threads, (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
        const int64_t begin = t * kTaskElems;
        const T first = static_cast<T>(static_cast<U>(begin) * static_cast<U>(delta) + static_cast<U>(start));
        FillValues(first, delta, out + begin, std::min(kTaskElems, n - begin));
      });
      return;
    }
  }
  FillValues(start, delta, out, n);
}

// lend(dims) as a writeable C-order array of T and n elements, or None (then a new array).
template <typename T>
py::object Lent(const py::object& lend, int64_t n) {
  if (lend.is_none()) return py::none();
  py::object v = lend(std::vector<int64_t>{n});
  if (!py::isinstance<py::array>(v)) return py::none();
  auto a = py::reinterpret_borrow<py::array>(v);
  if (!a.dtype().equal(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable() || a.size() != n)
    return py::none();
  return v;
}

template <typename T>
py::object Fill(const py::array& start_a, const py::array& limit_a, const py::array& delta_a, const py::object& lend,
                int threads) {
  const T start = First<T>(start_a), limit = First<T>(limit_a), delta = First<T>(delta_a);
  if (delta == T(0)) return py::none();
  T diff;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    diff = static_cast<T>(static_cast<U>(limit) - static_cast<U>(start));
  } else {
    diff = limit - start;
  }
  const double q = static_cast<double>(diff) / static_cast<double>(delta);
  if (!std::isfinite(q)) return py::none();
  const double count = std::ceil(q);
  if (count >= kMaxCount) return py::none();
  const auto n = static_cast<int64_t>(count > 0.0 ? count : 0.0);
  py::object lent = Lent<T>(lend, n);
  py::array y = lent.is_none() ? py::array_t<T>(n) : py::reinterpret_borrow<py::array>(lent);
  T* out = static_cast<T*>(y.mutable_data());
  if (n * static_cast<int64_t>(sizeof(T)) >= kReleaseGilBytes) {
    py::gil_scoped_release release;
    FillSplit(start, delta, out, n, threads);
  } else {
    FillValues(start, delta, out, n);
  }
  return std::move(y);
}

py::object RangePy(const py::array& start, const py::array& limit, const py::array& delta, const py::object& lend,
                   int threads) {
  const py::dtype dt = start.dtype();
  if (!dt.equal(limit.dtype()) || !dt.equal(delta.dtype()) || start.size() != 1 || limit.size() != 1 ||
      delta.size() != 1 || dt.byteorder() == '>')
    throw std::invalid_argument("range_fill: start, limit and delta must be one-element arrays of one dtype, got " +
                                std::string(py::str(dt)) + ", " + std::string(py::str(limit.dtype())) + ", " +
                                std::string(py::str(delta.dtype())));
  const auto size = dt.itemsize();
  if (dt.kind() == 'f' && size == 4) return Fill<float>(start, limit, delta, lend, threads);
  if (dt.kind() == 'f' && size == 8) return Fill<double>(start, limit, delta, lend, threads);
  if (dt.kind() == 'i' && size == 2) return Fill<int16_t>(start, limit, delta, lend, threads);
  if (dt.kind() == 'i' && size == 4) return Fill<int32_t>(start, limit, delta, lend, threads);
  if (dt.kind() == 'i' && size == 8) return Fill<int64_t>(start, limit, delta, lend, threads);
  throw std::invalid_argument("range_fill: dtype " + std::string(py::str(dt)) +
                              " is not one of float32, float64, int16, int32, int64");
}

}  // namespace

void BindRange(py::module_& m) {
  m.def("range_fill", &RangePy, py::arg("start"), py::arg("limit"), py::arg("delta"), py::arg("lend") = py::none(),
        py::arg("threads") = 1,
        "ONNX Range as the reference computes it (integers wrap, floats accumulate value += delta); None for delta 0, "
        "a count that is not finite or beyond 2^31 (the reference answers). lend: None or a callable given [n] that "
        "returns the array to write (ORT's buffer: a writeable C-order array of the dtype and n elements) or "
        "anything else for a new array");
}

}  // namespace npu_ep::kern
