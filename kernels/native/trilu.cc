// Trilu (`kernels.trilu`) for kernels/ops/generate.py: numpy's triu(x, k) (upper) or tril(x, k) over the last two
// axes, into ORT's buffer when given. Each matrix row is one memcpy of the kept columns and one memset of the
// others: a zero of every dtype (0, +0.0, False) is all zero bits, so one kernel serves every dtype.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskBytes = int64_t{1} << 17;  // bytes a parallel task writes, at least

// Rows [r0, r1) of the stacked matrices (h rows of w elements of `item` bytes each).
void TriluRows(const char* src, char* dst, int64_t r0, int64_t r1, int64_t h, int64_t w, int64_t k, bool upper,
               size_t item) {
  const size_t row = static_cast<size_t>(w) * item;
  for (int64_t r = r0, i = r0 % h; r < r1; ++r, i = i + 1 == h ? 0 : i + 1) {  // i: the row within its matrix
    const char* s = src + r * static_cast<int64_t>(row);
    char* d = dst + r * static_cast<int64_t>(row);
    // upper keeps columns j >= i + k, lower keeps j <= i + k: the split column, clamped to the row
    const int64_t split = std::clamp(upper ? i + k : i + k + 1, int64_t{0}, w);
    const size_t head = static_cast<size_t>(split) * item;
    if (upper) {
      std::memset(d, 0, head);
      std::memcpy(d + head, s + head, row - head);
    } else {
      std::memcpy(d, s, head);
      std::memset(d + head, 0, row - head);
    }
  }
}

py::array TriluPy(const py::object& x_in, int64_t k, bool upper, const py::object& out, int threads) {
  const py::array x = MovableInput("trilu", x_in);
  if (x.ndim() < 2) throw std::invalid_argument("trilu: input of shape " + DimsText(DimsOf(x)) + " has rank < 2");
  py::array y = MovementResult("trilu", x.dtype(), DimsOf(x), out);
  const int64_t h = x.shape(x.ndim() - 2), w = x.shape(x.ndim() - 1);
  if (x.size() == 0) return y;
  k = std::clamp(k, -h - 1, w + 1);  // beyond these every row is whole or empty; i + k cannot overflow
  const int64_t rows = x.size() / w, row_bytes = w * x.itemsize();
  const int64_t per_task = std::max<int64_t>(1, kTaskBytes / row_bytes);
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  const auto item = static_cast<size_t>(x.itemsize());
  auto task = [&](int64_t t) {
    TriluRows(src, dst, t * per_task, std::min(rows, (t + 1) * per_task), h, w, k, upper, item);
  };
  auto run = [&] { ParallelFor(ThreadsFor(threads, x.size()), (rows + per_task - 1) / per_task, task); };
  RunMoving(static_cast<size_t>(x.nbytes()), run);
  return y;
}

}  // namespace

void BindTrilu(py::module_& m) {
  m.def("trilu", &TriluPy, py::arg("x"), py::arg("k") = 0, py::arg("upper") = true, py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "numpy's triu(x, k) (upper) or tril(x, k) over the last two axes as a C-order array, into out (ORT's "
        "buffer) or a new array; any dtype of 1, 2, 4 or 8 bytes");
}

}  // namespace npu_ep::kern
