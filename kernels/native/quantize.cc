// Per-tensor Q/DQ in fixed chunks of elements (the bits never depend on the thread count). Same float32
// operations as the reference, in its order: a division (never a reciprocal multiply), rint, + zp, clip.
// `kernels.quantize_half` quantizes float16 x as ORT's float16 kernels: widened to float32 (exact), divided, rounded,
// then (ONNX domain) converted to int32 (INT_MIN for NaN, +-Inf and out-of-range values), + zp in wrapping int32,
// clamped, or (com.microsoft) + zp and clamped in float32 as float32 x.
// `kernels.dequantize_into` dequantizes any integer container (8-, 16- or 32-bit) into ORT's buffer when given one;
// `kernels.dynamic_quantize` is DynamicQuantizeLinear: a NaN-skipping min/max pass, ORT's parameters, quantize.
#include "quantize.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "movement.h"
#include "thread_pool.h"

#include "intrinsics.h"
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace npu_ep::kern {
namespace {

constexpr int64_t kChunk = 1 << 18;  // elements per task; a smaller tensor runs on the calling thread

void QuantizeScalar(const float* x, int64_t n, float scale, float z, float lo, float hi, uint8_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    float q = std::nearbyint(x[i] / scale) + z;
    q = std::fmin(std::fmax(q, lo), hi);  // fmax drops a NaN: NaN -> lo
    y[i] = static_cast<uint8_t>(static_cast<int32_t>(q));
  }
}

#if NPU_EP_X86
// rint(x / scale) + z of 16 elements, capped at hi, as int32: vcvtps2dq is exact below hi and gives INT_MIN for
// NaN (minps passes its second operand's NaN) and values under -2^31, so the saturating packs after it give those
// the lowest code, as the float clamp does.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i QuantizeCapped16(const float* x, __m512 sv,
                                                                                     __m512 zv, __m512 hiv) {
  const __m512 q = _mm512_div_ps(_mm512_loadu_ps(x), sv);
  return _mm512_cvtps_epi32(
      _mm512_min_ps(hiv, _mm512_add_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv)));
}

// 64 codes per step through saturating packs (int32 -> int16 -> 8-bit: the code range is the type's) and one 64-byte
// store after a dword permute (the packs interleave 128-bit lanes); the tail by 16 with a float clamp.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void QuantizeAvx512(const float* x, int64_t n, float scale,
                                                                         float z, float lo, float hi, uint8_t* y) {
  const __m512 sv = _mm512_set1_ps(scale), zv = _mm512_set1_ps(z), lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const bool is_signed = lo < 0.0f;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i w0 =
        _mm512_packs_epi32(QuantizeCapped16(x + i, sv, zv, hiv), QuantizeCapped16(x + i + 16, sv, zv, hiv));
    const __m512i w1 =
        _mm512_packs_epi32(QuantizeCapped16(x + i + 32, sv, zv, hiv), QuantizeCapped16(x + i + 48, sv, zv, hiv));
    const __m512i b = is_signed ? _mm512_packs_epi16(w0, w1) : _mm512_packus_epi16(w0, w1);
    _mm512_storeu_si512(y + i, _mm512_permutexvar_epi32(order, b));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
    q = _mm512_add_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
    q = _mm512_min_ps(_mm512_max_ps(q, lov), hiv);  // maxps returns its second operand for a NaN: NaN -> lo
    _mm_mask_storeu_epi8(y + i, k, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
  }
}

#endif

// float16 QuantizeLinear as ORT's CPU kernel (the reference, kernels/ops/quantize.py): q = rint(float32(x) / scale)
// converted to int32 the x86 way (NaN, +-Inf and |q| >= 2^31 become INT_MIN), plus the zero point in wrapping int32,
// clamped to the code range. x is widened (exact) in blocks of kHalfBlock into a stack buffer.
constexpr int64_t kHalfBlock = 512;
constexpr int64_t kHalfChunk = 1 << 15;  // elements per task: widening and dividing cost more than a copy

