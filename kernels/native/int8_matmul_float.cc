// com.microsoft::MatMulIntegerToFloat (kernels/ops/matmul_int.py is the reference): the int8 GEMM's exact int32
// sums (int8_gemm.cc), then per element float32(acc) * (a_scale * b_scale[n]), + bias[n], + a fused epilogue's
// bias[n], ReLU - each a float32 operation of its own, in the reference's order (no multiply-add: fp-contract off).
// The sums are written into the output buffer itself and converted in place, row by row, so no int32 copy is made.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "int8_gemm.h"
#include "thread_pool.h"

// The multiply and each add round on their own (no multiply-add), as numpy's; GCC: O3, so the passes vectorize.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

template <typename T>
using CArr = py::array_t<T, py::array::c_style>;

constexpr int64_t kRowsPerTask = 16;

template <typename T>
const T* Sized(const CArr<T>& a, int64_t n, const char* op, const char* what) {
  if (a.size() != n)
    throw std::invalid_argument(std::string(op) + ": " + what + " has " + std::to_string(a.size()) +
                                " elements, expected " + std::to_string(n));
  return a.data();
}

// A's zero point: an int, or one 8-bit or int32 value (DynamicQuantizeLinear's, at run time).
int32_t ZeroPoint(const py::object& z) {
  if (!py::isinstance<py::array>(z)) return z.cast<int32_t>();
  auto a = py::reinterpret_borrow<py::array>(z);
  if (a.size() != 1) throw std::invalid_argument("int8_matmul_float: a_zero_point must be one value");
  const int num = a.dtype().num();
  if (num == py::dtype::of<uint8_t>().num()) return *static_cast<const uint8_t*>(a.data());
  if (num == py::dtype::of<int8_t>().num()) return *static_cast<const int8_t*>(a.data());
  if (num == py::dtype::of<int32_t>().num()) return *static_cast<const int32_t*>(a.data());
  throw std::invalid_argument("int8_matmul_float: a_zero_point must be uint8, int8 or int32, got " +
                              std::string(py::str(a.dtype())));
}

const float* Values(const std::optional<CArr<float>>& v, int64_t n, const char* what) {
  if (!v) return nullptr;
  if (v->size() != n)
    throw std::invalid_argument(std::string("int8_matmul_float: ") + what + " must hold " + std::to_string(n) +
                                " values, got " + std::to_string(v->size()));
  return v->data();
}

// One row of sums, converted in place: y = float(acc) * mult[n] (+ bias[n]) (+ bias2[n]), then max(y, 0) (NaN kept).
// The sums are copied out first (acc: a row of scratch), so each pass is a plain loop over one type that vectorizes.
void ConvertRow(void* row, int64_t n_cols, const float* mult, const float* bias, const float* bias2, bool relu,
                int32_t* acc) {
  std::memcpy(acc, row, static_cast<size_t>(n_cols) * 4);
  float* y = static_cast<float*>(row);
  for (int64_t c = 0; c < n_cols; ++c) y[c] = static_cast<float>(acc[c]) * mult[c];
  if (bias)
    for (int64_t c = 0; c < n_cols; ++c) y[c] = y[c] + bias[c];
  if (bias2)
    for (int64_t c = 0; c < n_cols; ++c) y[c] = y[c] + bias2[c];
  if (relu)
    for (int64_t c = 0; c < n_cols; ++c) y[c] = y[c] < 0.0f ? 0.0f : y[c];
}

