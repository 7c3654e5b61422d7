// Pad (`kernels.pad`) for kernels/ops/pad.py: ONNX Pad of x by per-axis (begin, end) pads in constant, reflect,
// edge or wrap mode, into ORT's buffer when given, for every dtype of 1, 2, 4 or 8 bytes (bits moved).
//
// A negative pad crops first and the crop is padded (what ORT does), so reflect/edge/wrap read the cropped data.
// The output is written axis by axis from the outermost: an axis' centre slabs recursively, then each of its pad
// slabs as one memcpy of the centre slab it mirrors (edge, reflect, wrap) or a fill of the value (constant); the
// innermost axis' pads are element copies. Unpadded leading axes are one axis, split over the threads.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "movement.h"
#include "row_copy.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

enum class Mode { kConstant, kReflect, kEdge, kWrap };

constexpr int64_t kTaskBytes = int64_t{1} << 17;  // bytes a parallel task writes, at least

Mode ModeOf(const std::string& mode) {
  if (mode == "constant") return Mode::kConstant;
  if (mode == "reflect") return Mode::kReflect;
  if (mode == "edge") return Mode::kEdge;
  if (mode == "wrap") return Mode::kWrap;
  throw std::invalid_argument("pad: mode '" + mode + "' unknown (constant, reflect, edge, wrap)");
}

// The centre index that output index j of an axis with `begin` pads and `n` centre elements copies (j outside the
// centre; not for constant mode).
int64_t SourceIndex(Mode mode, int64_t j, int64_t begin, int64_t n) {
  const int64_t t = j - begin;
  switch (mode) {
    case Mode::kEdge: return std::clamp(t, int64_t{0}, n - 1);
    case Mode::kReflect: return t < 0 ? -t : 2 * (n - 1) - t;
    default: return ((t % n) + n) % n;  // wrap
  }
}

// The padded copy: per axis the cropped input extent, its strides (bytes) in x, the pads (>= 0) and the output
// strides (bytes).
struct Plan {
  SmallDims n, in_strides, begin, end, out_strides;
  Mode mode = Mode::kConstant;
  size_t item = 0;
  const char* value = nullptr;  // one element (constant mode)
  RunCopier copy;

  void FillValue(char* dst, int64_t count) const {
    if (count <= 0) return;
    std::memcpy(dst, value, item);
    size_t done = item, total = static_cast<size_t>(count) * item;
    while (done < total) {  // doubling memcpys
      const size_t k = std::min(done, total - done);
      std::memcpy(dst + done, dst, k);
      done += k;
    }
  }

  template <typename T>
  void Row(const char* src, char* dst) const {
    const size_t a = n.size() - 1;
    const int64_t b = begin[a], c = n[a], e = end[a];
    copy(dst + b * static_cast<int64_t>(item), src, static_cast<size_t>(c) * item);
    T* d = reinterpret_cast<T*>(dst);
    if (mode == Mode::kConstant) {  // a few elements per row: stores of the value, not memcpy calls
      T v;
      std::memcpy(&v, value, sizeof(T));
      for (int64_t j = 0; j < b; ++j) d[j] = v;
      for (int64_t j = b + c; j < b + c + e; ++j) d[j] = v;
      return;
    }
    const T* s = reinterpret_cast<const T*>(src);
    for (int64_t j = 0; j < b; ++j) d[j] = s[SourceIndex(mode, j, b, c)];
    for (int64_t j = b + c; j < b + c + e; ++j) d[j] = s[SourceIndex(mode, j, b, c)];
  }

  // Output indices [i0, i1) of the centre of `axis`, then (whole axis only) its pads.
  template <typename T>
  void Axis(size_t axis, const char* src, char* dst, int64_t i0, int64_t i1, bool pads) const {
    if (axis + 1 == n.size()) {
      Row<T>(src, dst);
      return;
    }
    const int64_t b = begin[axis], c = n[axis], os = out_strides[axis];
    for (int64_t i = i0; i < i1; ++i)
      Axis<T>(axis + 1, src + i * in_strides[axis], dst + (b + i) * os, 0, n[axis + 1], true);
    if (!pads) return;
    for (int64_t j = 0; j < b + c + end[axis]; ++j) {
      if (j == b) j = b + c;
      if (j >= b + c + end[axis]) break;
      if (mode == Mode::kConstant)
        FillValue(dst + j * os, os / static_cast<int64_t>(item));
      else
        copy(dst + j * os, dst + (b + SourceIndex(mode, j, b, c)) * os, static_cast<size_t>(os));
    }
  }
};

// Per-axis checks the reference makes (and its words): a crop within the axis, pads of reflect shorter than the
// (cropped) axis, no pad of an empty axis outside constant mode.
void CheckAxis(const SmallDims& dims, size_t i, int64_t b, int64_t e, int64_t kept, Mode m, const std::string& mode) {
  const int64_t grow_b = std::max<int64_t>(b, 0), grow_e = std::max<int64_t>(e, 0);
  const bool grows = grow_b > 0 || grow_e > 0;
  if (kept >= 0 && !(m != Mode::kConstant && grows && kept == 0) &&
      !(m == Mode::kReflect && grows && std::max(grow_b, grow_e) >= kept))
    return;  // the message below is made only for a failing axis (a per-call cost otherwise)
  const std::string axis = "axis " + std::to_string(i) + " of shape " + DimsText(dims) + " (pads " + std::to_string(b) +
                           ", " + std::to_string(e) + ", " + std::to_string(kept) + " kept)";
  if (kept < 0) throw std::invalid_argument("pad: the crop of " + axis + " is more than the axis");
  if (m != Mode::kConstant && (grow_b > 0 || grow_e > 0) && kept == 0)
    throw std::invalid_argument("pad: mode " + mode + " cannot pad empty " + axis);
  if (m == Mode::kReflect && (grow_b > 0 || grow_e > 0) && std::max(grow_b, grow_e) >= kept)
    throw std::invalid_argument("pad: reflect pads (" + std::to_string(grow_b) + ", " + std::to_string(grow_e) +
                                ") need axis " + std::to_string(i) + " longer than them: " + axis);
}