inline int32_t RoundToInt32AsX86(float v) {
  const float q = std::nearbyint(v);
  return q >= -2147483648.0f && q < 2147483648.0f ? static_cast<int32_t>(q) : INT32_MIN;
}

void QuantizeHalfRowScalar(const float* x, int64_t n, float scale, int32_t zp, int32_t lo, int32_t hi, uint8_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<int32_t>(static_cast<uint32_t>(RoundToInt32AsX86(x[i] / scale)) +
                                        static_cast<uint32_t>(zp));  // wraps as ORT's int32 addition does on x86
    y[i] = static_cast<uint8_t>(std::min(std::max(v, lo), hi));
  }
}

#if NPU_EP_X86
// vcvtps2dq rounds to nearest even and gives INT_MIN for NaN and out-of-range values: ORT's conversion itself.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void QuantizeHalfRowAvx512(const float* x, int64_t n, float scale,
                                                                                int32_t zp, int32_t lo, int32_t hi,
                                                                                uint8_t* y) {
  const __m512 sv = _mm512_set1_ps(scale);
  const __m512i zv = _mm512_set1_epi32(zp), lov = _mm512_set1_epi32(lo), hiv = _mm512_set1_epi32(hi);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
    __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
    q = _mm512_min_epi32(_mm512_max_epi32(q, lov), hiv);
    _mm_mask_storeu_epi8(y + i, k, _mm512_cvtepi32_epi8(q));
  }
}
#endif

// int32_convert: ORT's ONNX-domain float16 kernel (above); else its com.microsoft one, which clamps in float32
// before it converts (quantize_tensor's steps on the widened block: NaN the lowest code, +Inf the highest).
void QuantizeHalfTensor(const uint16_t* x, int64_t n, float scale, int32_t zp, bool is_signed, bool int32_convert,
                        uint8_t* y, int threads) {
  const int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
  const auto flo = static_cast<float>(lo), fhi = static_cast<float>(hi), fz = static_cast<float>(zp);
  ParallelFor(ThreadsFor(threads, n * 8), (n + kHalfChunk - 1) / kHalfChunk, [&](int64_t c) {
    const int64_t end = std::min(n, (c + 1) * kHalfChunk);
    float block[kHalfBlock];
    for (int64_t i = c * kHalfChunk; i < end; i += kHalfBlock) {
      const int64_t len = std::min(kHalfBlock, end - i);
      HalfToFloatRow(x + i, block, len);
#if NPU_EP_X86
      if (ActiveIsa() >= Isa::kAvx512) {
        if (int32_convert) {
          QuantizeHalfRowAvx512(block, len, scale, zp, lo, hi, y + i);
        } else {
          QuantizeAvx512(block, len, scale, fz, flo, fhi, y + i);
        }
        continue;
      }
#endif
      if (int32_convert) {
        QuantizeHalfRowScalar(block, len, scale, zp, lo, hi, y + i);
      } else {
        QuantizeScalar(block, len, scale, fz, flo, fhi, y + i);
      }
    }
  });
}

