// A large float32 product cut in two halves of B's columns (`kernels.sgemm_columns`), each half one call of the
// BLAS's single-threaded sgemm, the halves run through ParallelFor: inside a partition call on ORT's own intra-op
// threads, which keep their cores, where kernels/host_blas.py's helper thread sleeps between products and was
// often woken on the caller's core (PERF.md).
// The cut is the caller's (kernels/host_blas.py decides it from the shapes), so the bits do not depend on the
// thread count: the same two sgemm calls run either way.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "sgemm.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F32 = py::array_t<float, py::array::c_style>;

// out[M, N] = a[M, K] @ b[K, N]: columns [0, split) as one sgemm call and [split, N) as another.
py::array SgemmColumnsPy(const py::array& a_in, const py::array& b_in, int64_t split, uintptr_t sgemm_addr,
                         int threads) {
  if (!sgemm_addr) throw std::invalid_argument("sgemm_columns: no sgemm address");
  if (a_in.ndim() != 2 || b_in.ndim() != 2 || !py::isinstance<F32>(a_in) || !py::isinstance<F32>(b_in) ||
      !(a_in.flags() & py::array::c_style) || !(b_in.flags() & py::array::c_style))
    throw std::invalid_argument("sgemm_columns: a [M, K] and b [K, N] must be C-contiguous float32");
  const int64_t M = a_in.shape(0), K = a_in.shape(1), N = b_in.shape(1);
  if (b_in.shape(0) != K)
    throw std::invalid_argument("sgemm_columns: a is [" + std::to_string(M) + ", " + std::to_string(K) + "], b has " +
                                std::to_string(b_in.shape(0)) + " rows");
  if (split <= 0 || split >= N) throw std::invalid_argument("sgemm_columns: split must be inside (0, N)");
  const float* a = static_cast<const float*>(a_in.data());
  const float* b = static_cast<const float*>(b_in.data());
  F32 out({M, N});
  float* c = out.mutable_data();
  const auto sgemm = reinterpret_cast<Sgemm64>(sgemm_addr);
  {
    py::gil_scoped_release release;
    ParallelFor(threads, 2, [&](int64_t half) {
      const int64_t n0 = half == 0 ? 0 : split, n = half == 0 ? split : N - split;
      sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, M, n, K, 1.0f, a, K, b + n0, N, 0.0f, c + n0, N);
    });
  }
  return std::move(out);
}

}  // namespace

void BindSgemmColumns(py::module_& m) {
  m.def("sgemm_columns", &SgemmColumnsPy, py::arg("a"), py::arg("b"), py::arg("split"), py::arg("sgemm"),
        py::arg("threads") = 1,
        "a [M, K] @ b [K, N] (C-contiguous float32) as two sgemm calls (sgemm: a CBLAS sgemm's address, "
        "kernels.host_blas.sgemm_address()), columns [0, split) and [split, N), on up to `threads` threads");
}

}  // namespace npu_ep::kern
