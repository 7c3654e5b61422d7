// Shared pieces of the data-movement kernels (movement.cc, transpose.cc, pad.cc, trilu.cc): they move elements of
// 1, 2, 4 or 8 bytes without reading their values, so one kernel serves every dtype of that size, and they write
// into ORT's own output buffer when the step is given one.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace npu_ep::kern {

inline std::string DimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

inline std::vector<int64_t> DimsOf(const pybind11::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

// x as a C-order array whose element size a movement kernel moves (a strided x is copied first, as numpy reads it).
inline pybind11::array MovableInput(const char* fn, const pybind11::object& x_in) {
  auto x = pybind11::array::ensure(x_in, pybind11::array::c_style);
  if (!x) throw pybind11::error_already_set();
  const auto item = x.itemsize();
  if (x.dtype().kind() == 'O' || (item != 1 && item != 2 && item != 4 && item != 8))
    throw std::invalid_argument(std::string(fn) + ": dtype " + std::string(pybind11::str(x.dtype())) +
                                " is not a plain dtype of 1, 2, 4 or 8 bytes");
  return x;
}

// The result: `out` when given (ORT's buffer: a writeable C-order array of `dtype` and `dims`' element count),
// else a new array of `dims`.
inline pybind11::array MovementResult(const char* fn, const pybind11::dtype& dtype, const std::vector<int64_t>& dims,
                                      const pybind11::object& out) {
  std::vector<pybind11::ssize_t> shape(dims.begin(), dims.end());
  if (out.is_none()) return pybind11::array(dtype, shape);
  int64_t total = 1;
  for (const int64_t d : dims) total *= d;
  pybind11::array y;
  if (pybind11::isinstance<pybind11::array>(out)) y = pybind11::reinterpret_borrow<pybind11::array>(out);
  if (!y || !y.dtype().equal(dtype) || !(y.flags() & pybind11::array::c_style) || !y.writeable() || y.size() != total)
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " +
                                std::string(pybind11::str(dtype)) + " array of " + std::to_string(total) +
                                " elements (shape " + DimsText(dims) + ")");
  return y;
}

constexpr size_t kReleaseGilBytes = size_t{1} << 16;  // below this the GIL round trip costs more than the copy

// Runs f(), with the GIL released when it moves at least kReleaseGilBytes.
template <typename F>
void RunMoving(size_t bytes, const F& f) {
  if (bytes >= kReleaseGilBytes) {
    pybind11::gil_scoped_release release;
    f();
  } else {
    f();
  }
}

// Calls f(T{}) with T the unsigned integer of `itemsize` bytes (1, 2, 4 or 8).
template <typename F>
void ForItemSize(size_t itemsize, const F& f) {
  switch (itemsize) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f(uint64_t{}); break;
  }
}

}  // namespace npu_ep::kern