// The codes array of a quantize call: out (ORT's buffer) checked, or a new array of x's shape.
pybind11::array CodesFor(const char* op, const pybind11::array& x, int zero_point, bool y_signed,
                         const pybind11::object& out) {
  namespace py = pybind11;
  if (zero_point < (y_signed ? -128 : 0) || zero_point > (y_signed ? 127 : 255))
    throw std::invalid_argument(std::string(op) + ": zero point " + std::to_string(zero_point) + " outside " +
                                (y_signed ? "int8" : "uint8"));
  const py::dtype type = y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>();
  if (out.is_none()) return py::array(type, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  // out, or null when it is not an array (a default py::array would be a new empty numpy array per call)
  const auto y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (!y || !y.dtype().equal(type) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
    throw std::invalid_argument(std::string(op) + ": out must be a writeable C-order " + std::string(py::str(type)) +
                                " array of " + std::to_string(x.size()) + " elements");
  return y;
}

pybind11::array QuantizeHalfPy(const pybind11::array& x, float scale, int zero_point, bool y_signed, bool int32_convert,
                               const pybind11::object& out, int threads) {
  namespace py = pybind11;
  if (x.dtype().kind() != 'f' || x.itemsize() != 2 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("quantize_half: x must be a C-order float16 array, got " +
                                std::string(py::str(x.dtype())));
  py::array y = CodesFor("quantize_half", x, zero_point, y_signed, out);
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* codes = static_cast<uint8_t*>(y.mutable_data());
  const int64_t n = x.size();
  py::gil_scoped_release release;
  QuantizeHalfTensor(in, n, scale, zero_point, y_signed, int32_convert, codes, threads);
  return y;
}

pybind11::array QuantizePy(const pybind11::array_t<float, pybind11::array::c_style>& x, float scale, int zero_point,
                           bool y_signed, const pybind11::object& out, int threads) {
  pybind11::array y = CodesFor("quantize_tensor", x, zero_point, y_signed, out);
  auto* codes = static_cast<uint8_t*>(y.mutable_data());
  pybind11::gil_scoped_release release;
  QuantizeTensor(x.data(), x.size(), scale, zero_point, y_signed, codes, threads);
  return y;
}

// y = (float(x) - z) * scale for any integer container T (the reference's float32 steps)
template <typename T>
void DequantizeRowScalar(const T* x, int64_t n, float z, float scale, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = (static_cast<float>(x[i]) - z) * scale;
}

#if NPU_EP_X86
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i Widen16(const T* x, __mmask16 k) {
  if constexpr (sizeof(T) == 4) {
    return _mm512_maskz_loadu_epi32(k, x);
  } else if constexpr (sizeof(T) == 2) {
    const __m256i v = _mm256_maskz_loadu_epi16(k, x);
    return std::is_signed<T>::value ? _mm512_cvtepi16_epi32(v) : _mm512_cvtepu16_epi32(v);
  } else {
    const __m128i v = _mm_maskz_loadu_epi8(k, x);
    return std::is_signed<T>::value ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
  }
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void DequantizeRowAvx512(const T* x, int64_t n, float z,
                                                                              float scale, float* y) {
  const __m512 sv = _mm512_set1_ps(scale), zv = _mm512_set1_ps(z);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(Widen16(x + i, k)), zv), sv));
  }
}
#endif

template <typename T>
void DequantizeAny(const T* x, int64_t n, float z, float scale, float* y, int threads) {
  ParallelFor(ThreadsFor(threads, n), (n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return DequantizeRowAvx512(x + i0, len, z, scale, y + i0);
#endif
    DequantizeRowScalar(x + i0, len, z, scale, y + i0);
  });
}

// out (ORT's buffer) borrowed once checked a writeable C-order array of T and x's size, else a new array of x's
// shape: neither a default array_t (a new empty numpy array per call) nor a conversion of out.
template <typename T>
pybind11::array_t<T> OutOrNew(const char* fn, const char* type, const pybind11::array& x, const pybind11::object& out) {
  namespace py = pybind11;
  if (out.is_none()) return py::array_t<T>(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const auto o =
      py::reinterpret_borrow<py::array>(py::isinstance<py::array_t<T>>(out) ? py::handle(out) : py::handle());
  if (!o || !(o.flags() & py::array::c_style) || !o.writeable() || o.size() != x.size())
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " + type + " array of " +
                                std::to_string(x.size()) + " elements");
  return py::reinterpret_borrow<py::array_t<T>>(out);
}

// x's elements dequantized into y (without the GIL from kReleaseGilBytes of output on).
template <typename T>
void DequantizeTensor(const pybind11::array& x, float z, float scale, float* y, int threads) {
  const auto* in = static_cast<const T*>(x.data());
  RunMoving(static_cast<size_t>(x.size()) * sizeof(float), [&] { DequantizeAny(in, x.size(), z, scale, y, threads); });
}

