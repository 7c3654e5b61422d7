// npu::QdqMatMul of small products (`kernels.qdq_matmul_small`), for kernels/ops/qdq_matmul.py, whose reference it
// reproduces bit for bit: acc = (x - x_zp) @ W in float64 (exact: the check bounds every partial sum below 2^53,
// so the summation order does not matter), y = float32(acc * mult[n]), then QuantizeLinear in float32
// (nearest-even of y / y_scale, plus y_zp, fmax/fmin to the output range: NaN to its lowest value). One row of W
// per step of K, accumulated across N, so the inner loop vectorizes; meant for the small products where a BLAS
// call's fixed cost dominates (larger ones stay on the reference's float64 BLAS).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "broadcast.h"

#if !defined(__clang__)
#pragma GCC optimize("O3")  // the accumulation loop vectorizes (float64, exact integers: any order is the same)
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F64 = py::array_t<double, py::array::c_style>;

template <typename X, typename Y>
void Rows(const X* x, int64_t m, int64_t k, int64_t n, const double* w, double xzp, const double* mult, bool per_column,
          float ys, float yzp, float lo, float hi, Y* y) {
  std::vector<double> acc(static_cast<size_t>(n));
  for (int64_t r = 0; r < m; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const double a = static_cast<double>(x[r * k + i]) - xzp;
      const double* wr = w + i * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += a * wr[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const auto v = static_cast<float>(acc[j] * mult[per_column ? j : 0]);
      const float q = std::fmin(std::fmax(std::nearbyint(v / ys) + yzp, lo), hi);
      y[r * n + j] = static_cast<Y>(q);
    }
  }
}

template <typename X>
bool RunFor(const py::array& x, int64_t m, int64_t k, int64_t n, const F64& w, double xzp, const F64& mult, float ys,
            float yzp, float lo, float hi, py::array& y) {
  if (!x.dtype().equal(py::dtype::of<X>())) return false;
  const auto* px = static_cast<const X*>(x.data());
  const bool per_column = mult.size() > 1;
  const auto& dt = y.dtype();
  if (dt.equal(py::dtype::of<int8_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<int8_t*>(y.mutable_data()));
  else if (dt.equal(py::dtype::of<uint8_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<uint8_t*>(y.mutable_data()));
  else if (dt.equal(py::dtype::of<int16_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<int16_t*>(y.mutable_data()));
  else
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi,
         static_cast<uint16_t*>(y.mutable_data()));
  return true;
}

py::array QdqMatMulSmallPy(const py::array& x, const F64& w, double xzp, const F64& mult, float ys, float yzp, float lo,
                           float hi, const py::dtype& out_dtype) {
  const char* fn = "qdq_matmul_small";
  const bool out_ok = out_dtype.equal(py::dtype::of<int8_t>()) || out_dtype.equal(py::dtype::of<uint8_t>()) ||
                      out_dtype.equal(py::dtype::of<int16_t>()) || out_dtype.equal(py::dtype::of<uint16_t>());
  if (!(x.flags() & py::array::c_style) || x.ndim() < 1 || w.ndim() != 2 || x.shape(x.ndim() - 1) != w.shape(0) ||
      !out_ok || (mult.size() != 1 && mult.size() != w.shape(1)))
    throw std::invalid_argument(std::string(fn) +
                                ": x [..., K] C-order, W [K, N] float64, mult of 1 or N, an 8- or "
                                "16-bit output; got x" +
                                ShapeText(x) + ", W" + ShapeText(w));
  const int64_t k = w.shape(0), n = w.shape(1), m = k ? x.size() / k : 0;
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  shape.back() = n;
  py::array y(out_dtype, shape);
  const bool done = RunFor<int8_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<uint8_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<int16_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<uint16_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y);
  if (!done) throw std::invalid_argument(std::string(fn) + ": x must be int8, uint8, int16 or uint16");
  return y;
}

}  // namespace

void BindQdqMatMul(py::module_& m) {
  m.def("qdq_matmul_small", &QdqMatMulSmallPy, py::arg("x"), py::arg("w"), py::arg("x_zp"), py::arg("mult"),
        py::arg("y_scale"), py::arg("y_zp"), py::arg("lo"), py::arg("hi"), py::arg("out_dtype"),
        "npu::QdqMatMul of a small product: (x - x_zp) @ W exact in float64, times mult (per tensor or column) "
        "rounded to float32, quantized as QuantizeLinear to [lo, hi] in out_dtype (kernels/ops/qdq_matmul.py)");
}

}  // namespace npu_ep::kern
