// A float32 MatMul / Gemm with a constant B as one native step (`kernels.float_matmul`, bound by
// kernels/ops/matmul.py): numpy's own matmul makes the product (the reference's very call, so the same BLAS
// routine and the same bits), then the fused epilogue runs here in place, element by element as the reference's
// numpy passes do: + bias, ReLU as np.maximum(y, 0) (NaN stays, -0 becomes +0), a per-tensor 8-bit
// QuantizeLinear (quantize.cc). What it saves is the step's Python, not arithmetic.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "quantize.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F32 = py::array_t<float, py::array::c_style>;

void BiasRelu(float* y, int64_t rows, int64_t n, const float* bias, bool relu) {
  for (int64_t r = 0; r < rows; ++r, y += n) {
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) y[j] += bias[j];
    if (relu)
      for (int64_t j = 0; j < n; ++j) y[j] = y[j] > 0.0f || y[j] != y[j] ? y[j] : 0.0f;
  }
}

// quantize: None, or (scale, zero point, signed) of a per-tensor int8/uint8 QuantizeLinear after the epilogue.
py::array FloatMatmulPy(const py::object& matmul, const py::array& a, const py::array& b,
                        const std::optional<F32>& bias, bool relu, const py::object& quantize, int threads) {
  py::object product = matmul(a, b);
  if (!py::isinstance<F32>(product))
    throw std::invalid_argument("float_matmul: the product of a and b is not a float32 array");
  auto y = product.cast<py::array>();
  if (y.ndim() < 1 || !(y.flags() & py::array::c_style) || !y.writeable())
    throw std::invalid_argument("float_matmul: the product must be a writeable C-contiguous array of rank >= 1");
  const int64_t n = y.shape(y.ndim() - 1), size = y.size();
  if (bias && bias->size() != n)
    throw std::invalid_argument("float_matmul: bias has " + std::to_string(bias->size()) + " values for " +
                                std::to_string(n) + " output columns");
  float* data = static_cast<float*>(y.mutable_data());
  const float* bias_data = bias ? bias->data() : nullptr;
  if (quantize.is_none()) {
    py::gil_scoped_release release;
    if (n > 0) BiasRelu(data, size / n, n, bias_data, relu);
    return y;
  }
  auto q = quantize.cast<py::tuple>();
  const float scale = q[0].cast<float>();
  const int32_t zp = q[1].cast<int32_t>();
  const bool is_signed = q[2].cast<bool>();
  py::array out(is_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>(),
                std::vector<py::ssize_t>(y.shape(), y.shape() + y.ndim()));
  auto* out_data = static_cast<uint8_t*>(out.mutable_data());
  {
    py::gil_scoped_release release;
    if (n > 0) BiasRelu(data, size / n, n, bias_data, relu);
    QuantizeTensor(data, size, scale, zp, is_signed, out_data, threads);
  }
  return out;
}

}  // namespace

void BindFloatMatmul(py::module_& m) {
  m.def("float_matmul", &FloatMatmulPy, py::arg("matmul"), py::arg("a"), py::arg("b"), py::arg("bias") = py::none(),
        py::arg("relu") = false, py::arg("quantize") = py::none(), py::arg("threads") = 1,
        "matmul(a, b) (numpy's matmul: the product's bits are numpy's), then in place + bias (one float32 per "
        "output column), ReLU as np.maximum(y, 0), and with quantize = (scale, zero point, signed) a per-tensor "
        "int8/uint8 QuantizeLinear (a new array)");
}

}  // namespace npu_ep::kern