pybind11::array DequantizeIntoPy(const pybind11::array& x, float zero_point, float scale, const pybind11::object& out,
                                 int threads) {
  namespace py = pybind11;
  if (!(x.flags() & py::array::c_style)) throw std::invalid_argument("dequantize_into: x must be C-contiguous");
  auto y = OutOrNew<float>("dequantize_into", "float32", x, out);
  float* dst = y.mutable_data();
  const auto* descr = py::detail::array_descriptor_proxy(py::detail::array_proxy(x.ptr())->descr);
  switch (descr->byteorder == '>' ? -1 : descr->type_num) {  // the number read once, no dtype made per candidate
    case py::detail::npy_api::NPY_BYTE_: DequantizeTensor<int8_t>(x, zero_point, scale, dst, threads); break;
    case py::detail::npy_api::NPY_UBYTE_: DequantizeTensor<uint8_t>(x, zero_point, scale, dst, threads); break;
    case py::detail::npy_api::NPY_SHORT_: DequantizeTensor<int16_t>(x, zero_point, scale, dst, threads); break;
    case py::detail::npy_api::NPY_USHORT_: DequantizeTensor<uint16_t>(x, zero_point, scale, dst, threads); break;
    default:
      if (!x.dtype().equal(py::dtype::of<int32_t>()))
        throw std::invalid_argument("dequantize_into: x must be int8, uint8, int16, uint16 or int32, got " +
                                    std::string(py::str(x.dtype())));
      DequantizeTensor<int32_t>(x, zero_point, scale, dst, threads);
  }
  return y;
}

// The bounds of x's non-NaN values folded into lo/hi (std::min/std::max keep the bound against a NaN, as
// MlasFindMinMaxElement): an empty or all-NaN x leaves lo > hi.
void MinMaxScalar(const float* x, int64_t n, float& lo, float& hi) {
  for (int64_t i = 0; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) void MinMaxAvx512(const float* x, int64_t n, float& lo, float& hi) {
  __m512 l = _mm512_set1_ps(lo), h = _mm512_set1_ps(hi);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    l = _mm512_min_ps(v, l);  // minps/maxps return the second operand for a NaN: the bound stays
    h = _mm512_max_ps(v, h);
  }
  alignas(64) float ls[16], hs[16];
  _mm512_store_ps(ls, l);
  _mm512_store_ps(hs, h);
  for (int k = 0; k < 16; ++k) {  // a lane's bound folds into its own side only (an unused lane holds +-Inf)
    lo = ls[k] < lo ? ls[k] : lo;
    hi = hs[k] > hi ? hs[k] : hi;
  }
  MinMaxScalar(x + i, n - i, lo, hi);
}
#endif

// DynamicQuantizeLinear's scale and zero point (kernels/ops/dynamic_quantize.py: the range widened to 0, NaN
// left out; qmath.h's float32 steps)
std::pair<float, float> DynamicParams(const float* x, int64_t n, int threads) {
  const int64_t tasks = (n + kChunk - 1) / kChunk;
  std::vector<float> los(static_cast<size_t>(std::max<int64_t>(tasks, 1)), INFINITY), his(los.size(), -INFINITY);
  ParallelFor(ThreadsFor(threads, n), tasks, [&](int64_t c) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return MinMaxAvx512(x + i0, len, los[c], his[c]);
#endif
    MinMaxScalar(x + i0, len, los[c], his[c]);
  });
  float lo = INFINITY, hi = -INFINITY;
  for (size_t c = 0; c < los.size(); ++c) {
    lo = std::min(lo, los[c]);
    hi = std::max(hi, his[c]);
  }
  if (lo > hi) lo = hi = 0.0f;  // no value, or NaN only
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  const float initial = 0.0f - lo / scale;
  if (std::isnan(initial)) return {scale, 255.0f};
  return {scale, RoundHalfEven(std::min(std::max(initial, 0.0f), 255.0f))};
}

