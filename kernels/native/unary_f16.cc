// float16 Relu/Abs/Neg/Sqrt/Sign (`kernels.unary_f16`) and IsNaN/IsInf (`kernels.class_f16`, exact bit tests), for
// kernels/ops/elementwise.py and activation.py, and float16 Clip (`kernels.clip_f16`, kernels/ops/activation.py:
// numpy's float16 maximum/minimum, bits chosen, nothing rounded).
// Relu/Abs/Neg/Sqrt: each element widened to float32, the op, rounded once to float16, as the reference model
// (widen, numpy's float32 op, astype). Widening is exact and these ops are exact in float32 (sqrt correctly rounded:
// 24 >= 2 * 11 + 2 bits, so rounding twice is rounding once), so the results are the reference's bits; Relu is the
// reference's clip(x, 0, inf): +0 where x < 0, NaN and -0 kept (as ORT's Clip).
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // Clip's selects vectorize (one float op per element elsewhere: O3 changes no result)
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

enum UnaryOp : int { kRelu = 0, kAbs = 1, kNeg = 2, kSqrt = 3, kSign = 4 };

constexpr int64_t kTaskElems = 32768;  // elements per parallel task

template <int Op>
inline float Apply(float x) {
  if constexpr (Op == kRelu) return x < 0.0f ? 0.0f : x;  // NaN and -0 kept
  if constexpr (Op == kAbs) return std::fabs(x);
  if constexpr (Op == kNeg) return -x;
  return std::sqrt(x);
}

template <int Op>
void RowScalar(const uint16_t* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, x + i, sizeof h);
    const _Float16 r = static_cast<_Float16>(Apply<Op>(static_cast<float>(h)));
    std::memcpy(y + i, &r, sizeof r);
  }
}

#if NPU_EP_X86
constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <int Op>
__attribute__((target("avx2,f16c"))) inline __m256 ApplyAvx2(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  if constexpr (Op == kRelu) {  // +0 where x < 0; NaN and -0 kept
    return _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  }
  if constexpr (Op == kAbs) return _mm256_andnot_ps(sign, x);
  if constexpr (Op == kNeg) return _mm256_xor_ps(sign, x);
  return _mm256_sqrt_ps(x);
}

template <int Op>
__attribute__((target("avx2,f16c"))) void RowF16c(const uint16_t* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(ApplyAvx2<Op>(v), kNearest));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(Apply<Op>(_cvtsh_ss(x[i])), kNearest);
}
#endif

using RowFn = void (*)(const uint16_t*, uint16_t*, int64_t);

// Sign of float16 on the bits, as ORT's float16 kernel (compares with 0): +-1 with x's sign, +0 for +-0 and NaN. An
// integer loop that vectorizes on every host (no widening).
void SignRow(const uint16_t* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t mag = x[i] & 0x7fff;
    y[i] = (mag == 0 || mag > 0x7c00) ? 0 : static_cast<uint16_t>((x[i] & 0x8000) | 0x3c00);
  }
}

template <int Op>
RowFn RowFor() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return &RowF16c<Op>;
#endif
  return &RowScalar<Op>;
}

RowFn RowFor(int op) {
  switch (op) {
    case kRelu: return RowFor<kRelu>();
    case kAbs: return RowFor<kAbs>();
    case kNeg: return RowFor<kNeg>();
    case kSqrt: return RowFor<kSqrt>();
    case kSign: return &SignRow;
    default:
      throw std::invalid_argument("unary_f16: op must be 0 (Relu), 1 (Abs), 2 (Neg), 3 (Sqrt) or 4 (Sign), got " +
                                  std::to_string(op));
  }
}

bool IsHalf(const py::array& a) { return a.dtype().kind() == 'f' && a.itemsize() == 2; }

// ``out`` (ORT's buffer: a writeable C-order float16 array of x's size) or a new array of x's shape.
py::array OutputLike(const char* fn, const py::array& x, const py::object& out) {
  if (out.is_none()) return py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  // null when out is not an array (no empty array made to hold nothing)
  const auto y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (!y || !IsHalf(y) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order float16 array of " +
                                std::to_string(x.size()) + " elements");
  return y;
}

