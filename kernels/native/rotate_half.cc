// npu::RotateHalf (kernels/ops/rotate_half.py): y = x * cos + concat(-x2, x1) * sin over the last axis of x, with
// x1, x2 its halves and cos, sin broadcast to x's shape, as the exporters' rotary embedding writes it out. Each
// element is the unfused ops' float32 operations in their order (two products, then their sum; no multiply-add
// contraction), so the result is the unfused steps' bit for bit.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "thread_pool.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")  // O3: the row loop vectorizes; no FMA, so the bits are the ops'
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int kRank = 4;  // operands are left-padded to this rank
using Dims = std::array<int64_t, kRank>;
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

// One row of `half` pairs: y[j] = x[j] * c[j] + (-x[j + half]) * s[j], y[j + half] = x[j + half] * c[j + half] +
// x[j] * s[j + half].
void Row(const float* x, const float* c, const float* s, int64_t half, float* y) {
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j] * c[j], b = -x[j + half] * s[j];
    y[j] = a + b;
  }
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j + half] * c[j + half], b = x[j] * s[j + half];
    y[j + half] = a + b;
  }
}

// The operand's shape left-padded with 1s to kRank, and its row strides (0 along a broadcast dim); throws naming the
// operand when it does not broadcast to x's shape or its last dim is not x's.
Dims RowStrides(const F32& v, const Dims& out, const char* name) {
  if (v.ndim() > kRank) throw std::invalid_argument(std::string("rotate_half: ") + name + " has rank > 4");
  Dims dims{1, 1, 1, 1}, strides{0, 0, 0, 0};
  for (py::ssize_t i = 0; i < v.ndim(); ++i) dims[kRank - v.ndim() + i] = v.shape(i);
  if (dims[kRank - 1] != out[kRank - 1])
    throw std::invalid_argument(std::string("rotate_half: ") + name + "'s last dim " + std::to_string(dims[kRank - 1]) +
                                " is not x's " + std::to_string(out[kRank - 1]));
  int64_t stride = dims[kRank - 1];  // elements between consecutive rows of dim i
  for (int i = kRank - 2; i >= 0; --i) {
    if (dims[i] != out[i] && dims[i] != 1)
      throw std::invalid_argument(std::string("rotate_half: ") + name + " does not broadcast to x's shape");
    strides[i] = dims[i] == 1 ? 0 : stride;
    stride *= dims[i];
  }
  return strides;
}

py::array_t<float> RotateHalfPy(const F32& x, const F32& cos, const F32& sin, int64_t half, int threads) {
  if (x.ndim() < 1 || x.ndim() > kRank) throw std::invalid_argument("rotate_half: x must have rank 1..4");
  Dims out{1, 1, 1, 1};
  for (py::ssize_t i = 0; i < x.ndim(); ++i) out[kRank - x.ndim() + i] = x.shape(i);
  const int64_t h = out[kRank - 1];
  if (h != 2 * half)
    throw std::invalid_argument("rotate_half: x's last dim " + std::to_string(h) + " is not 2 * " +
                                std::to_string(half));
  const Dims cs = RowStrides(cos, out, "cos"), ss = RowStrides(sin, out, "sin");
  py::array_t<float> y(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float *xp = x.data(), *cp = cos.data(), *sp = sin.data();
  float* yp = y.mutable_data();
  const int64_t rows = out[0] * out[1] * out[2];
  {
    py::gil_scoped_release release;
    ParallelFor(ThreadsFor(threads, rows * h * 3), rows, [&](int64_t r) {
      const int64_t i2 = r % out[2], i1 = r / out[2] % out[1], i0 = r / (out[1] * out[2]);
      const int64_t co = i0 * cs[0] + i1 * cs[1] + i2 * cs[2], so = i0 * ss[0] + i1 * ss[1] + i2 * ss[2];
      Row(xp + r * h, cp + co, sp + so, half, yp + r * h);
    });
  }
  return y;
}

}  // namespace

void BindRotateHalf(py::module_& m) {
  m.def("rotate_half", &RotateHalfPy, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("half"),
        py::arg("threads") = 1,
        "x * cos + concat(-x[..., half:], x[..., :half]) * sin (float32; cos and sin broadcast to x's shape, "
        "last dim 2 * half), each element the unfused float32 ops in order");
}

}  // namespace npu_ep::kern
