// ConstantOfShape (`kernels.fill_value`) for kernels/ops/generate.py: the value attribute's one element, its bits
// repeated over the runtime shape (any dtype of 1, 2, 4 or 8 bytes; the reference's np.full gives the same bytes),
// into ORT's buffer when given one (a fresh array of a large output costs its page faults), threaded from 32 MB.
#if !defined(__clang__)     // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the fill loops vectorize
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "broadcast.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 1 << 16;            // elements per parallel task
constexpr int64_t kParallelBytes = int64_t{1} << 25;  // a fill is bound by memory: a second thread pays from 32 MB
constexpr int64_t kPatternBytes = 4096;               // a fill's first bytes by a loop, then copies of them

// m copies of v at y: the first kPatternBytes by a loop, the rest copies of them, so most of the run is stored by
// glibc's memcpy with the host's widest vectors (this file is built for the baseline ISA: 16-byte stores).
template <typename T>
void FillRun(T* y, T v, int64_t m) {
  const int64_t head = std::min<int64_t>(m, kPatternBytes / static_cast<int64_t>(sizeof(T)));
  std::fill_n(y, head, v);
  for (int64_t i = head; i < m; i += head)
    std::memcpy(y + i, y, static_cast<size_t>(std::min(head, m - i)) * sizeof(T));
}

template <typename T>
void FillAs(void* out, const void* value, int64_t n, int threads) {
  T v;
  std::memcpy(&v, value, sizeof v);
  auto* y = static_cast<T*>(out);
  const int use = n * static_cast<int64_t>(sizeof(T)) >= kParallelBytes ? threads : 1;
  ParallelFor(use, (n + kTaskElems - 1) / kTaskElems, [&](int64_t t) {
    const int64_t begin = t * kTaskElems;
    FillRun(y + begin, v, std::min(kTaskElems, n - begin));
  });
}

std::string DimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

py::array FillValuePy(const std::vector<int64_t>& shape, const py::array& value, const py::object& out, int threads) {
  const auto size = value.itemsize();
  if (value.size() != 1 || (size != 1 && size != 2 && size != 4 && size != 8) || value.dtype().kind() == 'O')
    throw std::invalid_argument("fill_value: value must be one element of a dtype of 1, 2, 4 or 8 bytes, got " +
                                std::string(py::str(value.dtype())) + ShapeText(value));
  int64_t n = 1;
  for (const int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("ConstantOfShape: negative dimension in " + DimsText(shape));
    n *= d;
  }
  // out, or null when it is not an array (a default py::array would be a new empty numpy array per call)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(value.dtype(), std::vector<py::ssize_t>(shape.begin(), shape.end()));
  } else {
    if (!y || !y.dtype().equal(value.dtype()) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != n)
      throw std::invalid_argument("fill_value: out must be a writeable C-order " + std::string(py::str(value.dtype())) +
                                  " array of " + std::to_string(n) + " elements");
  }
  if (n == 0) return y;
  const void* v = value.data();
  void* dst = y.mutable_data();
  py::gil_scoped_release release;
  switch (size) {
    case 1: std::memset(dst, *static_cast<const uint8_t*>(v), static_cast<size_t>(n)); break;
    case 2: FillAs<uint16_t>(dst, v, n, threads); break;
    case 4: FillAs<uint32_t>(dst, v, n, threads); break;
    default: FillAs<uint64_t>(dst, v, n, threads); break;
  }
  return y;
}

}  // namespace

void BindConstantOfShape(py::module_& m) {
  m.def("fill_value", &FillValuePy, py::arg("shape"), py::arg("value"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "ConstantOfShape: value's one element (a dtype of 1, 2, 4 or 8 bytes) repeated over shape, its bits copied, "
        "into out (ORT's buffer: a writeable C-order array of value's dtype and the shape's size) or a new array");
}

}  // namespace npu_ep::kern
