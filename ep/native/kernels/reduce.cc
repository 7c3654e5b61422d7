// Integer ReduceSum over trailing axes (`kernels.reduce_sum_int`), for the bound step of kernels/ops/reduce.py.
// The reference accumulates in float64 and saturates at the type's limits, as ORT's CPU kernel does. Where every
// partial sum is an integer below 2^53 in magnitude (the row's sum of |x| is), float64 adds exactly in any order,
// so the exact integer sum, saturated, has the reference's bits; any other row makes the call return None and the
// reference runs. A decoder's attention-mask sum is the case that matters: one call instead of five numpy calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr uint64_t kExact = uint64_t{1} << 53;  // float64 holds every integer below this

// Row sums of x [rows, cols] into y, saturated to T; false if a row's sum of |x| reaches 2^53.
template <typename T>
bool SumRows(const T* x, int64_t rows, int64_t cols, T* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    int64_t sum = 0;
    uint64_t magnitude = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t v = row[c];
      const uint64_t a = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
      if (a >= kExact || (magnitude += a) >= kExact) return false;
      sum += v;
    }
    y[r] = static_cast<T>(std::clamp<int64_t>(sum, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  }
  return true;
}

template <typename T>
py::object Reduce(const py::array& x) {
  const int64_t rows = x.shape(0), cols = x.shape(1);
  py::array_t<T> y(std::vector<py::ssize_t>{rows});
  if (!SumRows(static_cast<const T*>(x.data()), rows, cols, y.mutable_data())) return py::none();
  return std::move(y);
}

py::object ReduceSumIntPy(const py::array& x) {
  if (x.ndim() != 2 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("reduce_sum_int: x must be a C-contiguous [rows, cols] array");
  if (x.dtype().is(py::dtype::of<int32_t>())) return Reduce<int32_t>(x);
  if (x.dtype().is(py::dtype::of<int64_t>())) return Reduce<int64_t>(x);
  throw std::invalid_argument("reduce_sum_int: x must be int32 or int64, got " + std::string(py::str(x.dtype())));
}

}  // namespace

void BindReduce(py::module_& m) {
  m.def("reduce_sum_int", &ReduceSumIntPy, py::arg("x"),
        "Row sums of an int32/int64 [rows, cols] array, saturated to its type, equal to ORT's float64 "
        "accumulation; None when a row's sum of |x| reaches 2^53 (float64 could round there: the reference runs)");
}

}  // namespace npu_ep::kern
