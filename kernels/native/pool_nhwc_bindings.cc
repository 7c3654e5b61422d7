// Python bindings of the NHWC pools (pool_nhwc.h) for kernels/ops/pool_nhwc.py: `kernels.max_pool_nhwc`,
// `kernels.avg_pool_nhwc` over a geometry the reference resolved (as pool_bindings.cc's), float32 or float16.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "pool_nhwc.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int kNpyHalf = 23;  // NPY_HALF

// x's [N, H, W, C] and a geometry [OH, OW, kh, kw, sh, sw, dh, dw, pt, pl]; whether x is float16.
PoolShape NhwcShape(const py::array& x, const std::vector<int64_t>& g, const char* fn, bool* half) {
  const bool f32 = x.dtype().equal(py::dtype::of<float>());
  *half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if ((!f32 && !*half) || !(x.flags() & py::array::c_style) || x.ndim() != 4)
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order float32 or float16 [N, H, W, C] array");
  if (g.size() != 10) throw std::invalid_argument(std::string(fn) + ": geometry must be 10 ints");
  PoolShape s;
  s.N = x.shape(0), s.H = x.shape(1), s.W = x.shape(2), s.C = x.shape(3);
  s.OH = g[0], s.OW = g[1], s.kh = g[2], s.kw = g[3], s.sh = g[4], s.sw = g[5], s.dh = g[6], s.dw = g[7];
  s.pt = g[8], s.pl = g[9];
  if (s.OH < 0 || s.OW < 0 || s.kh <= 0 || s.kw <= 0 || s.sh <= 0 || s.sw <= 0 || s.dh <= 0 || s.dw <= 0)
    throw std::invalid_argument(std::string(fn) + ": output size must be >= 0 and kernel, strides, dilations positive");
  return s;
}

py::array Output(const PoolShape& s, bool half) {
  const std::vector<py::ssize_t> shape{s.N, s.OH, s.OW, s.C};
  return half ? py::array(py::dtype(kNpyHalf), shape) : py::array(py::dtype::of<float>(), shape);
}

py::array MaxPoolNhwcPy(const py::array& x, const std::vector<int64_t>& geom, float low, int threads) {
  bool half = false;
  const PoolShape s = NhwcShape(x, geom, "max_pool_nhwc", &half);
  py::array y = Output(s, half);
  const void* in = x.data();
  void* out = y.mutable_data();
  py::gil_scoped_release release;
  if (half)
    MaxPoolNhwcHalf(s, static_cast<const uint16_t*>(in), low, static_cast<uint16_t*>(out), threads);
  else
    MaxPoolNhwcFloat(s, static_cast<const float*>(in), low, static_cast<float*>(out), threads);
  return y;
}

py::array AvgPoolNhwcPy(const py::array& x, const std::vector<int64_t>& geom,
                        const py::array_t<float, py::array::c_style>& divisor, int threads) {
  bool half = false;
  const PoolShape s = NhwcShape(x, geom, "avg_pool_nhwc", &half);
  if (divisor.ndim() != 2 || divisor.shape(0) != s.OH || divisor.shape(1) != s.OW)
    throw std::invalid_argument("avg_pool_nhwc: divisor must be [OH, OW] = [" + std::to_string(s.OH) + ", " +
                                std::to_string(s.OW) + "]");
  py::array y = Output(s, half);
  const void* in = x.data();
  void* out = y.mutable_data();
  const float* div = divisor.data();
  py::gil_scoped_release release;
  if (half)
    AvgPoolNhwcHalf(s, static_cast<const uint16_t*>(in), div, static_cast<uint16_t*>(out), threads);
  else
    AvgPoolNhwcFloat(s, static_cast<const float*>(in), div, static_cast<float*>(out), threads);
  return y;
}

}  // namespace

void BindPoolNhwc(py::module_& m) {
  m.def("max_pool_nhwc", &MaxPoolNhwcPy, py::arg("x"), py::arg("geometry"), py::arg("low"), py::arg("threads") = 1,
        "MaxPool of float32 / float16 x [N, H, W, C] over geometry [OH, OW, kh, kw, sh, sw, dh, dw, pt, pl] (low: "
        "the value of a padded tap; a NaN wins) into [N, OH, OW, C], exact");
  m.def("avg_pool_nhwc", &AvgPoolNhwcPy, py::arg("x"), py::arg("geometry"), py::arg("divisor"), py::arg("threads") = 1,
        "AveragePool of float32 / float16 x [N, H, W, C]: float32 sums in the reference's tap order, divided by "
        "divisor [OH, OW]; float16 widened and rounded once; [N, OH, OW, C]");
}

}  // namespace npu_ep::kern
