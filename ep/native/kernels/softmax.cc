// Softmax over the last axis of a float32/float64 array (`kernels.softmax_rows`), for the bound step of
// kernels/ops/softmax.py, with the reference's bits: the row maxima, exp and the row sums are numpy's own (passed
// in: their vectorized reductions, exp and pairwise sums); the subtraction and the division by the row's sum are
// one correctly rounded operation per element here, as numpy's. What it saves is the reference's Python frame and
// two of its five numpy calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

template <typename T>
void SubtractRowMax(const T* x, const T* maxima, int64_t rows, int64_t n, T* e) {
  for (int64_t r = 0; r < rows; ++r) {
    const T m = maxima[r];
    for (int64_t j = 0; j < n; ++j) e[r * n + j] = x[r * n + j] - m;
  }
}

template <typename T>
void DivideRows(T* e, const T* sums, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) e[r * n + j] /= sums[r];
}

// fn(a, axis=-1, keepdims=True) as a C-contiguous [rows] array of T.
template <typename T>
py::array_t<T, py::array::c_style> RowReduce(const py::object& fn, const py::array& a, int64_t rows, const char* what) {
  auto r = py::array_t<T, py::array::c_style>::ensure(fn(a, py::arg("axis") = -1, py::arg("keepdims") = true));
  if (!r || r.size() != rows) throw std::runtime_error(std::string("softmax_rows: no row ") + what);
  return r;
}

template <typename T>
py::object Softmax(const py::object& max_reduce, const py::object& exp, const py::object& add_reduce,
                   const py::array& x) {
  const int64_t n = x.shape(x.ndim() - 1), rows = n > 0 ? x.size() / n : 0;
  py::array_t<T> e(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  if (rows == 0 || n == 0) return std::move(e);
  auto maxima = RowReduce<T>(max_reduce, x, rows, "maxima");
  SubtractRowMax(static_cast<const T*>(x.data()), maxima.data(), rows, n, e.mutable_data());
  exp(e, py::arg("out") = e);
  auto sums = RowReduce<T>(add_reduce, e, rows, "sums");
  DivideRows(e.mutable_data(), sums.data(), rows, n);
  return std::move(e);
}

py::object SoftmaxRowsPy(const py::object& max_reduce, const py::object& exp, const py::object& add_reduce,
                         const py::array& x) {
  if (x.ndim() < 1 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("softmax_rows: x must be a C-contiguous array of rank >= 1");
  if (x.dtype().equal(py::dtype::of<float>())) return Softmax<float>(max_reduce, exp, add_reduce, x);
  if (x.dtype().equal(py::dtype::of<double>())) return Softmax<double>(max_reduce, exp, add_reduce, x);
  throw std::invalid_argument("softmax_rows: x must be float32 or float64, got " + std::string(py::str(x.dtype())));
}

}  // namespace

void BindSoftmax(py::module_& m) {
  m.def("softmax_rows", &SoftmaxRowsPy, py::arg("max_reduce"), py::arg("exp"), py::arg("add_reduce"), py::arg("x"),
        "softmax over the last axis of C-contiguous float32/float64 x: x - max_reduce(x, axis=-1, keepdims=True), "
        "exp(e, out=e), then e / add_reduce(e, axis=-1, keepdims=True) in place (numpy's np.maximum.reduce, "
        "np.exp, np.add.reduce)");
}

}  // namespace npu_ep::kern
