// Shared pieces of the data-movement kernels (movement.cc, transpose.cc, pad.cc, trilu.cc): they move elements of
// 1, 2, 4 or 8 bytes without reading their values, so one kernel serves every dtype of that size, and they write
// into ORT's own output buffer when the step is given one.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "small_dims.h"

namespace npu_ep::kern {

inline std::string DimsText(const int64_t* dims, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

inline std::string DimsText(const std::vector<int64_t>& dims) { return DimsText(dims.data(), dims.size()); }
inline std::string DimsText(const SmallDims& dims) { return DimsText(dims.data(), dims.size()); }

inline std::vector<int64_t> DimsOf(const pybind11::array& a) { return {a.shape(), a.shape() + a.ndim()}; }
inline SmallDims SmallDimsOf(const pybind11::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

// x itself when it is a C-order ndarray (no call into numpy: a bound step's input usually is), else numpy's C-order
// copy of it (pybind11's array::ensure).
inline pybind11::array CArray(const pybind11::object& x_in) {
  auto& api = pybind11::detail::npy_api::get();
  if (Py_TYPE(x_in.ptr()) == api.PyArray_Type_ &&
      (pybind11::detail::array_proxy(x_in.ptr())->flags & pybind11::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
    return pybind11::reinterpret_borrow<pybind11::array>(x_in);
  auto x = pybind11::array::ensure(x_in, pybind11::array::c_style);
  if (!x) throw pybind11::error_already_set();
  return x;
}

// A sequence of integers (a tuple or list of Python ints: a bound step's fixed argument) as int64s, read without
// pybind11's list caster; anything else through it. Out: std::vector<int64_t> or SmallDims (no allocation).
template <typename Out = std::vector<int64_t>>
Out IntsOf(const pybind11::handle& seq) {
  auto cast = [&] {
    const auto v = seq.cast<std::vector<int64_t>>();
    return Out(v.begin(), v.end());
  };
  if (!PyTuple_Check(seq.ptr()) && !PyList_Check(seq.ptr())) return cast();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  Out out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyLong_Check(items[i])) return cast();  // numpy integers: the caster's rules
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) throw pybind11::error_already_set();
    out[static_cast<size_t>(i)] = static_cast<int64_t>(v);
  }
  return out;
}

// x as a C-order array whose element size a movement kernel moves (a strided x is copied first, as numpy reads it).
inline pybind11::array MovableInput(const char* fn, const pybind11::object& x_in) {
  pybind11::array x = CArray(x_in);
  const auto item = x.itemsize();
  if (x.dtype().kind() == 'O' || (item != 1 && item != 2 && item != 4 && item != 8))
    throw std::invalid_argument(std::string(fn) + ": dtype " + std::string(pybind11::str(x.dtype())) +
                                " is not a plain dtype of 1, 2, 4 or 8 bytes");
  return x;
}

// The result: `out` when given (ORT's buffer: a writeable C-order array of `dtype` and `dims`' element count),
// else a new array of `dims`.
inline pybind11::array MovementResult(const char* fn, const pybind11::dtype& dtype, const int64_t* dims, size_t rank,
                                      const pybind11::object& out) {
  if (out.is_none()) return pybind11::array(dtype, std::vector<pybind11::ssize_t>(dims, dims + rank));
  int64_t total = 1;
  for (size_t i = 0; i < rank; ++i) total *= dims[i];
  if (pybind11::isinstance<pybind11::array>(out)) {
    auto y = pybind11::reinterpret_borrow<pybind11::array>(out);
    if (y.dtype().equal(dtype) && (y.flags() & pybind11::array::c_style) && y.writeable() && y.size() == total)
      return y;
  }
  throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " +
                              std::string(pybind11::str(dtype)) + " array of " + std::to_string(total) +
                              " elements (shape " + DimsText(dims, rank) + ")");
}

inline pybind11::array MovementResult(const char* fn, const pybind11::dtype& dtype, const std::vector<int64_t>& dims,
                                      const pybind11::object& out) {
  return MovementResult(fn, dtype, dims.data(), dims.size(), out);
}

constexpr size_t kReleaseGilBytes = size_t{1} << 16;  // below this the GIL round trip costs more than the copy

// Runs f(), with the GIL released when it moves at least kReleaseGilBytes (any kernel whose work grows with its
// bytes: below that a release and re-acquire per call costs more than the other threads gain).
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
