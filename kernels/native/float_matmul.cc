// A float32 MatMul / Gemm with a constant B as one native step (bound by kernels/ops/matmul.py), two ways:
// - `kernels.float_matmul`: numpy's own matmul makes the product (the reference's very call, so the same BLAS
//   routine and the same bits), then the fused epilogue runs here in place, element by element as the reference's
//   numpy passes do: + bias, ReLU as np.maximum(y, 0) (NaN stays, -0 becomes +0), a per-tensor 8-bit
//   QuantizeLinear (quantize.cc). What it saves is the step's Python, not arithmetic.
// - `kernels.float_matmul_packed`: large products on our own GEMM with B packed once (packed_sgemm.h), bias and
//   ReLU in its registers, then the same quantize.
// - `kernels.norm_matmul_float`: a float32 npu::NormMatMul (kernels/ops/norm_matmul.py) in one call: its RMS-norm
//   prologue (norm_matmul.h), the product on the packed GEMM with its bias, then a group's SwiGLU.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "bindings.h"
#include "half.h"
#include "norm_matmul.h"
#include "packed_sgemm.h"
#include "quantize.h"
#include "scratch.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F32 = py::array_t<float, py::array::c_style>;

void BiasRelu(float* y, int64_t rows, int64_t n, const float* bias, bool relu) {
  for (int64_t r = 0; r < rows; ++r, y += n) {
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) y[j] += bias[j];
    if (relu)
      for (int64_t j = 0; j < n; ++j) y[j] = y[j] > 0.0f || y[j] != y[j] ? y[j] : 0.0f;
  }
}

// quantize = (scale, zero point, signed): a per-tensor int8/uint8 QuantizeLinear of the float32 result y.
py::array Quantized(float* y, const py::ssize_t* shape, py::ssize_t ndim, const py::object& quantize, int threads) {
  auto q = quantize.cast<py::tuple>();
  const float scale = q[0].cast<float>();
  const int32_t zp = q[1].cast<int32_t>();
  const bool is_signed = q[2].cast<bool>();
  py::array out(is_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>(),
                std::vector<py::ssize_t>(shape, shape + ndim));
  auto* out_data = static_cast<uint8_t*>(out.mutable_data());
  {
    py::gil_scoped_release release;
    QuantizeTensor(y, out.size(), scale, zp, is_signed, out_data, threads);
  }
  return out;
}

// quantize: None, or (scale, zero point, signed) of a per-tensor int8/uint8 QuantizeLinear after the epilogue.
py::array FloatMatmulPy(const py::object& matmul, const py::array& a, const py::array& b,
                        const std::optional<F32>& bias, bool relu, const py::object& quantize, int threads) {
  py::object product = matmul(a, b);
  if (!py::isinstance<F32>(product))
    throw std::invalid_argument("float_matmul: the product of a and b is not a float32 array");
  auto y = product.cast<py::array>();
  if (y.ndim() < 1 || !(y.flags() & py::array::c_style) || !y.writeable())
    throw std::invalid_argument("float_matmul: the product must be a writeable C-contiguous array of rank >= 1");
  const int64_t n = y.shape(y.ndim() - 1), size = y.size();
  if (bias && bias->size() != n)
    throw std::invalid_argument("float_matmul: bias has " + std::to_string(bias->size()) + " values for " +
                                std::to_string(n) + " output columns");
  float* data = static_cast<float*>(y.mutable_data());
  const float* bias_data = bias ? bias->data() : nullptr;
  {
    py::gil_scoped_release release;
    if (n > 0) BiasRelu(data, size / n, n, bias_data, relu);
  }
  if (quantize.is_none()) return y;
  return Quantized(data, y.shape(), y.ndim(), quantize, threads);
}

// numpy's float16, made once (from its name: pybind11 has no C++ type for it); never freed, as the module is not.
const py::dtype& Float16() {
  static const auto* dtype = new py::dtype("float16");
  return *dtype;
}

