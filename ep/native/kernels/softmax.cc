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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // the scalar tail and the SSE2 lanes: the same operations, the same bits
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr float kExpLow = -87.33654f;  // below this exp(x) is under float32's smallest normal: 0 here
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(x) for x <= 0, never NaN (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r, times 2^n);
// 0 below kExpLow. The SSE2 lanes below do these very operations in this order: the same bits on every host.
inline float ExpNonPositive(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  const float fn = xc * kLog2e + 0.5f;
  float nf = static_cast<float>(static_cast<int32_t>(fn));  // truncation, then floor (fn < 0.5 here)
  if (nf > fn) nf -= 1.0f;
  const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = p * r + kP[i];
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;  // 2^n: n >= -126 after the clamp
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < kExpLow ? 0.0f : p * scale;
}

#if defined(__SSE2__)
inline __m128 Exp4(__m128 x) {
  const __m128 low = _mm_set1_ps(kExpLow), one = _mm_set1_ps(1.0f);
  const __m128 xc = _mm_max_ps(x, low);
  const __m128 fn = _mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(kLog2e)), _mm_set1_ps(0.5f));
  __m128 nf = _mm_cvtepi32_ps(_mm_cvttps_epi32(fn));
  nf = _mm_sub_ps(nf, _mm_and_ps(_mm_cmpgt_ps(nf, fn), one));
  const __m128 r = _mm_sub_ps(_mm_sub_ps(xc, _mm_mul_ps(nf, _mm_set1_ps(kLn2Hi))), _mm_mul_ps(nf, _mm_set1_ps(kLn2Lo)));
  __m128 p = _mm_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(kP[i]));
  p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(r, r)), r), one);
  const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nf), _mm_set1_epi32(127)), 23));
  return _mm_andnot_ps(_mm_cmplt_ps(x, low), _mm_mul_ps(p, scale));
}
#endif

void SoftmaxRow(const float* x, int64_t n, float* y) {
  float m = x[0];
  bool nan = false;
  int64_t j = 0;
#if defined(__SSE2__)
  __m128 vm = _mm_set1_ps(x[0]), vnan = _mm_setzero_ps();
  for (; j + 4 <= n; j += 4) {
    const __m128 v = _mm_loadu_ps(x + j);
    vnan = _mm_or_ps(vnan, _mm_cmpunord_ps(v, v));
    vm = _mm_max_ps(vm, v);
  }
  alignas(16) float lanes4[4];
  _mm_store_ps(lanes4, vm);
  for (float v : lanes4) m = v > m ? v : m;
  nan = _mm_movemask_ps(vnan) != 0;
#endif
  for (; j < n; ++j) {
    nan |= x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  if (nan || std::isinf(m)) {  // the reference: x - max has a NaN, so the row's sum and every value are NaN
    std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight running sums (element j in lane j % 8), added pairwise at the end
  j = 0;
#if defined(__SSE2__)
  const __m128 vmax = _mm_set1_ps(m);
  __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m128 e0 = Exp4(_mm_sub_ps(_mm_loadu_ps(x + j), vmax));
    const __m128 e1 = Exp4(_mm_sub_ps(_mm_loadu_ps(x + j + 4), vmax));
    _mm_storeu_ps(y + j, e0);
    _mm_storeu_ps(y + j + 4, e1);
    s0 = _mm_add_ps(s0, e0);
    s1 = _mm_add_ps(s1, e1);
  }
  _mm_storeu_ps(lanes, s0);
  _mm_storeu_ps(lanes + 4, s1);
#endif
  for (; j < n; ++j) {
    y[j] = ExpNonPositive(x[j] - m);
    lanes[j % 8] += y[j];
  }
  const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  j = 0;
#if defined(__SSE2__)
  const __m128 vsum = _mm_set1_ps(sum);
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(y + j, _mm_div_ps(_mm_loadu_ps(y + j), vsum));
#endif
  for (; j < n; ++j) y[j] /= sum;
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
