#pragma once

// Array arguments of bindings that take them as objects (a bound step passes arrays that need no conversion).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace npu_ep::kern {
// `o` as a C-order array of T, for a binding that takes its arrays as objects: `o` itself when it is one, so a
// bound step's call makes no numpy conversion call (pybind11's array_t caster makes one per argument and call even
// for such an array, ~0.1 us each), else numpy's conversion as that caster makes it; a TypeError naming `op` and
// `what` when there is none.
template <typename T>
pybind11::array_t<T, pybind11::array::c_style> AsArray(pybind11::handle o, const char* op, const char* what) {
  using A = pybind11::array_t<T, pybind11::array::c_style>;
  if (A::check_(o)) return pybind11::reinterpret_borrow<A>(o);
  A a = A::ensure(o);
  if (!a)
    throw pybind11::type_error(std::string(op) + ": " + what + " must be an array of " +
                               pybind11::str(pybind11::dtype::of<T>()).cast<std::string>());
  return a;
}

// A null array handle, to be assigned in branches: py::array's default constructor has numpy allocate an empty
// float64 array (~1.2k instructions a call).
inline pybind11::array NullArray() { return pybind11::reinterpret_steal<pybind11::array>(pybind11::handle()); }

// AsArray of an optional argument: None is nullopt.
template <typename T>
std::optional<pybind11::array_t<T, pybind11::array::c_style>> AsOptionalArray(pybind11::handle o, const char* op,
                                                                              const char* what) {
  if (o.is_none()) return std::nullopt;
  return AsArray<T>(o, op, what);
}
}  // namespace npu_ep::kern