// Whether `out` (an array or None) can take a result of `dtype` and `shape` in place: C-contiguous, writeable.
bool Fits(const py::object& out, const py::dtype& dtype, const std::vector<py::ssize_t>& shape) {
  if (!py::isinstance<py::array>(out)) return false;
  auto into = py::reinterpret_borrow<py::array>(out);
  return into.dtype().num() == dtype.num() && (into.flags() & py::array::c_style) && into.writeable() &&
         std::equal(shape.begin(), shape.end(), into.shape(), into.shape() + into.ndim());
}

// Checks the packed B of `n` columns against A's depth k (pack_sgemm_b's panels).
void CheckPacked(const F32& packed, int64_t k, int64_t n, const char* op) {
  if (n < 0 || packed.ndim() != 3 || packed.shape(0) != (n + kSgemmPanel - 1) / kSgemmPanel || packed.shape(1) != k ||
      packed.shape(2) != kSgemmPanel)
    throw std::invalid_argument(std::string(op) + ": a has " + std::to_string(k) + " columns and the product " +
                                std::to_string(n) + ", so B must be " + std::to_string(k) + " rows x " +
                                std::to_string(n) + " columns in panels (pack_sgemm_b)");
}

// A float16 product of many rows (at least two blocks per thread), a task per kHalfRows rows: it widens them,
// multiplies them on its own thread and rounds its float32 sums, so the widened rows and the sums stay in the cache
// (through whole-array copies the two conversions cost ~10% of a 1500x1536x1536 product). The packed GEMM's sums do not
// depend on the split: the bits are the whole-array path's.
constexpr int64_t kHalfRows = 128;

void HalfProductByRows(const uint16_t* a, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                       bool relu, uint16_t* y, int threads) {
  const int64_t blocks = (m + kHalfRows - 1) / kHalfRows;
  ParallelFor(ThreadsFor(threads, m * n * k), blocks, [&](int64_t block) {
    static thread_local std::vector<float> rows_in, rows_out;  // grown, never cleared (every element written first)
    const int64_t r0 = block * kHalfRows, rows = std::min(kHalfRows, m - r0);
    float* w = Grow(rows_in, rows * k);
    float* c = Grow(rows_out, rows * n);
    HalfToFloatRow(a + r0 * k, w, rows * k);
    const PackedSgemmArgs g{w, rows, k, k, packed, n, c, n, bias, relu};
    PackedSgemm(g, 1, nullptr, nullptr);
    FloatToHalfRow(c, y + r0 * n, rows * n);
  });
}

