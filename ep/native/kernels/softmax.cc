// Softmax over the last axis of a float32 array (`kernels.softmax_last_axis`), the native kernel behind
// kernels/ops/softmax.py: one pass per row (max, exp and sum, then division) on up to `threads` threads, rows in
// fixed tasks, so the bits do not depend on the thread count. An exported decoder's prefill materializes its
// attention scores (8 heads x 512 x 512 per layer); numpy's five passes over them on one core were 10-20% of the
// prefill. Its exp is a polynomial of its own (Cephes' expf: within 2 ulp), so results match the reference model
// within float tolerance, not bit for bit; rows holding a NaN or an infinite maximum are NaN, as the reference's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "thread_pool.h"

#pragma GCC optimize("O3", "fp-contract=off")  // O3: the element loops vectorize; no contraction: one set of bits

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr float kExpLow = -87.33654f;  // below this exp(x) is under float32's smallest normal: 0 here

// exp(x) for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r, times 2^n); 0 below
// kExpLow. Branch-free, so the row loop vectorizes.
inline float ExpNonPositive(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  float fn = xc * 1.44269504088896341f + 0.5f;
  auto n = static_cast<int32_t>(fn);  // truncation; fn < 0 here, so floor is one less where it had a fraction
  n -= static_cast<float>(n) > fn ? 1 : 0;
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (n + 127) << 23;  // 2^n: n >= -126 after the clamp
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < kExpLow ? 0.0f : p * scale;
}

void SoftmaxRow(const float* x, int64_t n, float* y) {
  float m = x[0];
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    nan |= x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  if (nan || std::isinf(m)) {  // the reference: x - max has a NaN, so the row's sum and every value are NaN
    std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  for (int64_t j = 0; j < n; ++j) y[j] = ExpNonPositive(x[j] - m);
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight running sums, added pairwise at the end
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += y[j + l];
  for (; j < n; ++j) lanes[j % 8] += y[j];
  const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (int64_t k = 0; k < n; ++k) y[k] /= sum;
}

py::array SoftmaxLastAxisPy(const py::array_t<float, py::array::c_style>& x, int threads) {
  if (x.ndim() < 1) throw std::invalid_argument("softmax_last_axis: x must have rank >= 1");
  const int64_t n = x.shape(x.ndim() - 1), rows = n > 0 ? x.size() / n : 0;
  py::array_t<float> y(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* src = x.data();
  float* dst = y.mutable_data();
  if (rows > 0) {
    py::gil_scoped_release release;
    constexpr int64_t kRowsPerTask = 32;
    ParallelFor(ThreadsFor(threads, rows * n * 16), (rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
      for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r)
        SoftmaxRow(src + r * n, n, dst + r * n);
    });
  }
  return std::move(y);
}

}  // namespace

void BindSoftmax(py::module_& m) {
  m.def("softmax_last_axis", &SoftmaxLastAxisPy, py::arg("x"), py::arg("threads") = 1,
        "softmax over the last axis of C-contiguous float32 x in one pass per row, rows on up to `threads` "
        "threads (the same bits at any count); its own exp (within 2 ulp): the reference model's within float "
        "tolerance; a row holding a NaN or an infinite maximum is NaN, as the reference's");
}

}  // namespace npu_ep::kern
