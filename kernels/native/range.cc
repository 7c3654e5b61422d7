// Range(start, limit, delta) (`kernels.range_fill`), for kernels/ops/generate.py, as the reference computes it (ORT's
// way): n = max(ceil(double(limit - start) / double(delta)), 0), the difference in the input dtype (integers wrap);
// integers start + i * delta wrapping modulo 2^bits (numpy's arange * delta + start), floats value += delta in the
// dtype from start (ORT's loop, numpy's add.accumulate). Returns None where the reference raises (delta 0, a count
// that is not finite) or for counts beyond 2^31 (the reference then gives its own error or result). The length
// follows the values, so the caller lends ORT's buffer through a callable asked with it (a fresh array of a large
// range costs its page faults, and the bridge's copy after). Integers split over threads from 8 MB (each value
// depends only on its index); floats take the closed form where it gives the in-order values (ClosedForm), which
// splits the same way, and the in-order loop from where it does not.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the integer loops vectorize (the float one stays in order: no reassociation)
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr double kMaxCount = 2147483648.0;       // 2^31 elements
constexpr int64_t kTaskElems = 1 << 16;  // elements per parallel task
constexpr int64_t kCheckElems = 1 << 10;  // a float range's closed form is written then checked in runs of these
constexpr int64_t kParallelBytes = int64_t{1} << 23;  // a fill is bound by memory: a second thread pays from 8 MB
constexpr int64_t kReleaseGilBytes = int64_t{1} << 16;  // below this the GIL round trip costs more than the fill

template <typename T>
T First(const py::array& a) {
  return *static_cast<const T*>(a.data());
}

template <typename T>
__attribute__((always_inline)) inline void IntValues(T start, T delta, T* out, int64_t n) {
  using U = std::make_unsigned_t<T>;  // a running unsigned value: GCC vectorizes the induction (i * delta it did not)
  U v = static_cast<U>(start);
  for (int64_t i = 0; i < n; ++i, v += static_cast<U>(delta)) out[i] = static_cast<T>(v);
}

#if NPU_EP_X86
// The same integers with 32-byte stores (this file is built for the baseline ISA).
template <typename T>
__attribute__((target("avx2"), noinline)) void IntValuesAvx2(T start, T delta, T* out, int64_t n) {
  IntValues(start, delta, out, n);
}
#endif

// The values, in a function of plain arguments so the running value stays in a register (inline in Fill, GCC kept it
// on the stack across the loop: a store and a reload per element).
template <typename T>
__attribute__((noinline)) void FillValues(T start, T delta, T* out, int64_t n) {
  if constexpr (std::is_integral_v<T>) {
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx2) return IntValuesAvx2(start, delta, out, n);
#endif
    IntValues(start, delta, out, n);
  } else {
    T v = start;
    for (int64_t i = 0; i < n; ++i, v += delta) out[i] = v;
  }
}

// Whether `next` (the previous value plus delta, rounded) is not `value`, bit for bit.
template <typename T>
auto Differs(T next, T value) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  Bits a, b;
  std::memcpy(&a, &next, sizeof a);
  std::memcpy(&b, &value, sizeof b);
  return a ^ b;
}

// A float range's in-order values v_i = v_{i-1} + delta (rounded) from v_0 = start, where a closed form holds: writes
// c_i = start + T(i) * delta over [begin, end) and returns the first i in (begin, end) whose c_{i-1} + delta does not
// round to c_i bit for bit, or end (the caller checks i = begin against what is at begin - 1). Up to that index c
// is v, by induction from v_0. Integer-valued and power-of-two steps, the common ranges, hold throughout; a step
// like 0.1 fails within a few elements.
template <typename T>
__attribute__((always_inline)) inline int64_t ClosedFormRuns(T start, T delta, T* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kCheckElems) {
    const int64_t stop = std::min(i + kCheckElems, end);
    const auto first = static_cast<int32_t>(i), count = static_cast<int32_t>(stop - i);  // counts are below 2^31
    T* o = out + i;
    for (int32_t k = 0; k < count; ++k) o[k] = static_cast<T>(start + static_cast<T>(first + k) * delta);
    const int64_t from = i == begin ? i + 1 : i;
    decltype(Differs(start, start)) bad = 0;
    for (int64_t j = from; j < stop; ++j) bad |= Differs(static_cast<T>(out[j - 1] + delta), out[j]);
    if (bad != 0)
      for (int64_t j = from; j < stop; ++j)
        if (Differs(static_cast<T>(out[j - 1] + delta), out[j]) != 0) return j;
  }
  return end;
}

#if NPU_EP_X86
// The same with 32-byte vectors: the check makes the bits the in-order loop's whatever the candidates' rounding.
template <typename T>
__attribute__((target("avx2"), noinline)) int64_t ClosedFormAvx2(T start, T delta, T* out, int64_t begin, int64_t end) {
  return ClosedFormRuns(start, delta, out, begin, end);
}
#endif

template <typename T>
int64_t ClosedForm(T start, T delta, T* out, int64_t begin, int64_t end) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2) return ClosedFormAvx2(start, delta, out, begin, end);
#endif
  return ClosedFormRuns(start, delta, out, begin, end);
}

// Integers over tasks of kTaskElems: element i is start + i * delta whichever task writes it. Floats: the closed form
// where it holds (tried on the first kCheckElems, then in tasks), the in-order loop from the first index where it
// does not, so the bits are the in-order loop's on any number of threads.
template <typename T>
void FillSplit(T start, T delta, T* out, int64_t n, int threads) {
  const int use = n * static_cast<int64_t>(sizeof(T)) >= kParallelBytes ? threads : 1;
  if constexpr (std::is_integral_v<T>) {
    if (use == 1) return FillValues(start, delta, out, n);
    using U = std::make_unsigned_t<T>;
    ParallelFor(use, (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
      const int64_t begin = t * kTaskElems;
      const T first = static_cast<T>(static_cast<U>(begin) * static_cast<U>(delta) + static_cast<U>(start));
      FillValues(first, delta, out + begin, std::min(kTaskElems, n - begin));
    });
  } else {
    if (n == 0) return;
    out[0] = start;
    const int64_t probe = std::min(n, kCheckElems);  // a range the closed form misses goes in order at once
    int64_t k = ClosedForm(start, delta, out, 1, probe);
    if (probe > 1 && Differs(static_cast<T>(out[0] + delta), out[1])) k = 1;
    if (k == probe && k < n) {
      const int64_t tasks = (n - probe + kTaskElems - 1) / kTaskElems;
      std::vector<int64_t> failed(static_cast<size_t>(tasks), n);
      ParallelFor(use, tasks, [&](int64_t t) {
        const int64_t begin = probe + t * kTaskElems, end = std::min(begin + kTaskElems, n);
        const int64_t at = ClosedForm(start, delta, out, begin, end);
        if (at < end) failed[static_cast<size_t>(t)] = at;
      });
      for (int64_t t = 0; t < tasks; ++t) {  // each task's first element against the value before it
        const int64_t begin = probe + t * kTaskElems;
        if (Differs(static_cast<T>(out[begin - 1] + delta), out[begin])) failed[static_cast<size_t>(t)] = begin;
      }
      k = *std::min_element(failed.begin(), failed.end());
    }
    if (k < n) FillValues(static_cast<T>(out[k - 1] + delta), delta, out + k, n - k);
  }
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
    FillSplit(start, delta, out, n, 1);
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