// A[..., K] (C-contiguous float32, or float16: widened exactly, the result rounded to float16 once after bias,
// ReLU and SwiGLU, as the reference's astype) times the packed B of N columns; + bias, ReLU and quantize as above; plan
// and count_dma as the other matrix kernels' (bindings.h); with swiglu (no ReLU, no quantize), g * sigmoid(g) * u of
// the product's two halves (a {gate, up} group's epilogue, SwiGlu).
// out: an array to write the result into (ORT's output buffer, when the step's output is the partition's), used
// when it is C-contiguous, of the result's dtype and shape, and there is no quantize; else a new array.
// packed and bias are borrowed as they are (AsArray): a bound step's call makes no numpy conversion per call.
py::object FloatMatmulPackedPy(const py::array& a, const py::object& packed_in, int64_t n,
                               const std::optional<py::tuple>& plan, bool count_dma, const py::object& bias_in,
                               bool relu, const py::object& quantize, int threads, const py::object& out, bool swiglu) {
  const F32 packed = AsArray<float>(packed_in, "float_matmul_packed", "packed");
  const std::optional<F32> bias = AsOptionalArray<float>(bias_in, "float_matmul_packed", "bias");
  const bool half = a.dtype().num() == Float16().num();
  if ((!half && !py::isinstance<F32>(a)) || a.ndim() < 1 || !(a.flags() & py::array::c_style))
    throw std::invalid_argument("float_matmul_packed: a must be a C-contiguous float32 or float16 array of rank >= 1");
  if (half && !quantize.is_none())
    throw std::invalid_argument("float_matmul_packed: a float16 product takes no quantize");
  const int64_t k = a.shape(a.ndim() - 1);
  int64_t m = 1;
  for (py::ssize_t d = 0; d + 1 < a.ndim(); ++d) m *= a.shape(d);
  CheckPacked(packed, k, n, "float_matmul_packed");
  if (bias && bias->size() != n)
    throw std::invalid_argument("float_matmul_packed: bias has " + std::to_string(bias->size()) + " values for " +
                                std::to_string(n) + " output columns");
  if (swiglu && (n % 2 != 0 || relu || !quantize.is_none()))
    throw std::invalid_argument("float_matmul_packed: SwiGLU needs an even column count, no ReLU and no quantize");
  const std::optional<TilePlanArgs> tiles = PlanArgs(plan, "float_matmul_packed");
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  shape.back() = swiglu ? n / 2 : n;
  const py::dtype result_dtype = half ? Float16() : py::dtype::of<float>();
  const bool fits = quantize.is_none() && Fits(out, result_dtype, shape);
  py::array y = fits ? py::reinterpret_borrow<py::array>(out) : py::array(result_dtype, shape);
  void* y_data = y.mutable_data();
  DmaCount dma;
  {
    py::gil_scoped_release release;
    // grown, never cleared (every element written first)
    static thread_local std::vector<float> product, widened, result;
    const float* a_rows = static_cast<const float*>(a.data());
    if (half && !swiglu && !tiles && !count_dma && m >= 2 * kHalfRows * std::max(1, threads)) {
      HalfProductByRows(static_cast<const uint16_t*>(a.data()), m, k, packed.data(), n, bias ? bias->data() : nullptr,
                        relu, static_cast<uint16_t*>(y_data), threads);
      return WithDma(std::move(y), false, dma);
    }
    if (half) {
      float* w = Grow(widened, m * k);
      HalfToFloatRow(static_cast<const uint16_t*>(a.data()), w, m * k);
      a_rows = w;
    }
    const int64_t out_n = shape.back();
    float* data = half ? Grow(result, m * out_n) : static_cast<float*>(y_data);  // the float32 result
    float* c = swiglu ? Grow(product, m * n) : data;
    const PackedSgemmArgs g{a_rows, m, k, k, packed.data(), n, c, n, bias ? bias->data() : nullptr, relu};
    PackedSgemm(g, threads, tiles ? &*tiles : nullptr, count_dma ? &dma : nullptr);
    if (swiglu) SwiGlu(c, m, out_n, data, threads);
    if (half) FloatToHalfRow(data, static_cast<uint16_t*>(y_data), m * out_n);
  }
  if (quantize.is_none()) return WithDma(std::move(y), count_dma, dma);
  return WithDma(Quantized(static_cast<float*>(y_data), shape.data(), a.ndim(), quantize, threads), count_dma, dma);
}

