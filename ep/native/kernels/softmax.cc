// Softmax over the last axis of a float32/float64 array (`kernels.softmax_rows`), for the bound step of
// kernels/ops/softmax.py, with the reference's bits: the row maximum and x - max are exact in any order, so they
// run here; exp and the row sums are numpy's own ufuncs (passed in: their vectorized exp and pairwise sums), and
// each value is then divided by its row's sum in place (one correctly rounded division, as numpy's e /= sum).
// What it saves is the reference's Python: five numpy calls and their temporaries become two calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

template <typename T>
void SubtractRowMax(const T* x, int64_t rows, int64_t n, T* e) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    T m = row[0];  // np.maximum.reduce: a NaN anywhere makes the maximum NaN
    for (int64_t j = 1; j < n && !std::isnan(m); ++j)
      if (std::isnan(row[j]) || row[j] > m) m = row[j];
    for (int64_t j = 0; j < n; ++j) e[r * n + j] = row[j] - m;
  }
}

template <typename T>
void DivideRows(T* e, const T* sums, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) e[r * n + j] /= sums[r];
}

template <typename T>
py::object Softmax(const py::object& exp, const py::object& add_reduce, const py::array& x) {
  const int64_t n = x.shape(x.ndim() - 1), rows = n > 0 ? x.size() / n : 0;
  py::array_t<T> e(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  if (rows == 0 || n == 0) return std::move(e);
  SubtractRowMax(static_cast<const T*>(x.data()), rows, n, e.mutable_data());
  exp(e, py::arg("out") = e);
  py::object s = add_reduce(e, py::arg("axis") = -1, py::arg("keepdims") = true);
  auto sums = py::array_t<T, py::array::c_style>::ensure(s);
  if (!sums || sums.size() != rows) throw std::runtime_error("softmax_rows: add_reduce gave no row sums");
  DivideRows(e.mutable_data(), sums.data(), rows, n);
  return std::move(e);
}

py::object SoftmaxRowsPy(const py::object& exp, const py::object& add_reduce, const py::array& x) {
  if (x.ndim() < 1 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("softmax_rows: x must be a C-contiguous array of rank >= 1");
  if (x.dtype().equal(py::dtype::of<float>())) return Softmax<float>(exp, add_reduce, x);
  if (x.dtype().equal(py::dtype::of<double>())) return Softmax<double>(exp, add_reduce, x);
  throw std::invalid_argument("softmax_rows: x must be float32 or float64, got " + std::string(py::str(x.dtype())));
}

}  // namespace

void BindSoftmax(py::module_& m) {
  m.def("softmax_rows", &SoftmaxRowsPy, py::arg("exp"), py::arg("add_reduce"), py::arg("x"),
        "softmax over the last axis of C-contiguous float32/float64 x: x - row max here, exp(e, out=e) and "
        "add_reduce(e, axis=-1, keepdims=True) (numpy's np.exp, np.add.reduce), then e / row sum in place");
}

}  // namespace npu_ep::kern
