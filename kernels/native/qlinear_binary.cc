// com.microsoft QLinearAdd and QLinearMul on 8-bit operands with ONNX (numpy) broadcasting (`kernels.qlinear_add`,
// `kernels.qlinear_mul`), for kernels/ops/qlinear_binary.py, whose reference they reproduce bit for bit:
//   add, both operands varying along the run: t = fma(b, rb, fixed), y = fma(a, ra, t) in float32 (as MLAS's AVX2
//     kernel as compiled, its multiply-adds contracted; the reference computes the fused rounding exactly); an
//     operand constant along the run folds into the fixed part as fma(x, rx, fixed), a's into fixed_a (ORT swaps
//     the operands for a scalar a, and its fixed part rounds the other way).
//   mul: y = f32(f32(float((a - za) * (b - zb)) * ratio) + zc).
// then y is clamped to the output range and rounded half to even. Every float32 product is written as a float64
// product (exact) rounded to float32, so no compiler may fuse it with the add that follows. Runs are broadcast.h's;
// the rows are written with AVX-512 intrinsics, compiled for AVX2 besides the baseline, and vectorize there.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the row loops vectorize
// GCC 12 at O3 takes the AVX-512 conversions' undefined pass-through operands (_mm512_undefined_*) for uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "broadcast.h"
#include "cpu.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 32768;  // output elements per parallel task

// int32_fits: every pre-rounding value is within +-2^30, so its int32 conversion is exact and saturating packs clamp
struct AddParams {
  float ra, rb, fixed, fixed_a;
  bool int32_fits;
};
struct MulParams {
  int32_t za, zb;
  float ratio, zc;
  bool int32_fits;
};

template <typename T>
inline T Saturate(float y) {
  constexpr float lo = std::is_signed<T>::value ? -128.0f : 0.0f, hi = std::is_signed<T>::value ? 127.0f : 255.0f;
  return static_cast<T>(static_cast<int32_t>(RoundHalfEven(std::min(std::max(y, lo), hi))));
}

inline float Product(double x, float r) { return static_cast<float>(x * static_cast<double>(r)); }

// One run of n outputs; A/B: the operand varies along the run (else one element repeats).
template <typename T, bool A, bool B>
inline __attribute__((always_inline)) void AddRowBody(const T* a, const T* b, T* y, int64_t n, AddParams q) {
  if (!A) {  // a constant along the run (a priority the reference shares when both are)
    const float fixed = std::fma(static_cast<float>(a[0]), q.ra, q.fixed_a);
    for (int64_t i = 0; i < n; ++i) y[i] = Saturate<T>(std::fma(static_cast<float>(b[B ? i : 0]), q.rb, fixed));
  } else if (!B) {
    const float fixed = std::fma(static_cast<float>(b[0]), q.rb, q.fixed);
    for (int64_t i = 0; i < n; ++i) y[i] = Saturate<T>(std::fma(static_cast<float>(a[i]), q.ra, fixed));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float t = std::fma(static_cast<float>(b[i]), q.rb, q.fixed);
      y[i] = Saturate<T>(std::fma(static_cast<float>(a[i]), q.ra, t));
    }
  }
}

template <typename T, bool A, bool B>
inline __attribute__((always_inline)) void MulRowBody(const T* a, const T* b, T* y, int64_t n, MulParams q) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = (static_cast<int32_t>(a[A ? i : 0]) - q.za) * (static_cast<int32_t>(b[B ? i : 0]) - q.zb);
    y[i] = Saturate<T>(Product(static_cast<double>(p), q.ratio) + q.zc);
  }
}

template <typename T, typename P>
using RowFn = void (*)(const T*, const T*, T*, int64_t, P);