// x [..., K] (and skip of x's shape): the RMS norm's rows (Simplified without skip, Skip* with it; gamma is folded
// into B), times the packed B of n columns, + bias; with swiglu, g * sigmoid(g) * u of the two halves. Returns
// (y,) or, with want_sum, (y, x + skip (+ norm_bias)). sdot: the BLAS sdot's address (0: a sequential dot).
py::tuple NormMatmulFloatPy(const py::object& x_in, const py::object& skip_in, const py::object& packed_in, int64_t n,
                            const py::object& norm_bias_in, double eps, bool want_sum, const py::object& bias_in,
                            bool swiglu, uintptr_t sdot, int threads) {
  const char* op = "norm_matmul_float";
  const F32 x = AsArray<float>(x_in, op, "x"), packed = AsArray<float>(packed_in, op, "packed");
  const std::optional<F32> skip = AsOptionalArray<float>(skip_in, op, "skip");
  const std::optional<F32> norm_bias = AsOptionalArray<float>(norm_bias_in, op, "norm_bias");
  const std::optional<F32> bias = AsOptionalArray<float>(bias_in, op, "bias");
  if (x.ndim() < 1) throw std::invalid_argument(std::string(op) + ": x must have rank >= 1");
  const int64_t k = x.shape(x.ndim() - 1), m = k > 0 ? x.size() / k : 0;
  CheckPacked(packed, k, n, op);
  if (skip && !std::equal(x.shape(), x.shape() + x.ndim(), skip->shape(), skip->shape() + skip->ndim()))
    throw std::invalid_argument(std::string(op) + ": skip's shape differs from x's");
  if (norm_bias && (!skip || norm_bias->size() != k))
    throw std::invalid_argument(std::string(op) + ": norm_bias needs skip and " + std::to_string(k) + " values");
  if (want_sum && !skip) throw std::invalid_argument(std::string(op) + ": the sum output needs skip");
  if (bias && bias->size() != n)
    throw std::invalid_argument(std::string(op) + ": bias has " + std::to_string(bias->size()) + " values for " +
                                std::to_string(n) + " output columns");
  if (swiglu && n % 2 != 0) throw std::invalid_argument(std::string(op) + ": SwiGLU needs an even column count");
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  const int64_t out_n = swiglu ? n / 2 : n;
  shape.back() = out_n;
  F32 y(shape);
  std::optional<F32> sum;
  if (want_sum) sum.emplace(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  {
    py::gil_scoped_release release;
    static thread_local std::vector<float> a_rows, product;  // grown, never cleared (every element written first)
    float* a = Grow(a_rows, m * k);
    RmsPrologue pro;
    pro.x = x.data();
    pro.skip = skip ? skip->data() : nullptr;
    pro.norm_bias = norm_bias ? norm_bias->data() : nullptr;
    pro.M = m;
    pro.K = k;
    pro.eps = eps;
    pro.sdot = reinterpret_cast<Sdot64>(sdot);
    pro.a = a;
    pro.sum = sum ? sum->mutable_data() : nullptr;
    RunRmsPrologue(pro, threads);
    float* c = swiglu ? Grow(product, m * n) : y.mutable_data();
    const PackedSgemmArgs g{a, m, k, k, packed.data(), n, c, n, bias ? bias->data() : nullptr, false};
    PackedSgemm(g, threads, nullptr, nullptr);
    if (swiglu) SwiGlu(c, m, out_n, y.mutable_data(), threads);
  }
  if (sum) return py::make_tuple(std::move(y), std::move(*sum));
  return py::make_tuple(std::move(y));
}

// B [K, N] read with element strides (sk, sn) into pack_sgemm_b's panels: a runtime B in any layout (attention's
// K^T is a transposed view). Panels [p0, p1) only, so threads can pack a large B's panels side by side.
void PackStrided(const float* b, int64_t K, int64_t N, int64_t sk, int64_t sn, int64_t p0, int64_t p1, float* packed) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kSgemmPanel, w = std::min(kSgemmPanel, N - n0);
    float* dst = packed + p * K * kSgemmPanel;
    for (int64_t k = 0; k < K; ++k, dst += kSgemmPanel) {
      const float* src = b + k * sk + n0 * sn;
      if (sn == 1) {
        std::copy(src, src + w, dst);
      } else {
        for (int64_t j = 0; j < w; ++j) dst[j] = src[j * sn];
      }
      std::fill(dst + w, dst + kSgemmPanel, 0.0f);
    }
  }
}

