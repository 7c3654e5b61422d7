// A numpy ufunc's own float32 -> float32 inner loop run on contiguous chunks over the threads
// (`kernels.ufunc_split`): the reference of float32 Exp/Tanh/Sin/Cos is numpy's SIMD loop, one call on one
// thread; the same loop on chunks gives its bits (each element is computed alone) split over the threads. The loop
// is read from the ufunc object (PyUFuncObject's types/functions/data: numpy's C headers, no import of its API).
// Float16 x: each block widened to float32 (exact), the float32 loop, rounded once to float16 (nearest even, as
// numpy's astype): the reference's widen / numpy's float32 op / store, so its bits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/ndarraytypes.h>
#include <numpy/ufuncobject.h>

#include "half.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 16384;  // elements per parallel task at most (64 KB in, 64 KB out)
constexpr int64_t kHalfBlock = 1024;   // float16 elements widened per loop call (4 KB of float32 each way)

// The ufunc's float32 -> float32 loop and its data, or throws: a one-input one-output ufunc with an "f->f" loop.
std::pair<PyUFuncGenericFunction, void*> FloatLoop(const py::object& ufunc) {
  PyObject* o = ufunc.ptr();
  if (std::strcmp(Py_TYPE(o)->tp_name, "numpy.ufunc") != 0)
    throw std::invalid_argument("ufunc_split: a numpy ufunc expected, got " + std::string(Py_TYPE(o)->tp_name));
  const auto* u = reinterpret_cast<const PyUFuncObject*>(o);
  if (u->nin == 1 && u->nout == 1 && u->functions && u->types) {
    for (int i = 0; i < u->ntypes; ++i) {
      if (u->types[2 * i] == NPY_FLOAT && u->types[2 * i + 1] == NPY_FLOAT && u->functions[i])
        return {u->functions[i], u->data ? u->data[i] : nullptr};
    }
  }
  throw std::invalid_argument("ufunc_split: " + std::string(py::str(py::getattr(ufunc, "__name__", py::str("?")))) +
                              " has no float32 -> float32 loop");
}

py::array UfuncSplitPy(const py::object& ufunc, const py::array& x, const py::object& out, int threads) {
  const std::pair<PyUFuncGenericFunction, void*> found = FloatLoop(ufunc);
  const PyUFuncGenericFunction loop = found.first;
  void* const data = found.second;
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!(half || x.dtype().equal(py::dtype::of<float>())) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("ufunc_split: x must be a C-order float32 or float16 array, got " +
                                std::string(py::str(x.dtype())));
  const std::vector<int64_t> dims(x.shape(), x.shape() + x.ndim());
  py::array y = MovementResult("ufunc_split", x.dtype(), dims, out);
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  const int64_t n = x.size(), size = x.itemsize();
  if (n == 0) return y;
  const npy_intp steps[2] = {4, 4};
  RunMoving(static_cast<size_t>(n * size), [&] {
    ForEvenChunks(threads, n, kTaskElems, [&](int64_t begin, int64_t end) {
      if (!half) {
        char* args[2] = {const_cast<char*>(src) + begin * 4, dst + begin * 4};
        const npy_intp dim = static_cast<npy_intp>(end - begin);
        loop(args, &dim, steps, data);
        return;
      }
      float wide[kHalfBlock], res[kHalfBlock];
      char* args[2] = {reinterpret_cast<char*>(wide), reinterpret_cast<char*>(res)};
      for (int64_t i = begin; i < end; i += kHalfBlock) {
        const int64_t len = std::min(kHalfBlock, end - i);
        HalfToFloatRow(reinterpret_cast<const uint16_t*>(src) + i, wide, len);
        const npy_intp dim = static_cast<npy_intp>(len);
        loop(args, &dim, steps, data);
        FloatToHalfRow(res, reinterpret_cast<uint16_t*>(dst) + i, len);
      }
    });
  });
  return y;
}

}  // namespace

void BindExpTanh(py::module_& m);  // exp_tanh.cc

void BindUfuncSplit(py::module_& m) {
  BindExpTanh(m);
  m.def("ufunc_split", &UfuncSplitPy, py::arg("ufunc"), py::arg("x"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "a one-input numpy ufunc's own float32 loop (np.exp, np.tanh, ...) on a C-order float32 array, or on float16 "
        "widened and rounded once, in chunks over the threads (numpy's bits), into out (ORT's buffer) or a new array "
        "of x's shape and dtype");
}

}  // namespace npu_ep::kern
