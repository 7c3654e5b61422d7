// A {gate, up} npu::MatMulGroup of MatMulNBits members with the SwiGLU epilogue (kernels/ops/matmul_group.py),
// called through BoundNBits.swiglu (bindings.cc): the members' int4 product (MatMulNBits, its bias add) in float32,
// then g * sigmoid(g) * u of its two halves (SwiGlu, as the float groups' and NormMatMul's), for a float32 A, or a
// float16 A widened exactly and the float32 result rounded once to float16 (as the reference's astype).
// `kernels.swiglu_halves`: the same SwiGLU of a float32 product made elsewhere (the kernel's DMA-counted run).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "half.h"
#include "matmul_nbits.h"
#include "norm_matmul.h"
#include "scratch.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

void SwiGluRounded(const float* product, int64_t M, int64_t out_n, bool half, void* y, int threads) {
  static thread_local std::vector<float> gated;  // grown, never cleared (every element written first)
  float* out = half ? Grow(gated, M * out_n) : static_cast<float*>(y);
  SwiGlu(product, M, out_n, out, threads);
  if (!half) return;
  auto* yh = static_cast<uint16_t*>(y);
  ParallelFor(ThreadsFor(threads, M * out_n), M,
              [&](int64_t m) { FloatToHalfRow(out + m * out_n, yh + m * out_n, out_n); });
}

// y [M, N] float32 (C-contiguous, N even) -> g * sigmoid(g) * u of its halves [M, N / 2], float32 or rounded once to
// float16.
py::array SwiGluHalvesPy(const py::array_t<float, py::array::c_style>& y, bool half, int threads) {
  if (y.ndim() != 2 || y.shape(1) % 2)
    throw std::invalid_argument("swiglu_halves: y must be float32 [M, N] with an even N");
  const int64_t M = y.shape(0), out_n = y.shape(1) / 2;
  py::array out(half ? py::dtype("float16") : py::dtype::of<float>(), std::vector<py::ssize_t>{M, out_n});
  const float* src = y.data();
  void* dst = out.mutable_data();
  if (M * out_n > 0) {
    py::gil_scoped_release release;
    SwiGluRounded(src, M, out_n, half, dst, threads);
  }
  return out;
}

}  // namespace

// g: the bound call for g.M rows (its a and y are set here); a: [M, K] float32, or float16 bits when half; y: [M, N /
// 2] of the same type.
void MatMulNBitsSwiGlu(const NBitsGemm& g, const void* a, bool half, void* y) {
  if (g.M == 0 || g.N == 0) return;
  // the calling thread's float copies (grown, never cleared: each call writes all it reads)
  static thread_local std::vector<float> a32, product;
  const int64_t out_n = g.N / 2;
  NBitsGemm f = g;
  if (half) {
    float* af = Grow(a32, g.M * g.K);
    const auto* ah = static_cast<const uint16_t*>(a);
    ParallelFor(ThreadsFor(g.threads, g.M * g.K), g.M,
                [&](int64_t m) { HalfToFloatRow(ah + m * g.K, af + m * g.K, g.K); });
    f.a = af;
  } else {
    f.a = static_cast<const float*>(a);
  }
  f.y = Grow(product, g.M * g.N);
  MatMulNBits(f);
  SwiGluRounded(f.y, g.M, out_n, half, y, g.threads);
}

void BindNBitsSwiGlu(py::module_& m) {
  m.def("swiglu_halves", &SwiGluHalvesPy, py::arg("y"), py::arg("half") = false, py::arg("threads") = 1,
        "g * sigmoid(g) * u of float32 y [M, N]'s halves [M, N / 2] (as BoundNBits.swiglu), float32 or rounded "
        "once to float16 (half)");
}

}  // namespace npu_ep::kern
