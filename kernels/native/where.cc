// Where(condition, x, y) with ONNX (numpy) broadcasting (`kernels.where_select`), for kernels/ops/elementwise.py:
// each output element is x's or y's element, bits copied (any dtype of 1, 2, 4 or 8 bytes), chosen by a nonzero
// condition byte, as numpy's where. Runs are broadcast.h's; both values are loaded before the choice, so the loops
// vectorize to blends.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the select loops vectorize
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "broadcast.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 32768;  // output elements per parallel task

// out[i] = c[i] ? x[i] : y[i] for i < n, where C/X/Y say the operand is contiguous (else one repeated element).
template <typename T, bool C, bool X, bool Y>
void SelectRow(const uint8_t* c, const T* x, const T* y, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T a = x[X ? i : 0], b = y[Y ? i : 0];
    out[i] = c[C ? i : 0] ? a : b;
  }
}

template <typename T>
using SelectFn = void (*)(const uint8_t*, const T*, const T*, T*, int64_t);

template <typename T>
SelectFn<T> SelectFor(bool c, bool x, bool y) {
  static constexpr SelectFn<T> kRows[8] = {SelectRow<T, false, false, false>, SelectRow<T, false, false, true>,
                                           SelectRow<T, false, true, false>,  SelectRow<T, false, true, true>,
                                           SelectRow<T, true, false, false>,  SelectRow<T, true, false, true>,
                                           SelectRow<T, true, true, false>,   SelectRow<T, true, true, true>};
  return kRows[(c ? 4 : 0) + (x ? 2 : 0) + (y ? 1 : 0)];
}

template <typename T>
void Select(const Broadcast<3>& p, const py::array& cond, const py::array& x, const py::array& y, py::array& out,
            int threads) {
  const auto* pc = static_cast<const uint8_t*>(cond.data());
  const auto* px = static_cast<const T*>(x.data());
  const auto* py_ = static_cast<const T*>(y.data());
  auto* po = static_cast<T*>(out.mutable_data());
  ParallelRuns(p, threads, kTaskElems,
               [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& unit, int64_t at, int64_t len) {
                 SelectFor<T>(unit[0], unit[1], unit[2])(pc + off[0], px + off[1], py_ + off[2], po + at, len);
               });
}

py::array WherePy(const py::array& cond, const py::array& x, const py::array& y, const py::object& out, int threads) {
  const bool c_order =
      (cond.flags() & py::array::c_style) && (x.flags() & py::array::c_style) && (y.flags() & py::array::c_style);
  const int64_t size = x.itemsize();
  if (!c_order || !cond.dtype().equal(py::dtype::of<bool>()) || !x.dtype().equal(y.dtype()) ||
      x.dtype().kind() == 'O' || (size != 1 && size != 2 && size != 4 && size != 8))
    throw std::invalid_argument(
        "where_select: condition must be a C-order bool array and x, y C-order arrays of one "
        "dtype of 1, 2, 4 or 8 bytes, got " +
        std::string(py::str(cond.dtype())) + ShapeText(cond) + ", " + std::string(py::str(x.dtype())) + ShapeText(x) +
        ", " + std::string(py::str(y.dtype())) + ShapeText(y));
  const Broadcast<3> p = PlanBroadcast<3>("where_select", {&cond, &x, &y});
  py::array result = BroadcastResult("where_select", x.dtype(), p, out);
  if (p.total == 0) return result;
  switch (size) {
    case 1: Select<uint8_t>(p, cond, x, y, result, threads); break;
    case 2: Select<uint16_t>(p, cond, x, y, result, threads); break;
    case 4: Select<uint32_t>(p, cond, x, y, result, threads); break;
    default: Select<uint64_t>(p, cond, x, y, result, threads); break;
  }
  return result;
}

}  // namespace

void BindWhere(py::module_& m) {
  m.def("where_select", &WherePy, py::arg("condition"), py::arg("x"), py::arg("y"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "numpy's where(condition, x, y) with broadcasting: x's element where the condition byte is nonzero, else "
        "y's, bits copied; C-order inputs, x and y of one dtype of 1, 2, 4 or 8 bytes; into out (ORT's buffer) or a "
        "new array");
}

}  // namespace npu_ep::kern
