// Integer ReduceSum over trailing axes (`kernels.reduce_sum_int`), for the bound step of kernels/ops/reduce.py; float32
// row maxima (`kernels.reduce_max_rows`: ReduceMax over trailing axes, GlobalMaxPool, exact: a maximum rounds nothing).
// The reference accumulates in float64 and saturates at the type's limits, as ORT's CPU kernel does. Where every
// partial sum is an integer below 2^53 in magnitude (the row's sum of |x| is), float64 adds exactly in any order,
// so the exact integer sum, saturated, has the reference's bits; any other row makes the call return None and the
// reference runs. A decoder's attention-mask sum is the case that matters: one call instead of five numpy calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <stdexcept>
#include <vector>

#include "cpu.h"
#include "intrinsics.h"
#include "thread_pool.h"

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

// A float ReduceMean as the reference computes it: numpy's add.reduce (passed in: its pairwise sums and their
// bits), then every sum divided by the element count in place, one correctly rounded division in the array's
// dtype each, as numpy's y / count.
py::object ReduceMeanFloatPy(const py::object& add_reduce, const py::array& x, const py::object& axes, bool keepdims,
                             int64_t count) {
  const bool f32 = x.dtype().equal(py::dtype::of<float>()), f64 = x.dtype().equal(py::dtype::of<double>());
  if (!f32 && !f64) throw std::invalid_argument("reduce_mean_float: x must be float32 or float64");
  if (count <= 0 || (f32 && count > (int64_t{1} << 24)))
    throw std::invalid_argument("reduce_mean_float: count " + std::to_string(count) + " out of range");
  py::object r = add_reduce(x, py::arg("axis") = axes, py::arg("dtype") = x.dtype(), py::arg("keepdims") = keepdims);
  if (!py::isinstance<py::array>(r)) return py::none();  // a numpy scalar (0-d result): the reference runs
  auto y = py::reinterpret_borrow<py::array>(r);
  if (!(y.flags() & (py::array::c_style | py::array::f_style)) || !y.writeable() || !y.dtype().equal(x.dtype()))
    return py::none();  // sums not in one contiguous run: the reference runs
  const int64_t n = y.size();
  if (f32) {
    float* v = static_cast<float*>(y.mutable_data());
    const auto c = static_cast<float>(count);
    for (int64_t i = 0; i < n; ++i) v[i] /= c;
  } else {
    double* v = static_cast<double*>(y.mutable_data());
    const auto c = static_cast<double>(count);
    for (int64_t i = 0; i < n; ++i) v[i] /= c;
  }
  return std::move(y);
}

// The maximum of x[0, n) (n >= 1), NaN if any is NaN (numpy's maximum); -0.0 and +0.0 in either order.
float MaxOfRowScalar(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != x[i]) return x[i];
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) float MaxOfRowAvx512(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = ninf, m1 = ninf;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);  // a NaN in either
    m0 = _mm512_max_ps(a, m0), m1 = _mm512_max_ps(b, m1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 a = _mm512_mask_loadu_ps(ninf, k, x + i);
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(a, m0);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
#endif

// Row maxima of a float32 [rows, cols] array (cols >= 1): GlobalMaxPool's channels, ReduceMax over trailing axes.
py::array ReduceMaxRowsPy(const py::array_t<float, py::array::c_style>& x, int threads) {
  if (x.ndim() != 2 || x.shape(1) < 1)
    throw std::invalid_argument("reduce_max_rows: x must be a float32 [rows, cols] array with cols >= 1");
  const int64_t rows = x.shape(0), cols = x.shape(1);
  py::array_t<float> y(std::vector<py::ssize_t>{rows});
  const float* src = x.data();
  float* dst = y.mutable_data();
  py::gil_scoped_release release;
#if NPU_EP_X86
  const bool avx512 = ActiveIsa() >= Isa::kAvx512;
#endif
  constexpr int64_t kRowsPerTask = 16;
  ParallelFor(ThreadsFor(threads, rows * cols), (rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) {
#if NPU_EP_X86
      if (avx512) {
        dst[r] = MaxOfRowAvx512(src + r * cols, cols);
        continue;
      }
#endif
      dst[r] = MaxOfRowScalar(src + r * cols, cols);
    }
  });
  return std::move(y);
}

}  // namespace

void BindReduce(py::module_& m) {
  m.def("reduce_max_rows", &ReduceMaxRowsPy, py::arg("x"), py::arg("threads") = 1,
        "row maxima of a C-contiguous float32 [rows, cols >= 1] array, NaN where a row holds one (numpy's "
        "maximum.reduce), on up to `threads` threads");
  m.def("reduce_mean_float", &ReduceMeanFloatPy, py::arg("add_reduce"), py::arg("x"), py::arg("axes"),
        py::arg("keepdims"), py::arg("count"),
        "float32/float64 ReduceMean: add_reduce(x, axis=axes, dtype=x.dtype, keepdims) (numpy's np.add.reduce), "
        "each sum then divided by count in place; None for a 0-d result");
  m.def("reduce_sum_int", &ReduceSumIntPy, py::arg("x"),
        "Row sums of an int32/int64 [rows, cols] array, saturated to its type, equal to ORT's float64 "
        "accumulation; None when a row's sum of |x| reaches 2^53 (float64 could round there: the reference runs)");
}

}  // namespace npu_ep::kern