#define NPU_QLINEAR_ROWS(SUFFIX, TARGET)                                                                              \
  template <typename T, bool A, bool B>                                                                               \
  TARGET void AddRow##SUFFIX(const T* a, const T* b, T* y, int64_t n, AddParams q) {                                  \
    AddRowBody<T, A, B>(a, b, y, n, q);                                                                               \
  }                                                                                                                   \
  template <typename T, bool A, bool B>                                                                               \
  TARGET void MulRow##SUFFIX(const T* a, const T* b, T* y, int64_t n, MulParams q) {                                  \
    MulRowBody<T, A, B>(a, b, y, n, q);                                                                               \
  }                                                                                                                   \
  template <typename T>                                                                                               \
  RowFn<T, AddParams> AddRows##SUFFIX(bool a, bool b) {                                                               \
    static constexpr RowFn<T, AddParams> kRows[4] = {AddRow##SUFFIX<T, false, false>, AddRow##SUFFIX<T, false, true>, \
                                                     AddRow##SUFFIX<T, true, false>, AddRow##SUFFIX<T, true, true>};  \
    return kRows[(a ? 2 : 0) + (b ? 1 : 0)];                                                                          \
  }                                                                                                                   \
  template <typename T>                                                                                               \
  RowFn<T, MulParams> MulRows##SUFFIX(bool a, bool b) {                                                               \
    static constexpr RowFn<T, MulParams> kRows[4] = {MulRow##SUFFIX<T, false, false>, MulRow##SUFFIX<T, false, true>, \
                                                     MulRow##SUFFIX<T, true, false>, MulRow##SUFFIX<T, true, true>};  \
    return kRows[(a ? 2 : 0) + (b ? 1 : 0)];                                                                          \
  }

NPU_QLINEAR_ROWS(Scalar, )
#if NPU_EP_X86
NPU_QLINEAR_ROWS(Avx2, __attribute__((target("avx2,fma"))))
#endif
#undef NPU_QLINEAR_ROWS

#if NPU_EP_X86
#define NPU_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// 16 elements per step: the bytes widened to int32 lanes (a repeated element broadcast), the float32 arithmetic
// of the scalar rows, then clamp, round half to even (the default MXCSR mode) and narrow; the
// tail is masked.
template <typename T, bool V>
NPU_AVX512 inline __m512i Load16(const T* x, int64_t i, __mmask16 k) {
  if (!V) return _mm512_set1_epi32(static_cast<int32_t>(x[0]));
  const __m128i v = _mm_maskz_loadu_epi8(k, x + i);
  return std::is_signed<T>::value ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}

template <typename T>
NPU_AVX512 inline void Store16(T* y, int64_t i, __mmask16 k, __m512 v) {
  const float lo = std::is_signed<T>::value ? -128.0f : 0.0f, hi = std::is_signed<T>::value ? 127.0f : 255.0f;
  const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi)));
  _mm512_mask_cvtepi32_storeu_epi8(y + i, k, q);
}

NPU_AVX512 inline __m512 Float16(__m512i v) { return _mm512_cvtepi32_ps(v); }

// 64 codes from four vectors of 16 rounded int32 values (each within int32, so the conversion was exact): saturating
// packs clamp to the code range (clamp(rint(y)) = rint(clamp(y)) for integer bounds), a dword permute restores the
// order the packs interleave per 128-bit lane; one 64-byte store.
template <typename T>
NPU_AVX512 inline void Store64(T* y, __m512i q0, __m512i q1, __m512i q2, __m512i q3) {
  const __m512i w0 = _mm512_packs_epi32(q0, q1), w1 = _mm512_packs_epi32(q2, q3);
  const __m512i b = std::is_signed<T>::value ? _mm512_packs_epi16(w0, w1) : _mm512_packus_epi16(w0, w1);
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(y, _mm512_permutexvar_epi32(order, b));
}

// The rows below run `step(i, k)` (16 values before rounding at i, tail mask k) over n outputs: by 64 with packs when
// the values fit int32, the rest (and everything otherwise) by 16 with Store16's float clamp.
template <typename T, typename Step>
NPU_AVX512 inline void Rows16(T* y, int64_t n, bool int32_fits, Step step) {
  int64_t i = 0;
  if (int32_fits) {
    const __mmask16 all = 0xFFFF;
    for (; i + 64 <= n; i += 64)
      Store64(y + i, _mm512_cvtps_epi32(step(i, all)), _mm512_cvtps_epi32(step(i + 16, all)),
              _mm512_cvtps_epi32(step(i + 32, all)), _mm512_cvtps_epi32(step(i + 48, all)));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    Store16(y, i, k, step(i, k));
  }
}

