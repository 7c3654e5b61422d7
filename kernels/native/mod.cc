// ONNX Mod with numpy broadcasting (`kernels.mod_into`) for kernels/ops/elementwise.py's Mod, as ORT's CPU kernel
// and the reference (numpy): fmod=0 on integers is numpy's remainder (the result takes the divisor's sign, Python's
// %), fmod=1 is C's fmod (the dividend's sign: integer % truncating toward zero, std::fmod on floats). float16 is
// widened exactly, std::fmod'd in float32 and narrowed: fmod's result is exact, so the rounding changes nothing and
// the bits are numpy's (NaN for a NaN operand, an infinite dividend or a zero divisor; x for an infinite divisor;
// a zero result keeps the dividend's sign). A remainder by -1 is 0 (INT_MIN % -1 would trap); an integer zero
// divisor makes the call return None, so the reference raises its error naming the node.
// Broadcasting: broadcast.h's merged axes, each row a contiguous output run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "broadcast.h"
#include "half.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 8192;   // output elements per parallel task
constexpr int64_t kWorkPerElem = 32;  // fmod and integer % cost ~10-40 cycles an element: threads from 32768 on

// numpy's integer remainder: C's % moved to the divisor's sign (fmod=0), or C's % itself (Fmod); d is not 0.
template <typename T, bool Fmod>
inline T IntMod(T x, T d) {
  if constexpr (std::is_signed_v<T>) {
    if (d == -1) return T{0};
    const T r = static_cast<T>(x % d);
    if constexpr (Fmod) return r;
    return (r != 0 && ((r < 0) != (d < 0))) ? static_cast<T>(r + d) : r;
  } else {
    return static_cast<T>(x % d);
  }
}

// y[i] = a[i * sa] mod b[i * sb]; a zero divisor sets `zero` (its result is left 0).
template <typename T, bool Fmod>
void IntRow(const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n, std::atomic<bool>& zero) {
  bool any_zero = false;
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i * sa], d = b[i * sb];
    any_zero |= d == 0;
    y[i] = d == 0 ? T{0} : IntMod<T, Fmod>(x, d);
  }
  if (any_zero) zero.store(true, std::memory_order_relaxed);
}

// len float16 values widened: a contiguous run (unit 1) or one value repeated (unit 0).
void WidenRun(const uint16_t* h, int64_t unit, float* f, int64_t len) {
  if (unit) return HalfToFloatRow(h, f, len);
  HalfToFloatRow(h, f, 1);
  std::fill(f + 1, f + len, f[0]);
}

template <typename T>
void FloatRow(const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fmod(a[i * sa], b[i * sb]);
}

// float16 in chunks widened to float32 (half.h's rows: F16C where the host has it), fmod'd, narrowed.
void HalfRow(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, uint16_t* y, int64_t n) {
  constexpr int64_t kChunk = 256;
  float fa[kChunk], fb[kChunk];
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t len = std::min(kChunk, n - at);
    WidenRun(a + at * sa, sa, fa, len);
    WidenRun(b + at * sb, sb, fb, len);
    for (int64_t i = 0; i < len; ++i) fa[i] = std::fmod(fa[i], fb[i]);
    FloatToHalfRow(fa, y + at, len);
  }
}

// row(a, its unit stride, b, its unit stride, y, n) over the broadcast of C-order a and b into out or a new array.
template <typename T, typename Row>
py::array RunMod(const Row& row, const py::array& a, const py::array& b, const py::object& out, int threads) {
  const Broadcast<2> p = PlanBroadcast<2>("mod_into", {&a, &b});
  py::array y = BroadcastResult("mod_into", a.dtype(), p, out);
  if (p.total == 0) return y;
  const auto* pa = static_cast<const T*>(a.data());
  const auto* pb = static_cast<const T*>(b.data());
  auto* py_ = static_cast<T*>(y.mutable_data());
  const auto run = [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& unit, int64_t at, int64_t len) {
    row(pa + off[0], unit[0], pb + off[1], unit[1], py_ + at, len);
  };
  py::gil_scoped_release release;
  // broadcast.h's ParallelRuns with the work weighted: an element costs kWorkPerElem copies' time
  ParallelFor(ThreadsFor(threads, p.total * kWorkPerElem), (p.total + kTaskElems - 1) / kTaskElems,
              [&](int64_t t) { ForEachRun(p, t * kTaskElems, std::min(p.total, (t + 1) * kTaskElems), run); });
  return y;
}

template <typename T>
py::object ModInt(const py::array& a, const py::array& b, bool fmod, const py::object& out, int threads) {
  std::atomic<bool> zero{false};
  const auto row = [&zero, fmod](const T* x, int64_t sx, const T* d, int64_t sd, T* r, int64_t n) {
    if (fmod) return IntRow<T, true>(x, sx, d, sd, r, n, zero);
    IntRow<T, false>(x, sx, d, sd, r, n, zero);
  };
  py::array y = RunMod<T>(row, a, b, out, threads);
  if (zero.load()) return py::none();  // the reference raises, naming the node and the zero divisors
  return std::move(y);
}

py::object ModPy(const py::array& a, const py::array& b, bool fmod, const py::object& out, int threads) {
  const bool c_order = (a.flags() & py::array::c_style) && (b.flags() & py::array::c_style);
  const char kind = a.dtype().kind();
  const auto size = a.itemsize();
  if (!c_order || !a.dtype().equal(b.dtype()) || (kind == 'f' && !fmod) || (kind != 'f' && kind != 'i' && kind != 'u'))
    throw std::invalid_argument(
        "mod_into: a and b must be C-order arrays of one integer or float dtype (floats with fmod=1), got " +
        std::string(py::str(a.dtype())) + ShapeText(a) + " and " + std::string(py::str(b.dtype())) + ShapeText(b) +
        ", fmod=" + std::to_string(fmod));
  if (kind == 'f') {
    if (size == 2) return RunMod<uint16_t>(HalfRow, a, b, out, threads);
    if (size == 4) return RunMod<float>(FloatRow<float>, a, b, out, threads);
    return RunMod<double>(FloatRow<double>, a, b, out, threads);
  }
  if (kind == 'i') {
    if (size == 1) return ModInt<int8_t>(a, b, fmod, out, threads);
    if (size == 2) return ModInt<int16_t>(a, b, fmod, out, threads);
    if (size == 4) return ModInt<int32_t>(a, b, fmod, out, threads);
    return ModInt<int64_t>(a, b, fmod, out, threads);
  }
  if (size == 1) return ModInt<uint8_t>(a, b, fmod, out, threads);
  if (size == 2) return ModInt<uint16_t>(a, b, fmod, out, threads);
  if (size == 4) return ModInt<uint32_t>(a, b, fmod, out, threads);
  return ModInt<uint64_t>(a, b, fmod, out, threads);
}

}  // namespace

void BindMod(py::module_& m) {
  m.def("mod_into", &ModPy, py::arg("a"), py::arg("b"), py::arg("fmod"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "ONNX Mod with numpy broadcasting: fmod=0 numpy's remainder (integers; the divisor's sign), fmod=1 C's fmod "
        "(the dividend's sign; float16 in float32, exact); a and b C-order arrays of one dtype; into out (ORT's "
        "buffer) or a new array; None when an integer divisor is zero (the reference raises)");
}

}  // namespace npu_ep::kern
