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
#include "cpu.h"
#include "half.h"
#include "intrinsics.h"

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

#if NPU_EP_X86
#define NPU_AVX512 "avx2,fma,avx512f,avx512dq"

// fmod of 8 float32 lanes widened to double: |x| - q |y| for q = trunc(|x| / |y|) by one FMA, moved into [0, |y|)
// by one |y| (the double quotient of |x| / |y| < 2^50 is within 1 of the true one), then x's sign. The remainder is
// a multiple of the operands' smaller unit below 2 |y|: exact in double, as fmod's, so the bits are std::fmod's.
// *ok: the lanes this holds for (finite x, finite nonzero y, quotient < 2^50); the others are left to std::fmod.
__attribute__((target(NPU_AVX512))) inline __m256 FmodLanes(__m256 xf, __m256 yf, __mmask8* ok) {
  const __m512d x = _mm512_cvtps_pd(xf), y = _mm512_cvtps_pd(yf);
  const __m512d sign = _mm512_castsi512_pd(_mm512_set1_epi64(INT64_MIN));
  const __m512d ax = _mm512_andnot_pd(sign, x), ay = _mm512_andnot_pd(sign, y);
  const __m512d quot = _mm512_div_pd(ax, ay);
  *ok = _mm512_cmp_pd_mask(quot, _mm512_set1_pd(0x1p50), _CMP_LT_OQ) &
        _mm512_cmp_pd_mask(ay, _mm512_set1_pd(INFINITY), _CMP_LT_OQ);
  __m512d r = _mm512_fnmadd_pd(_mm512_roundscale_pd(quot, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), ay, ax);
  r = _mm512_mask_add_pd(r, _mm512_cmp_pd_mask(r, _mm512_setzero_pd(), _CMP_LT_OQ), r, ay);
  r = _mm512_mask_sub_pd(r, _mm512_cmp_pd_mask(r, ay, _CMP_GE_OQ), r, ay);
  return _mm512_cvtpd_ps(_mm512_or_pd(r, _mm512_and_pd(sign, x)));
}

// FloatRow<float> 16 lanes at a time (a and b each a run, unit 1, or one value, unit 0).
__attribute__((target(NPU_AVX512))) void FloatRowAvx512(const float* a, int64_t sa, const float* b, int64_t sb,
                                                        float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t len = std::min<int64_t>(16, n - i);
    const __mmask16 m = static_cast<__mmask16>((1u << len) - 1u);
    const __m512 xv = sa ? _mm512_maskz_loadu_ps(m, a + i) : _mm512_set1_ps(a[0]);
    const __m512 yv = sb ? _mm512_maskz_loadu_ps(m, b + i) : _mm512_set1_ps(b[0]);
    __mmask8 ok_lo, ok_hi;
    const __m256 lo = FmodLanes(_mm512_castps512_ps256(xv), _mm512_castps512_ps256(yv), &ok_lo);
    const __m256 hi = FmodLanes(_mm512_extractf32x8_ps(xv, 1), _mm512_extractf32x8_ps(yv, 1), &ok_hi);
    __m512 r = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    const unsigned rest = ~(ok_lo | static_cast<unsigned>(ok_hi) << 8) & m;
    if (rest != 0) {  // before the store: y may be a
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, r);
      for (int64_t j = 0; j < len; ++j)
        if (rest >> j & 1u) lanes[j] = std::fmod(a[(i + j) * sa], b[(i + j) * sb]);
      r = _mm512_load_ps(lanes);
    }
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}
#endif

void FmodFloat(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return FloatRowAvx512(a, sa, b, sb, y, n);
#endif
  FloatRow<float>(a, sa, b, sb, y, n);
}

// float16 in chunks widened to float32 (half.h's rows: F16C where the host has it), fmod'd, narrowed.
void HalfRow(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, uint16_t* y, int64_t n) {
  constexpr int64_t kChunk = 256;
  float fa[kChunk], fb[kChunk];
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t len = std::min(kChunk, n - at);
    WidenRun(a + at * sa, sa, fa, len);
    WidenRun(b + at * sb, sb, fb, len);
    FmodFloat(fa, 1, fb, 1, fa, len);
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
    if (size == 4) return RunMod<float>(FmodFloat, a, b, out, threads);
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