template <typename T, bool A, bool B>
NPU_AVX512 void AddRowAvx512(const T* a, const T* b, T* y, int64_t n, AddParams q) {
  const __m512 ra = _mm512_set1_ps(q.ra), rb = _mm512_set1_ps(q.rb);
  if (!A || !B) {  // one operand folds into the constant (AddRowBody)
    const float fixed =
        !A ? std::fma(static_cast<float>(a[0]), q.ra, q.fixed_a) : std::fma(static_cast<float>(b[0]), q.rb, q.fixed);
    const __m512 c = _mm512_set1_ps(fixed), r = !A ? rb : ra;
    Rows16(y, n, q.int32_fits, [&](int64_t i, __mmask16 k) NPU_AVX512 {
      const __m512i v = !A ? Load16<T, B>(b, i, k) : Load16<T, true>(a, i, k);
      return _mm512_fmadd_ps(Float16(v), r, c);
    });
    return;
  }
  const __m512 fixed = _mm512_set1_ps(q.fixed);
  Rows16(y, n, q.int32_fits, [&](int64_t i, __mmask16 k) NPU_AVX512 {
    const __m512 t = _mm512_fmadd_ps(Float16(Load16<T, true>(b, i, k)), rb, fixed);
    return _mm512_fmadd_ps(Float16(Load16<T, true>(a, i, k)), ra, t);
  });
}

template <typename T, bool A, bool B>
NPU_AVX512 void MulRowAvx512(const T* a, const T* b, T* y, int64_t n, MulParams q) {
  const __m512i za = _mm512_set1_epi32(q.za), zb = _mm512_set1_epi32(q.zb);
  const __m512 ratio = _mm512_set1_ps(q.ratio), zc = _mm512_set1_ps(q.zc);
  Rows16(y, n, q.int32_fits, [&](int64_t i, __mmask16 k) NPU_AVX512 {
    const __m512i p =
        _mm512_mullo_epi32(_mm512_sub_epi32(Load16<T, A>(a, i, k), za), _mm512_sub_epi32(Load16<T, B>(b, i, k), zb));
    // a product then an add, two roundings (no fma), as MLAS
    return _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p), ratio), zc);
  });
}

template <typename T>
RowFn<T, AddParams> AddRowsAvx512(bool a, bool b) {
  static constexpr RowFn<T, AddParams> kRows[4] = {AddRowAvx512<T, false, false>, AddRowAvx512<T, false, true>,
                                                   AddRowAvx512<T, true, false>, AddRowAvx512<T, true, true>};
  return kRows[(a ? 2 : 0) + (b ? 1 : 0)];
}

template <typename T>
RowFn<T, MulParams> MulRowsAvx512(bool a, bool b) {
  static constexpr RowFn<T, MulParams> kRows[4] = {MulRowAvx512<T, false, false>, MulRowAvx512<T, false, true>,
                                                   MulRowAvx512<T, true, false>, MulRowAvx512<T, true, true>};
  return kRows[(a ? 2 : 0) + (b ? 1 : 0)];
}
#undef NPU_AVX512
#endif

template <typename T>
RowFn<T, AddParams> RowFor(AddParams, bool a, bool b) {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return AddRowsAvx512<T>(a, b);
  if (isa >= Isa::kAvx2) return AddRowsAvx2<T>(a, b);
#endif
  return AddRowsScalar<T>(a, b);
}

template <typename T>
RowFn<T, MulParams> RowFor(MulParams, bool a, bool b) {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return MulRowsAvx512<T>(a, b);
  if (isa >= Isa::kAvx2) return MulRowsAvx2<T>(a, b);
#endif
  return MulRowsScalar<T>(a, b);
}