// a [..., M, K] @ b [..., K, N] of two runtime float32 operands with the same batch dims, on the packed GEMM: each
// batch's B packed (any layout; a large B's panels on the threads side by side), A read in place where its rows are
// unit-stride (else a C-contiguous copy); + bias, ReLU as float_matmul_packed's. The packed GEMM's fixed order: the
// same bits at any thread count, not numpy's. out: as float_matmul_packed's.
py::array FloatMatmulBatchedPy(const py::array& a_in, const py::array& b_in, int threads, const py::object& out,
                               const py::object& bias_in, bool relu) {
  const char* op = "float_matmul_batched";
  const std::optional<F32> bias = AsOptionalArray<float>(bias_in, op, "bias");
  if (!py::isinstance<py::array_t<float>>(a_in) || !py::isinstance<py::array_t<float>>(b_in) || a_in.ndim() < 2 ||
      b_in.ndim() != a_in.ndim())
    throw std::invalid_argument(std::string(op) + ": a and b must be float32 arrays of one rank >= 2");
  const py::ssize_t r = a_in.ndim();
  const auto whole_floats = [r](const py::array& x) {
    for (py::ssize_t d = 0; d < r; ++d)
      if (x.strides(d) % static_cast<py::ssize_t>(sizeof(float)) != 0) return false;
    return true;
  };
  py::array a = a_in, b = b_in;
  if (a.strides(r - 1) != static_cast<py::ssize_t>(sizeof(float)) || !whole_floats(a))
    a = py::array::ensure(a_in, py::array::c_style);
  if (!whole_floats(b)) b = py::array::ensure(b_in, py::array::c_style);
  const int64_t M = a.shape(r - 2), K = a.shape(r - 1), N = b.shape(r - 1);
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + r);
  shape.back() = N;
  bool same = b.shape(r - 2) == K;
  int64_t batches = 1;
  for (py::ssize_t d = 0; d + 2 < r; ++d) {
    same = same && a.shape(d) == b.shape(d);
    batches *= a.shape(d);
  }
  if (!same) throw std::invalid_argument(std::string(op) + ": a [..., M, K] and b [..., K, N] must share K and batch");
  if (bias && bias->size() != N)
    throw std::invalid_argument(std::string(op) + ": bias has " + std::to_string(bias->size()) + " values for " +
                                std::to_string(N) + " output columns");
  py::array y = Fits(out, py::dtype::of<float>(), shape) ? py::reinterpret_borrow<py::array>(out) : F32(shape);
  const auto fs = static_cast<py::ssize_t>(sizeof(float));
  const int64_t lda = a.strides(r - 2) / fs, sk = b.strides(r - 2) / fs, sn = b.strides(r - 1) / fs;
  std::vector<int64_t> a_off(batches), b_off(batches);  // each batch's first element, in floats
  for (int64_t i = 0; i < batches; ++i) {
    int64_t rest = i, ao = 0, bo = 0;
    for (py::ssize_t d = r - 3; d >= 0; --d) {
      const int64_t idx = rest % a.shape(d);
      rest /= a.shape(d);
      ao += idx * a.strides(d) / fs;
      bo += idx * b.strides(d) / fs;
    }
    a_off[i] = ao;
    b_off[i] = bo;
  }
  const auto* ad = static_cast<const float*>(a.data());
  const auto* bd = static_cast<const float*>(b.data());
  auto* yd = static_cast<float*>(y.mutable_data());
  if (M == 0 || N == 0) return y;
  {
    py::gil_scoped_release release;
    static thread_local std::vector<float> panels;  // one batch's packed B (grown, every element written first)
    const int64_t n_panels = (N + kSgemmPanel - 1) / kSgemmPanel;
    float* packed = Grow(panels, n_panels * kSgemmPanel * K);
    // packing moves K * N floats against the product's M * N * K multiply-adds: threads only for a large B
    const int pack_threads = ThreadsFor(threads, K * N * 16);
    for (int64_t i = 0; i < batches; ++i) {
      const float* bi = bd + b_off[i];
      if (pack_threads > 1) {
        ParallelFor(pack_threads, pack_threads, [&](int64_t t) {
          const int64_t per = (n_panels + pack_threads - 1) / pack_threads;
          PackStrided(bi, K, N, sk, sn, std::min(n_panels, t * per), std::min(n_panels, (t + 1) * per), packed);
        });
      } else {
        PackStrided(bi, K, N, sk, sn, 0, n_panels, packed);
      }
      const PackedSgemmArgs g{ad + a_off[i], M, K, lda, packed, N, yd + i * M * N, N, bias ? bias->data() : nullptr,
                              relu};
      PackedSgemm(g, threads, nullptr, nullptr);
    }
  }
  return y;
}

