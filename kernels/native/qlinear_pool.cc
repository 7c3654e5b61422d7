// com.microsoft QLinearGlobalAveragePool on 8-bit images (`kernels.qlinear_global_average_pool`), for
// kernels/ops/qlinear_pool.py, whose reference it reproduces bit for bit: an exact sum per (image, channel), less
// x_zp * image size, wrapped to int32 as the reference's int32 sum, then MLAS requantization: the float32 product with
// the multiplier clamped to [lo - y_zp, hi - y_zp] (fmax first: NaN gives the lowest code), rounded half to even,
// plus y_zp. NCHW sums a channel's contiguous plane (AVX-512 / AVX2: sums of absolute differences against zero,
// 64 or 32 bytes per step; int8 biased to unsigned by 128); channels_last adds rows of C channels.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "broadcast.h"
#include "cpu.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskBytes = 65536;  // input bytes per parallel task (at least one plane)

// The sum of n bytes as unsigned values (the caller unbiases int8).
int64_t SumScalar(const uint8_t* x, int64_t n, uint8_t bias) {
  int64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<uint8_t>(x[i] ^ bias);
  return s;
}

#if NPU_EP_X86
__attribute__((target("avx512f,avx512bw"))) int64_t SumAvx512(const uint8_t* x, int64_t n, uint8_t bias) {
  const __m512i b = _mm512_set1_epi8(static_cast<char>(bias)), zero = _mm512_setzero_si512();
  __m512i acc = zero;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(x + i), b), zero));
  alignas(64) int64_t lanes[8];
  _mm512_store_si512(lanes, acc);
  int64_t total = 0;
  for (const int64_t l : lanes) total += l;
  return total + SumScalar(x + i, n - i, bias);
}

__attribute__((target("avx2"))) int64_t SumAvx2(const uint8_t* x, int64_t n, uint8_t bias) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(bias)), zero = _mm256_setzero_si256();
  __m256i acc = zero;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), b);
    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, zero));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + SumScalar(x + i, n - i, bias);
}
#endif

using SumFn = int64_t (*)(const uint8_t*, int64_t, uint8_t);

SumFn SumFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return SumAvx512;
  if (isa >= Isa::kAvx2) return SumAvx2;
#endif
  return SumScalar;
}

struct Requant {
  int32_t bias;  // x_zp * image size (wrapped to int32)
  float multiplier, lo, hi, zp;  // lo, hi: the output range less y_zp
};

template <typename T>
T Requantize(int64_t sum, const Requant& q) {
  const auto acc = static_cast<int32_t>(static_cast<uint32_t>(sum) - static_cast<uint32_t>(q.bias));
  const float y = std::min(std::fmax(static_cast<float>(acc) * q.multiplier, q.lo), q.hi);
  return static_cast<T>(static_cast<int32_t>(RoundHalfEven(y) + q.zp));
}

template <typename T>
void PoolPlanes(const uint8_t* x, T* y, int64_t planes, int64_t image, const Requant& q, int threads) {
  const SumFn sum = SumFor();
  const uint8_t bias = std::is_signed<T>::value ? 0x80 : 0;
  const int64_t unbias = std::is_signed<T>::value ? 128 * image : 0;
  const int64_t per_task = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, image));
  ParallelFor(ThreadsFor(threads, planes * image), (planes + per_task - 1) / per_task, [&](int64_t t) {
    const int64_t end = std::min(planes, (t + 1) * per_task);
    for (int64_t p = t * per_task; p < end; ++p) y[p] = Requantize<T>(sum(x + p * image, image, bias) - unbias, q);
  });
}

// channels_last: per image, C int32 sums (wrapping, as the reference's int32 sum) of `image` rows of C values.
template <typename T>
void PoolRows(const T* x, T* y, int64_t batch, int64_t image, int64_t channels, const Requant& q, int threads) {
  ParallelFor(ThreadsFor(threads, batch * image * channels), batch, [&](int64_t n) {
    std::vector<uint32_t> acc(static_cast<size_t>(channels), 0);
    const T* img = x + n * image * channels;
    for (int64_t s = 0; s < image; ++s)
      for (int64_t c = 0; c < channels; ++c)
        acc[c] += static_cast<uint32_t>(static_cast<int32_t>(img[s * channels + c]));
    for (int64_t c = 0; c < channels; ++c) y[n * channels + c] = Requantize<T>(static_cast<int32_t>(acc[c]), q);
  });
}

template <typename T>
void Pool(const py::array& x, py::array& y, bool channels_last, int64_t image, const Requant& q, int threads) {
  const int64_t batch = x.shape(0), channels = channels_last ? x.shape(x.ndim() - 1) : x.shape(1);
  auto* out = static_cast<T*>(y.mutable_data());
  py::gil_scoped_release release;
  if (channels_last)
    PoolRows(static_cast<const T*>(x.data()), out, batch, image, channels, q, threads);
  else
    PoolPlanes(static_cast<const uint8_t*>(x.data()), out, batch * channels, image, q, threads);
}

py::array QLinearGlobalAveragePoolPy(const py::array& x, bool channels_last, int32_t x_zp, float multiplier, float y_zp,
                                     int threads) {
  const char* fn = "qlinear_global_average_pool";
  const bool i8 = x.dtype().equal(py::dtype::of<int8_t>()), u8 = x.dtype().equal(py::dtype::of<uint8_t>());
  if (!(i8 || u8) || !(x.flags() & py::array::c_style) || x.ndim() < 3)
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order int8 or uint8 array of rank >= 3, got " +
                                std::string(py::str(x.dtype())) + ShapeText(x));
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  int64_t image = 1;
  for (py::ssize_t i = channels_last ? 1 : 2; i < (channels_last ? x.ndim() - 1 : x.ndim()); ++i) {
    image *= shape[i];
    shape[i] = 1;
  }
  const auto bias = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(x_zp) * image));
  const float lo = i8 ? -128.0f : 0.0f, hi = i8 ? 127.0f : 255.0f;
  const Requant q{bias, multiplier, lo - y_zp, hi - y_zp, y_zp};
  py::array y(x.dtype(), shape);
  if (y.size() == 0) return y;
  if (i8)
    Pool<int8_t>(x, y, channels_last, image, q, threads);
  else
    Pool<uint8_t>(x, y, channels_last, image, q, threads);
  return y;
}

}  // namespace

void BindQLinearPool(py::module_& m) {
  m.def("qlinear_global_average_pool", &QLinearGlobalAveragePoolPy, py::arg("x"), py::arg("channels_last"),
        py::arg("x_zp"), py::arg("multiplier"), py::arg("y_zp"), py::arg("threads") = 1,
        "QLinearGlobalAveragePool of a C-order 8-bit NCHW (or channels_last NHWC) x: per (image, channel) the exact "
        "sum less x_zp * image size, times the float32 multiplier x_scale / (y_scale * image size), clamped, "
        "rounded half to even, plus y_zp (kernels/ops/qlinear_pool.py)");
}

}  // namespace npu_ep::kern