template <typename T, typename P>
void Run(const Broadcast<2>& plan, const py::array& a, const py::array& b, py::array& out, P q, int threads) {
  const auto* pa = static_cast<const T*>(a.data());
  const auto* pb = static_cast<const T*>(b.data());
  auto* po = static_cast<T*>(out.mutable_data());
  const RowFn<T, P> row = RowFor<T>(q, plan.strides[0].back() != 0, plan.strides[1].back() != 0);
  ParallelRuns(plan, threads, kTaskElems,
               [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>&, int64_t at, int64_t len) {
                 row(pa + off[0], pb + off[1], po + at, len, q);
               });
}

template <typename P>
py::array QLinearPy(const char* fn, const py::array& a, const py::array& b, P q, const py::object& out, int threads) {
  const bool i8 = a.dtype().equal(py::dtype::of<int8_t>()), u8 = a.dtype().equal(py::dtype::of<uint8_t>());
  if (!(i8 || u8) || !a.dtype().equal(b.dtype()) || !(a.flags() & py::array::c_style) ||
      !(b.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(fn) + ": a and b must be C-order arrays of one dtype, int8 or uint8, got " +
                                std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                                std::string(py::str(b.dtype())) + ShapeText(b));
  const Broadcast<2> plan = PlanBroadcast<2>(fn, {&a, &b});
  py::array result = BroadcastResult(fn, a.dtype(), plan, out);
  if (plan.total == 0) return result;
  if (i8)
    Run<int8_t>(plan, a, b, result, q, threads);
  else
    Run<uint8_t>(plan, a, b, result, q, threads);
  return result;
}

// Whether |y| <= bound (before rounding) fits int32 with room; false for a NaN or infinite bound.
bool FitsInt32(double bound) { return bound < 1073741824.0; }

py::array QLinearAddPy(const py::array& a, const py::array& b, float ra, float rb, float fixed, float fixed_a,
                       const py::object& out, int threads) {
  // |a|, |b| <= 255; a folded operand's product and the fma roundings stay far inside the factor 2 left
  const bool fits =
      FitsInt32(255.0 * std::fabs(ra) + 255.0 * std::fabs(rb) + std::max(std::fabs(fixed), std::fabs(fixed_a)));
  return QLinearPy("qlinear_add", a, b, AddParams{ra, rb, fixed, fixed_a, fits}, out, threads);
}

py::array QLinearMulPy(const py::array& a, const py::array& b, int32_t za, int32_t zb, float ratio, float zc,
                       const py::object& out, int threads) {
  // |a - za| <= 255 + |za| for 8-bit a
  const double pa = 255.0 + std::fabs(static_cast<double>(za)), pb = 255.0 + std::fabs(static_cast<double>(zb));
  const bool fits = FitsInt32(pa * pb * std::fabs(ratio) + std::fabs(zc));
  return QLinearPy("qlinear_mul", a, b, MulParams{za, zb, ratio, zc, fits}, out, threads);
}

}  // namespace

void BindQLinearBinary(py::module_& m) {
  m.def("qlinear_add", &QLinearAddPy, py::arg("a"), py::arg("b"), py::arg("ra"), py::arg("rb"), py::arg("fixed"),
        py::arg("fixed_a"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "QLinearAdd of 8-bit a and b with broadcasting: ra = sA/sC, rb = sB/sC, fixed = zC - fma(ra, zA, rb*zB), "
        "fixed_a (for an a constant along the run) = zC - fma(rb, zB, ra*zA), all float32 "
        "(kernels/ops/qlinear_binary.py); into out (ORT's buffer) or a new array of a's dtype");
  m.def("qlinear_mul", &QLinearMulPy, py::arg("a"), py::arg("b"), py::arg("za"), py::arg("zb"), py::arg("ratio"),
        py::arg("zc"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "QLinearMul of 8-bit a and b with broadcasting: ratio = sA*sB/sC and zC float32 "
        "(kernels/ops/qlinear_binary.py); into out (ORT's buffer) or a new array of a's dtype");
}

}  // namespace npu_ep::kern