pybind11::tuple DynamicQuantizePy(const pybind11::array_t<float, pybind11::array::c_style>& x,
                                  const pybind11::object& out, int threads) {
  namespace py = pybind11;
  auto y = OutOrNew<uint8_t>("dynamic_quantize", "uint8", x, out);
  py::array_t<float> scale(std::vector<py::ssize_t>{});
  py::array_t<uint8_t> zero_point(std::vector<py::ssize_t>{});
  const float* in = x.data();
  uint8_t* codes = y.mutable_data();
  const int64_t n = x.size();
  std::pair<float, float> q;
  {
    py::gil_scoped_release release;
    q = DynamicParams(in, n, threads);
    QuantizeTensor(in, n, q.first, static_cast<int32_t>(q.second), false, codes, threads);
  }
  *scale.mutable_data() = q.first;
  *zero_point.mutable_data() = static_cast<uint8_t>(q.second);
  return py::make_tuple(y, scale, zero_point);
}

}  // namespace

void BindQuantize(pybind11::module_& m) {
  m.def("dynamic_quantize", &DynamicQuantizePy, pybind11::arg("x"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("threads") = 1,
        "DynamicQuantizeLinear of float32 x: (y uint8, y_scale float32 0-d, y_zero_point uint8 0-d) as ORT computes "
        "them (the range widened to 0, NaN left out; then quantize_tensor's float32 steps); y into out (ORT's buffer) "
        "when given");
  m.def("quantize_half", &QuantizeHalfPy, pybind11::arg("x"), pybind11::arg("scale"), pybind11::arg("zero_point"),
        pybind11::arg("y_signed"), pybind11::arg("int32_convert"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("threads") = 1,
        "per-tensor QuantizeLinear of float16 x to uint8/int8 as ORT's float16 kernels (the reference's steps): "
        "int32_convert (ONNX domain): rint(float32(x) / scale) as int32 (INT_MIN for NaN, +-Inf, |q| >= 2^31) + "
        "zero_point wrapping, clamped; else (com.microsoft) quantize_tensor's float32 steps on the widened x; into "
        "out (ORT's buffer) or a new array of x's shape");
  m.def("quantize_tensor", &QuantizePy, pybind11::arg("x"), pybind11::arg("scale"), pybind11::arg("zero_point"),
        pybind11::arg("y_signed"), pybind11::arg("out") = pybind11::none(), pybind11::arg("threads") = 1,
        "per-tensor QuantizeLinear of float32 x to uint8/int8 (ORT's float32 arithmetic), into out (ORT's buffer) or "
        "a new array of x's shape");
  m.def("dequantize_into", &DequantizeIntoPy, pybind11::arg("x"), pybind11::arg("zero_point"), pybind11::arg("scale"),
        pybind11::arg("out") = pybind11::none(), pybind11::arg("threads") = 1,
        "per-tensor DequantizeLinear of int8/uint8/int16/uint16/int32 x: (float32(x) - zero_point) * scale in "
        "float32, into out (ORT's buffer) or a new float32 array of x's shape");
}

void QuantizeTensor(const float* x, int64_t n, float scale, int32_t zp, bool is_signed, uint8_t* y, int threads) {
  const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f, z = static_cast<float>(zp);
  // at most kChunk elements a task, a multiple of the threads' count of tasks of equal length (9 chunks of 2^18 on
  // two threads left one thread a chunk alone); each element's code depends on it alone
  if (n <= 0) return;
  const int64_t per = std::max<int64_t>(threads, 1), rounds = (n + kChunk * per - 1) / (kChunk * per);
  const int64_t tasks = n > kChunk ? rounds * per : 1, chunk = ((n + tasks - 1) / tasks + 63) / 64 * 64;
  ParallelFor(threads, (n + chunk - 1) / chunk, [&](int64_t c) {
    const int64_t i0 = c * chunk, len = std::min(chunk, n - i0);
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return QuantizeAvx512(x + i0, len, scale, z, lo, hi, y + i0);
#endif
    QuantizeScalar(x + i0, len, scale, z, lo, hi, y + i0);
  });
}

}  // namespace npu_ep::kern
