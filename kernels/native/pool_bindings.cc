// Python bindings of the float16 pools (pool.h) for kernels/ops/pool.py: MaxPool / AveragePool over a geometry the
// reference resolved (as conv_bindings.cc's float32 max_pool / avg_pool), GlobalMaxPool and GlobalAveragePool.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "half.h"
#include "pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

bool IsHalf(const py::array& a) { return a.dtype().kind() == 'f' && a.itemsize() == 2; }

// A C-order float16 array of `rank` axes (any rank >= 3 when rank is 0), else ValueError naming fn.
void CheckHalf(const py::array& x, py::ssize_t rank, const char* fn) {
  if (!IsHalf(x) || !(x.flags() & py::array::c_style) || (rank ? x.ndim() != rank : x.ndim() < 3))
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order float16 array of " +
                                (rank ? std::to_string(rank) + " axes" : std::string("3 or more axes")) + ", got " +
                                std::string(py::str(x.dtype())) + " " + std::to_string(x.ndim()) + "-D");
}

// x's [N, C, H, W] and a geometry [OH, OW, kh, kw, sh, sw, dh, dw, pt, pl].
PoolShape HalfPoolShape(const py::array& x, const std::vector<int64_t>& g, const char* fn) {
  CheckHalf(x, 4, fn);
  if (g.size() != 10) throw std::invalid_argument(std::string(fn) + ": geometry must be 10 ints");
  PoolShape s;
  s.N = x.shape(0), s.C = x.shape(1), s.H = x.shape(2), s.W = x.shape(3);
  s.OH = g[0], s.OW = g[1], s.kh = g[2], s.kw = g[3], s.sh = g[4], s.sw = g[5], s.dh = g[6], s.dw = g[7];
  s.pt = g[8], s.pl = g[9];
  if (s.OH < 0 || s.OW < 0 || s.kh <= 0 || s.kw <= 0 || s.sh <= 0 || s.sw <= 0 || s.dh <= 0 || s.dw <= 0)
    throw std::invalid_argument(std::string(fn) + ": output size must be >= 0 and kernel, strides, dilations positive");
  return s;
}

constexpr int kNpyHalf = 23;  // NPY_HALF: numpy's type number, no dtype string parsed per call

py::array HalfArray(const std::vector<py::ssize_t>& shape) { return py::array(py::dtype(kNpyHalf), shape); }

py::array MaxPoolHalfPy(const py::array& x, const std::vector<int64_t>& geom, float low, int threads) {
  const PoolShape s = HalfPoolShape(x, geom, "max_pool_half");
  py::array y = HalfArray({s.N, s.C, s.OH, s.OW});
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* out = static_cast<uint16_t*>(y.mutable_data());
  py::gil_scoped_release release;
  MaxPoolHalf(s, in, low, out, threads);
  return y;
}

py::array AvgPoolHalfPy(const py::array& x, const std::vector<int64_t>& geom,
                        const py::array_t<float, py::array::c_style>& divisor, int threads) {
  const PoolShape s = HalfPoolShape(x, geom, "avg_pool_half");
  if (divisor.ndim() != 2 || divisor.shape(0) != s.OH || divisor.shape(1) != s.OW)
    throw std::invalid_argument("avg_pool_half: divisor must be [OH, OW] = [" + std::to_string(s.OH) + ", " +
                                std::to_string(s.OW) + "]");
  py::array y = HalfArray({s.N, s.C, s.OH, s.OW});
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* out = static_cast<uint16_t*>(y.mutable_data());
  py::gil_scoped_release release;
  AvgPoolHalf(s, in, divisor.data(), out, threads);
  return y;
}

// [N, C, 1, ...]: a global pool's output shape.
std::vector<py::ssize_t> PooledShape(const py::array& x) {
  std::vector<py::ssize_t> shape(static_cast<size_t>(x.ndim()), 1);
  shape[0] = x.shape(0), shape[1] = x.shape(1);
  return shape;
}

py::array GlobalMaxHalfPy(const py::array& x, int threads) {
  CheckHalf(x, 0, "global_max_pool_half");
  const int64_t rows = x.shape(0) * x.shape(1), count = rows ? x.size() / rows : 0;
  if (rows && !count) throw std::invalid_argument("global_max_pool_half: an image without pixels has no maximum");
  py::array y = HalfArray(PooledShape(x));
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* out = static_cast<uint16_t*>(y.mutable_data());
  py::gil_scoped_release release;
  GlobalMaxHalf(in, rows, count, out, threads);
  return y;
}

py::array GlobalAvgHalfPy(const py::array& x, int threads) {
  CheckHalf(x, 0, "global_average_pool_half");
  if (!x.size()) throw std::invalid_argument("global_average_pool_half: x must be non-empty");
  const int64_t rows = x.shape(0) * x.shape(1), count = x.size() / rows;
  py::array y = HalfArray(PooledShape(x));
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* out = static_cast<uint16_t*>(y.mutable_data());
  py::gil_scoped_release release;
  GlobalAvgHalf(in, rows, count, out, threads);
  return y;
}

py::array GlobalAvgFloatPy(const py::array& x, int threads) {
  if (x.ndim() < 3 || !x.dtype().equal(py::dtype::of<float>()) || !(x.flags() & py::array::c_style) || !x.size())
    throw std::invalid_argument("global_average_pool: x must be a non-empty C-contiguous float32 [N, C, ...] array");
  const int64_t rows = x.shape(0) * x.shape(1), count = x.size() / rows;
  py::array y(py::dtype::of<float>(), PooledShape(x));
  const auto* in = static_cast<const float*>(x.data());
  auto* out = static_cast<float*>(y.mutable_data());
  py::gil_scoped_release release;
  GlobalAvgFloat(in, rows, count, out, threads);
  return y;
}

}  // namespace

void BindPool(py::module_& m) {
  m.def("max_pool_half", &MaxPoolHalfPy, py::arg("x"), py::arg("geometry"), py::arg("low"), py::arg("threads") = 1,
        "MaxPool of float16 x [N, C, H, W] over a geometry as max_pool's (low: the value of a padded tap); the "
        "float32 kernel on each widened plane, exact");
  m.def("avg_pool_half", &AvgPoolHalfPy, py::arg("x"), py::arg("geometry"), py::arg("divisor"), py::arg("threads") = 1,
        "AveragePool of float16 x [N, C, H, W] as avg_pool on the widened planes (float32 sums in tap order, "
        "divided by divisor [OH, OW]), rounded once to float16");
  m.def("global_max_pool_half", &GlobalMaxHalfPy, py::arg("x"), py::arg("threads") = 1,
        "GlobalMaxPool of float16 x [N, C, ...]: each channel's maximum (NaN if any is NaN); shape [N, C, 1, ...]");
  m.def("global_average_pool_half", &GlobalAvgHalfPy, py::arg("x"), py::arg("threads") = 1,
        "GlobalAveragePool of float16 x [N, C, ...]: each channel widened, summed in numpy's pairwise float32 order "
        "(the reference's np.add.reduce), divided by the pixel count in float32, rounded to float16; [N, C, 1, ...]");
  m.def("global_average_pool", &GlobalAvgFloatPy, py::arg("x"), py::arg("threads") = 1,
        "GlobalAveragePool of float32 x [N, C, ...]: each channel summed in numpy's pairwise order (the reference's "
        "np.add.reduce: its bits), divided by the pixel count in float32; [N, C, 1, ...]");
}

}  // namespace npu_ep::kern