// The panels start on a 64-byte line (numpy aligns to 16 bytes), so no load of B splits a cache line: 5% of a
// 128x1024x1024 product's time in a standalone harness.
py::array PackSgemmBPy(const F32& b) {
  if (b.ndim() != 2) throw std::invalid_argument("pack_sgemm_b: b must be a 2-D [K, N] float32 array");
  const int64_t K = b.shape(0), N = b.shape(1), panels = (N + kSgemmPanel - 1) / kSgemmPanel;
  F32 raw(panels * K * kSgemmPanel + 16);
  const auto addr = reinterpret_cast<uintptr_t>(raw.data());
  float* packed = raw.mutable_data() + (64 - addr % 64) % 64 / sizeof(float);
  {
    py::gil_scoped_release release;
    PackSgemmB(b.data(), K, N, packed);
  }
  return F32({panels, K, kSgemmPanel}, packed, raw);  // a view that keeps raw alive
}

}  // namespace

void BindFloatMatmul(py::module_& m) {
  m.def("float_matmul", &FloatMatmulPy, py::arg("matmul"), py::arg("a"), py::arg("b"), py::arg("bias") = py::none(),
        py::arg("relu") = false, py::arg("quantize") = py::none(), py::arg("threads") = 1,
        "matmul(a, b) (numpy's matmul: the product's bits are numpy's), then in place + bias (one float32 per "
        "output column), ReLU as np.maximum(y, 0), and with quantize = (scale, zero point, signed) a per-tensor "
        "int8/uint8 QuantizeLinear (a new array)");
  m.def("float_matmul_packed", &FloatMatmulPackedPy, py::arg("a"), py::arg("packed"), py::arg("n"),
        py::arg("plan") = py::none(), py::arg("count_dma") = false, py::arg("bias") = py::none(),
        py::arg("relu") = false, py::arg("quantize") = py::none(), py::arg("threads") = 1, py::arg("out") = py::none(),
        py::arg("swiglu") = false,
        "a [..., K] @ B [K, n] from pack_sgemm_b's panels on our own GEMM (a fixed summation order, not numpy's), "
        "+ bias, ReLU and quantize as float_matmul's; plan, count_dma: as int8_matmul's; swiglu: g * sigmoid(g) * u "
        "of the two column halves (n / 2 columns out)");
  m.def("norm_matmul_float", &NormMatmulFloatPy, py::arg("x"), py::arg("skip"), py::arg("packed"), py::arg("n"),
        py::arg("norm_bias"), py::arg("epsilon"), py::arg("want_sum"), py::arg("bias"), py::arg("swiglu"),
        py::arg("sdot") = 0, py::arg("threads") = 1,
        "a float32 npu::NormMatMul: RMS-norm rows of x (+ skip (+ norm_bias)), gamma folded into B, times "
        "pack_sgemm_b's panels + bias, then SwiGLU of the two halves if swiglu; (y,) or (y, the Skip* sum)");
  m.def("float_matmul_batched", &FloatMatmulBatchedPy, py::arg("a"), py::arg("b"), py::arg("threads") = 1,
        py::arg("out") = py::none(), py::arg("bias") = py::none(), py::arg("relu") = false,
        "a [..., M, K] @ b [..., K, N] (float32, the same batch dims, any layout) on our own GEMM, each batch's B "
        "packed on the call (a fixed summation order, not numpy's), + bias and ReLU as float_matmul_packed's; out: "
        "an array to write the result into when it is C-contiguous float32 of the result's shape");
  m.def("pack_sgemm_b", &PackSgemmBPy, py::arg("b"),
        "a constant B [K, N] as float_matmul_packed's column panels (a new [N / 32 rounded up, K, 32] float32 array)");
}

}  // namespace npu_ep::kern