py::array PadPy(const py::object& x_in, const py::object& begins_in, const py::object& ends_in,
                const std::string& mode_name, const py::object& value, const py::object& out, int threads) {
  const py::array x = MovableInput("pad", x_in);
  // without pybind11's list caster
  const SmallDims begins = IntsOf<SmallDims>(begins_in), ends = IntsOf<SmallDims>(ends_in);
  const auto rank = static_cast<size_t>(x.ndim());
  const SmallDims dims = SmallDimsOf(x);
  if (begins.size() != rank || ends.size() != rank)
    throw std::invalid_argument("pad: " + std::to_string(begins.size()) + " begin and " + std::to_string(ends.size()) +
                                " end pads for shape " + DimsText(dims));
  Plan p;
  p.mode = ModeOf(mode_name);
  p.item = static_cast<size_t>(x.itemsize());
  py::array v = value.is_none() ? x : py::array::ensure(value, py::array::c_style);  // x: no array made for none
  if (!value.is_none()) {
    if (!v || !v.dtype().equal(x.dtype()) || v.size() != 1)
      throw std::invalid_argument("pad: value must be one element of the input's dtype " +
                                  std::string(py::str(x.dtype())));
  }
  static const uint64_t kZero = 0;  // zero bits: every dtype's 0
  p.value = value.is_none() ? reinterpret_cast<const char*>(&kZero) : static_cast<const char*>(v.data());
  int64_t offset = 0, stride = static_cast<int64_t>(p.item);
  SmallDims out_dims(rank), in_strides(rank), kept(rank);
  for (size_t i = rank; i-- > 0;) {
    in_strides[i] = stride;
    stride *= dims[i];
  }
  for (size_t i = 0; i < rank; ++i) {
    kept[i] = dims[i] + std::min<int64_t>(begins[i], 0) + std::min<int64_t>(ends[i], 0);
    CheckAxis(dims, i, begins[i], ends[i], kept[i], p.mode, mode_name);
    offset += std::max<int64_t>(-begins[i], 0) * in_strides[i];
    out_dims[i] = kept[i] + std::max<int64_t>(begins[i], 0) + std::max<int64_t>(ends[i], 0);
  }
  py::array y = MovementResult("pad", x.dtype(), out_dims.data(), out_dims.size(), out);
  if (y.size() == 0) return y;
  auto* dst = static_cast<char*>(y.mutable_data());
  if (rank == 0) {
    std::memcpy(dst, x.data(), p.item);
    return y;
  }
  // Leading axes without pads become one axis when all but the first are whole (not cropped): then their input
  // and output strides are each one axis' stride.
  size_t lead = 0;
  int64_t outer = 1;
  while (lead + 1 < rank && begins[lead] <= 0 && ends[lead] <= 0 && (lead == 0 || kept[lead] == dims[lead]))
    outer *= kept[lead++];
  const size_t first = lead > 0 ? lead - 1 : 0, r = rank - first;
  for (SmallDims* v : {&p.n, &p.in_strides, &p.begin, &p.end, &p.out_strides}) v->resize(r);
  for (size_t i = first; i < rank; ++i) {
    p.n[i - first] = i + 1 == lead ? outer : kept[i];
    p.in_strides[i - first] = in_strides[i];
    p.begin[i - first] = std::max<int64_t>(begins[i], 0);
    p.end[i - first] = std::max<int64_t>(ends[i], 0);
  }
  p.out_strides[r - 1] = static_cast<int64_t>(p.item);
  for (size_t i = r - 1; i-- > 0;)
    p.out_strides[i] = p.out_strides[i + 1] * (p.n[i + 1] + p.begin[i + 1] + p.end[i + 1]);
  const char* src = static_cast<const char*>(x.data()) + offset;
  auto run = [&] {
    ForItemSize(p.item, [&](auto t) {
      using T = decltype(t);
      if (r == 1 || lead == 0) {
        p.Axis<T>(0, src, dst, 0, p.n[0], true);
        return;
      }
      const int64_t per_task = std::max<int64_t>(1, kTaskBytes / p.out_strides[0]);
      if (per_task >= p.n[0]) {  // one task: no hand-off
        p.Axis<T>(0, src, dst, 0, p.n[0], false);
        return;
      }
      ParallelFor(ThreadsFor(threads, y.size()), (p.n[0] + per_task - 1) / per_task, [&](int64_t task) {
        p.Axis<T>(0, src, dst, task * per_task, std::min(p.n[0], (task + 1) * per_task), false);
      });
    });
  };
  RunMoving(static_cast<size_t>(y.nbytes()), run);
  return y;
}

}  // namespace

void BindPad(py::module_& m) {
  m.def("pad", &PadPy, py::arg("x"), py::arg("begins"), py::arg("ends"), py::arg("mode") = "constant",
        py::arg("value") = py::none(), py::arg("out") = py::none(), py::arg("threads") = 1,
        "ONNX Pad of x by per-axis begin/end pads (negative: crop first) in constant (value: one element of x's "
        "dtype, None: zero), reflect, edge or wrap mode, as a C-order array, into out (ORT's buffer) or a new "
        "array; any dtype of 1, 2, 4 or 8 bytes");
}

}  // namespace npu_ep::kern
