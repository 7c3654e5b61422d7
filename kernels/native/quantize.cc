// Per-tensor Q/DQ in fixed chunks of elements (the bits never depend on the thread count). Same float32
// operations as the reference, in its order: a division (never a reciprocal multiply), rint, + zp, clip.
// `kernels.dequantize_into` dequantizes any integer container (8-, 16- or 32-bit) into ORT's buffer when given one;
// `kernels.dynamic_quantize` is DynamicQuantizeLinear: a NaN-skipping min/max pass, ORT's parameters, quantize.
#include "quantize.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu.h"
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
__attribute__((target("avx512f,avx512bw,avx512vl"))) void QuantizeAvx512(const float* x, int64_t n, float scale,
                                                                         float z, float lo, float hi, uint8_t* y) {
  const __m512 sv = _mm512_set1_ps(scale), zv = _mm512_set1_ps(z), lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
    q = _mm512_add_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
    q = _mm512_min_ps(_mm512_max_ps(q, lov), hiv);  // maxps returns its second operand for a NaN: NaN -> lo
    _mm_mask_storeu_epi8(y + i, k, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
  }
}

#endif

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

template <typename T>
bool DequantizeIf(const pybind11::array& x, float z, float scale, float* y, int threads) {
  if (!x.dtype().equal(pybind11::dtype::of<T>())) return false;
  const auto* in = static_cast<const T*>(x.data());
  pybind11::gil_scoped_release release;
  DequantizeAny(in, x.size(), z, scale, y, threads);
  return true;
}

pybind11::array DequantizeIntoPy(const pybind11::array& x, float zero_point, float scale, const pybind11::object& out,
                                 int threads) {
  namespace py = pybind11;
  if (!(x.flags() & py::array::c_style)) throw std::invalid_argument("dequantize_into: x must be C-contiguous");
  py::array_t<float> y;
  if (out.is_none()) {
    y = py::array_t<float>(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    y = py::reinterpret_borrow<py::array>(out);
    if (!py::isinstance<py::array_t<float>>(out) || !(y.flags() & py::array::c_style) || !y.writeable() ||
        y.size() != x.size())
      throw std::invalid_argument("dequantize_into: out must be a writeable C-order float32 array of " +
                                  std::to_string(x.size()) + " elements");
  }
  float* dst = y.mutable_data();
  if (!(DequantizeIf<int8_t>(x, zero_point, scale, dst, threads) ||
        DequantizeIf<uint8_t>(x, zero_point, scale, dst, threads) ||
        DequantizeIf<int16_t>(x, zero_point, scale, dst, threads) ||
        DequantizeIf<uint16_t>(x, zero_point, scale, dst, threads) ||
        DequantizeIf<int32_t>(x, zero_point, scale, dst, threads)))
    throw std::invalid_argument("dequantize_into: x must be int8, uint8, int16, uint16 or int32, got " +
                                std::string(py::str(x.dtype())));
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
  py::array_t<uint8_t> y;
  if (out.is_none()) {
    y = py::array_t<uint8_t>(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    y = py::reinterpret_borrow<py::array>(out);
    if (!py::isinstance<py::array_t<uint8_t>>(out) || !(y.flags() & py::array::c_style) || !y.writeable() ||
        y.size() != x.size())
      throw std::invalid_argument("dynamic_quantize: out must be a writeable C-order uint8 array of " +
                                  std::to_string(x.size()) + " elements");
  }
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
  m.def("dequantize_into", &DequantizeIntoPy, pybind11::arg("x"), pybind11::arg("zero_point"), pybind11::arg("scale"),
        pybind11::arg("out") = pybind11::none(), pybind11::arg("threads") = 1,
        "per-tensor DequantizeLinear of int8/uint8/int16/uint16/int32 x: (float32(x) - zero_point) * scale in "
        "float32, into out (ORT's buffer) or a new float32 array of x's shape");
}

void QuantizeTensor(const float* x, int64_t n, float scale, int32_t zp, bool is_signed, uint8_t* y, int threads) {
  const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f, z = static_cast<float>(zp);
  ParallelFor(threads, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
#if NPU_EP_X86
    if (ActiveIsa() >= Isa::kAvx512) return QuantizeAvx512(x + i0, len, scale, z, lo, hi, y + i0);
#endif
    QuantizeScalar(x + i0, len, scale, z, lo, hi, y + i0);
  });
}

}  // namespace npu_ep::kern