py::array Int8MatMulFloatPy(const py::array& a, const py::object& a_zero_point, const CArr<int8_t>& bp,
                            const CArr<int32_t>& bsum, const CArr<int32_t>& bzp, int64_t K, int64_t N,
                            const CArr<float>& a_scale, const CArr<float>& b_scale,
                            const std::optional<CArr<float>>& bias, const std::optional<CArr<float>>& bias2, bool relu,
                            int threads, const py::object& out) {
  const bool a_signed = py::isinstance<py::array_t<int8_t>>(a);
  if (!a_signed && !py::isinstance<py::array_t<uint8_t>>(a))
    throw std::invalid_argument("int8_matmul_float: A must be uint8 or int8");
  if (a.ndim() != 2 || a.shape(1) != K || !(a.flags() & py::array::c_style))
    throw std::invalid_argument("int8_matmul_float: A must be C-contiguous [M, K=" + std::to_string(K) + "]");
  const int64_t kp = (K + 63) / 64 * 64, M = a.shape(0);
  if (bp.ndim() != 4 || bp.shape(1) != kp / 4 || bp.shape(2) != 16 || bp.shape(3) != 4 || N > bp.shape(0) * 16)
    throw std::invalid_argument("int8_matmul_float: packed B must be [np/16, kp/4, 16, 4] with kp = " +
                                std::to_string(kp) + " and np >= N = " + std::to_string(N));
  const int64_t np16 = bp.shape(0) * 16;
  if (bsum.size() != np16 || bzp.size() != np16)
    throw std::invalid_argument("int8_matmul_float: bsum and b_zero_point must hold " + std::to_string(np16) +
                                " values");
  if (a_scale.size() != 1 || (b_scale.size() != 1 && b_scale.size() != N))
    throw std::invalid_argument("int8_matmul_float: a_scale must be one value and b_scale one or N = " +
                                std::to_string(N));
  const float* pb = Values(bias, N, "bias");
  const float* pb2 = Values(bias2, N, "bias2");
  // out (checked float32 first), or a new array: a default py::array would be a new empty numpy array per call
  if (!out.is_none() && !py::isinstance<py::array_t<float>>(out))
    throw std::invalid_argument("int8_matmul_float: out must be float32");
  py::array y =
      out.is_none() ? py::array_t<float>(std::vector<py::ssize_t>{M, N}) : py::reinterpret_borrow<py::array>(out);
  if (!out.is_none()) {
    if (y.size() != M * N || !(y.flags() & py::array::c_style) || !y.writeable())
      throw std::invalid_argument("int8_matmul_float: out must be a writable C-order array of " +
                                  std::to_string(M * N) + " float32");
  }
  std::vector<float> mult(static_cast<size_t>(N));
  const float as = a_scale.data()[0];
  for (int64_t c = 0; c < N; ++c) mult[c] = as * b_scale.data()[b_scale.size() == 1 ? 0 : c];
  const int32_t azp = ZeroPoint(a_zero_point);
  Int8Gemm g;
  g.M = M;
  g.K = K;
  g.N = N;
  g.kp = kp;
  g.a = static_cast<const uint8_t*>(a.data());
  g.a_signed = a_signed;
  g.azp = &azp;
  g.bp = bp.data();
  g.bsum = bsum.data();
  g.bzp = bzp.data();
  g.threads = threads;
  g.acc = static_cast<int32_t*>(y.mutable_data());  // the sums in the output's own bytes, converted below
  if (M == 0 || N == 0) return y;
  {
    py::gil_scoped_release release;
    Int8MatMul(g);
    auto* rows = static_cast<unsigned char*>(y.mutable_data());
    const int64_t tasks = (M + kRowsPerTask - 1) / kRowsPerTask;
    ParallelFor(ThreadsFor(threads, M * N), tasks, [&](int64_t t) {
      std::vector<int32_t> acc(static_cast<size_t>(N));
      for (int64_t r = t * kRowsPerTask; r < std::min(M, (t + 1) * kRowsPerTask); ++r)
        ConvertRow(rows + 4 * r * N, N, mult.data(), pb, pb2, relu, acc.data());
    });
  }
  return y;
}

// The binding takes its arrays as objects and borrows them (AsArray): no numpy conversion call per array and call.
py::array Int8MatMulFloatEntry(const py::object& a, const py::object& a_zero_point, const py::object& bp,
                               const py::object& bsum, const py::object& bzp, int64_t K, int64_t N,
                               const py::object& a_scale, const py::object& b_scale, const py::object& bias,
                               const py::object& bias2, bool relu, int threads, const py::object& out) {
  const char* op = "int8_matmul_float";
  if (!py::isinstance<py::array>(a)) throw py::type_error("int8_matmul_float: A must be an array");
  return Int8MatMulFloatPy(py::reinterpret_borrow<py::array>(a), a_zero_point, AsArray<int8_t>(bp, op, "bp"),
                           AsArray<int32_t>(bsum, op, "bsum"), AsArray<int32_t>(bzp, op, "b_zero_point"), K, N,
                           AsArray<float>(a_scale, op, "a_scale"), AsArray<float>(b_scale, op, "b_scale"),
                           AsOptionalArray<float>(bias, op, "bias"), AsOptionalArray<float>(bias2, op, "bias2"), relu,
                           threads, out);
}

}  // namespace

void BindInt8MatMulFloat(py::module_& m) {
  m.def("int8_matmul_float", &Int8MatMulFloatEntry, py::arg("a"), py::arg("a_zero_point"), py::arg("bp"),
        py::arg("bsum"), py::arg("b_zero_point"), py::arg("K"), py::arg("N"), py::arg("a_scale"), py::arg("b_scale"),
        py::arg("bias"), py::arg("bias2"), py::arg("relu"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "MatMulIntegerToFloat: float32(exact (A - azp) @ (B - bzp)) * (a_scale * b_scale[n]) (+ bias[n]) "
        "(+ bias2[n]) then ReLU if relu, each a float32 operation; B packed by matmul_int.pack_b; a_zero_point an "
        "int or one value; into out (ORT's buffer) or a new [M, N] array");
}

}  // namespace npu_ep::kern