py::array UnaryF16Py(int op, const py::array& x, const py::object& out, int threads) {
  if (!IsHalf(x) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("unary_f16: x must be a C-order float16 array, got " + std::string(py::str(x.dtype())));
  const RowFn row = RowFor(op);
  py::array y = OutputLike("unary_f16", x, out);
  const auto* src = static_cast<const uint16_t*>(x.data());
  auto* dst = static_cast<uint16_t*>(y.mutable_data());
  const int64_t n = x.size();
  RunMoving(static_cast<size_t>(n) * 2, [&] {
    ParallelFor(ThreadsFor(threads, n), (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
      const int64_t begin = t * kTaskElems;
      row(src + begin, dst + begin, std::min(n, begin + kTaskElems) - begin);
    });
  });
  return y;
}

// float16 comparisons on the bits (no conversion: without F16C a _Float16 widening is a library call): a non-NaN
// half orders as its signed magnitude, -0 and +0 equal; NaN compares false.
inline bool IsNanBits(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
inline int32_t OrderKey(uint16_t h) { return (h & 0x8000) ? -static_cast<int32_t>(h & 0x7fff) : (h & 0x7fff); }
// Clip of float16 as the reference's numpy maximum then minimum on float16: maximum(x, lo) is x where x >= lo or x is
// NaN, else lo; minimum(y, hi) is y where y <= hi or y is NaN, else hi; the chosen operand's bits, nothing rounded.
// Branch-free selects per side present (the loop vectorizes).
template <bool Lo, bool Hi>
void ClipRowT(const uint16_t* x, uint16_t* y, int64_t n, uint16_t blo, uint16_t bhi) {
  const bool lo_nan = IsNanBits(blo), hi_nan = IsNanBits(bhi);
  const int32_t klo = OrderKey(blo), khi = OrderKey(bhi);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b = x[i];
    if constexpr (Lo) b = (IsNanBits(b) || (!lo_nan && OrderKey(b) >= klo)) ? b : blo;
    if constexpr (Hi) b = (IsNanBits(b) || (!hi_nan && OrderKey(b) <= khi)) ? b : bhi;
    y[i] = b;
  }
}

void ClipRow(const uint16_t* x, uint16_t* y, int64_t n, const uint16_t* lo, const uint16_t* hi) {
  const uint16_t blo = lo ? *lo : 0, bhi = hi ? *hi : 0;
  if (lo && hi) return ClipRowT<true, true>(x, y, n, blo, bhi);
  if (lo) return ClipRowT<true, false>(x, y, n, blo, bhi);
  return ClipRowT<false, true>(x, y, n, blo, bhi);
}

const uint16_t* BoundBits(const py::object& b, const char* name) {
  if (b.is_none()) return nullptr;
  if (!py::isinstance<py::array>(b))
    throw std::invalid_argument(std::string("clip_f16: ") + name + " must be an array");
  auto a = py::reinterpret_borrow<py::array>(b);
  if (!IsHalf(a) || a.size() != 1)
    throw std::invalid_argument(std::string("clip_f16: ") + name + " must be one float16 element");
  return static_cast<const uint16_t*>(a.data());
}

py::array ClipF16Py(const py::array& x, const py::object& lo, const py::object& hi, const py::object& out,
                    int threads) {
  if (!IsHalf(x) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("clip_f16: x must be a C-order float16 array, got " + std::string(py::str(x.dtype())));
  const uint16_t* plo = BoundBits(lo, "lo");
  const uint16_t* phi = BoundBits(hi, "hi");
  py::array y = OutputLike("clip_f16", x, out);
  const auto* src = static_cast<const uint16_t*>(x.data());
  auto* dst = static_cast<uint16_t*>(y.mutable_data());
  const int64_t n = x.size();
  RunMoving(static_cast<size_t>(n) * 2, [&] {
    ParallelFor(ThreadsFor(threads, n), (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
      const int64_t begin = t * kTaskElems;
      ClipRow(src + begin, dst + begin, std::min(n, begin + kTaskElems) - begin, plo, phi);
    });
  });
  return y;
}

// IsNaN / IsInf of float16 on the bits (exact: no widening): NaN has all exponent bits and a nonzero mantissa, an
// infinity all exponent bits and a zero mantissa. The loops are integer compares that vectorize.
enum ClassTest : int { kIsNan = 0, kIsInf = 1, kIsPosInf = 2, kIsNegInf = 3 };

template <int Test>
void ClassRowT(const uint16_t* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = x[i];
    if constexpr (Test == kIsNan) y[i] = (h & 0x7fff) > 0x7c00;
    if constexpr (Test == kIsInf) y[i] = (h & 0x7fff) == 0x7c00;
    if constexpr (Test == kIsPosInf) y[i] = h == 0x7c00;
    if constexpr (Test == kIsNegInf) y[i] = h == 0xfc00;
  }
}

using ClassRowFn = void (*)(const uint16_t*, uint8_t*, int64_t);

ClassRowFn ClassRowFor(int test) {
  switch (test) {
    case kIsNan: return &ClassRowT<kIsNan>;
    case kIsInf: return &ClassRowT<kIsInf>;
    case kIsPosInf: return &ClassRowT<kIsPosInf>;
    case kIsNegInf: return &ClassRowT<kIsNegInf>;
    default:
      throw std::invalid_argument(
          "class_f16: test must be 0 (IsNaN), 1 (IsInf), 2 (IsInf positive) or 3 (IsInf "
          "negative), got " +
          std::to_string(test));
  }
}

py::array ClassF16Py(int test, const py::array& x, const py::object& out, int threads) {
  if (!IsHalf(x) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("class_f16: x must be a C-order float16 array, got " + std::string(py::str(x.dtype())));
  const ClassRowFn row = ClassRowFor(test);
  const py::dtype bool_type("bool");
  // out, or null when it is not an array (no empty array made to hold nothing)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(bool_type, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    if (!y || y.dtype().kind() != 'b' || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
      throw std::invalid_argument("class_f16: out must be a writeable C-order bool array of " +
                                  std::to_string(x.size()) + " elements");
  }
  const auto* src = static_cast<const uint16_t*>(x.data());
  auto* dst = static_cast<uint8_t*>(y.mutable_data());
  const int64_t n = x.size();
  RunMoving(static_cast<size_t>(n) * 2, [&] {
    ParallelFor(ThreadsFor(threads, n), (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
      const int64_t begin = t * kTaskElems;
      row(src + begin, dst + begin, std::min(n, begin + kTaskElems) - begin);
    });
  });
  return y;
}

}  // namespace

void BindUnaryF16(py::module_& m) {
  m.def("unary_f16", &UnaryF16Py, py::arg("op"), py::arg("x"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "float16 op(x) (0 Relu, 1 Abs, 2 Neg, 3 Sqrt; 4 Sign on the bits, NaN -> 0) computed in float32 and "
        "rounded once (the reference's bits), "
        "into out (ORT's buffer) or a new array of x's shape; x C-order");
  m.def("clip_f16", &ClipF16Py, py::arg("x"), py::arg("lo"), py::arg("hi"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "float16 Clip as numpy's maximum(x, lo) then minimum(., hi) on float16 (NaN kept, the chosen operand's bits); "
        "lo / hi: one-element float16 arrays or None (that side open); into out or a new array; x C-order");
  m.def("class_f16", &ClassF16Py, py::arg("test"), py::arg("x"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "bool test of float16 x on its bits: 0 IsNaN, 1 IsInf, 2 IsInf positive only, 3 IsInf negative only; into "
        "out (ORT's buffer) or a new array of x's shape; x C-order");
}

}  // namespace npu_ep::kern
