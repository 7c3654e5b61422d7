// com.microsoft QLinearConcat (`kernels.qlinear_concat`) for kernels/ops/qlinear_lut.py: 8-bit parts joined along
// an axis, each part's bytes copied (its scale and zero point are the output's) or mapped through its 256-entry
// requantization table (built by the reference, qlinear_lut.build_table, as ORT's kernel builds it), so the bytes
// are the reference's. Into ORT's buffer when given one; an output of 1 MB or more is written in parallel tasks of
// whole output rows (the bytes never depend on the thread count).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "row_copy.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskBytes = int64_t{1} << 16;  // output bytes per parallel task (whole rows)

using Dims = std::vector<int64_t>;

std::string DimsText(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

struct Part {
  const uint8_t* data;
  const uint8_t* table;  // nullptr: a copy
  int64_t run;           // bytes of one outer row of this part
};

#if NPU_EP_X86
// The 256-entry table in four registers, 64 bytes per step: two 128-entry byte permutes (by the low 7 bits), the
// byte's high bit choosing between them; the same bytes as the scalar lookup.
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline __m512i Map64(__m512i x, __m512i t0,
                                                                                           __m512i t1, __m512i t2,
                                                                                           __m512i t3) {
  const __m512i lo = _mm512_permutex2var_epi8(t0, x, t1), hi = _mm512_permutex2var_epi8(t2, x, t3);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void MapRunVbmi(const uint8_t* src, const uint8_t* table,
                                                                       uint8_t* dst, int64_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, Map64(_mm512_loadu_si512(src + i), t0, t1, t2, t3));
  if (i < n) {
    const __mmask64 m = ~uint64_t{0} >> (64 - (n - i));
    _mm512_mask_storeu_epi8(dst + i, m, Map64(_mm512_maskz_loadu_epi8(m, src + i), t0, t1, t2, t3));
  }
}
#endif

struct RunMapper {
  RunCopier copy;
  bool vbmi = false;

  RunMapper() {
#if NPU_EP_X86
    vbmi = ActiveIsa() >= Isa::kAvx512 && __builtin_cpu_supports("avx512vbmi");
#endif
  }

  void operator()(const uint8_t* src, const uint8_t* table, uint8_t* dst, int64_t n) const {
    if (table == nullptr) {
      copy(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), static_cast<size_t>(n));
      return;
    }
#if NPU_EP_X86
    if (vbmi) {
      MapRunVbmi(src, table, dst, n);
      return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
  }
};

// Output rows [begin, end): each row is every part's run for that row, side by side.
void Rows(const std::vector<Part>& parts, int64_t row_bytes, uint8_t* y, int64_t begin, int64_t end) {
  const RunMapper map;
  for (int64_t o = begin; o < end; ++o) {
    uint8_t* dst = y + o * row_bytes;
    for (const Part& p : parts) {
      map(p.data + o * p.run, p.table, dst, p.run);
      dst += p.run;
    }
  }
}

const uint8_t* TableOf(const py::handle& t, size_t k) {
  if (t.is_none()) return nullptr;
  const auto a = py::reinterpret_borrow<py::array>(t);
  if (!py::isinstance<py::array>(t) || a.itemsize() != 1 || a.size() != 256 || !(a.flags() & py::array::c_style))
    throw std::invalid_argument("qlinear_concat: table " + std::to_string(k) +
                                " must be None or a C-order array of 256 bytes");
  return static_cast<const uint8_t*>(a.data());
}

py::array QLinearConcatPy(int64_t axis, const py::list& tables, const py::object& out, int threads,
                          const py::args& parts_in) {
  if (parts_in.size() == 0 || tables.size() != parts_in.size())
    throw std::invalid_argument("qlinear_concat: one table (or None) per part, got " + std::to_string(tables.size()) +
                                " for " + std::to_string(parts_in.size()) + " parts");
  std::vector<py::array> arrays;
  for (const py::handle h : parts_in) arrays.push_back(py::reinterpret_borrow<py::array>(h));
  const py::array& first = arrays[0];
  const Dims dims0(first.shape(), first.shape() + first.ndim());
  const auto rank = static_cast<int64_t>(dims0.size());
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (rank == 0 || a < 0 || a >= rank)
    throw std::invalid_argument("qlinear_concat: axis " + std::to_string(axis) + " outside rank " +
                                std::to_string(rank));
  Dims dims = dims0;
  dims[a] = 0;
  for (const py::array& p : arrays) {
    const Dims ps(p.shape(), p.shape() + p.ndim());
    bool ok = ps.size() == dims0.size() && p.itemsize() == 1 && p.dtype().equal(first.dtype()) &&
              (p.flags() & py::array::c_style);
    for (size_t i = 0; ok && i < ps.size(); ++i) ok = static_cast<int64_t>(i) == a || ps[i] == dims0[i];
    if (!ok)
      throw std::invalid_argument("qlinear_concat: part " + DimsText(ps) + " (" + std::string(py::str(p.dtype())) +
                                  ") does not match " + DimsText(dims0) + " (" + std::string(py::str(first.dtype())) +
                                  ") off axis " + std::to_string(a) + " (C-order 8-bit parts of one dtype)");
    dims[a] += ps[a];
  }
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < a; ++i) outer *= dims[i];
  for (int64_t i = a + 1; i < rank; ++i) inner *= dims[i];
  const int64_t total = outer * dims[a] * inner;
  // out, or null when it is not an array (a default py::array would be a new empty numpy array per call)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(first.dtype(), std::vector<py::ssize_t>(dims.begin(), dims.end()));
  } else {
    if (!y || !y.dtype().equal(first.dtype()) || !(y.flags() & py::array::c_style) || !y.writeable() ||
        y.size() != total)
      throw std::invalid_argument("qlinear_concat: out must be a writeable C-order " +
                                  std::string(py::str(first.dtype())) + " array of " + std::to_string(total) +
                                  " elements");
  }
  std::vector<Part> parts;
  for (size_t k = 0; k < arrays.size(); ++k)
    parts.push_back({static_cast<const uint8_t*>(arrays[k].data()), TableOf(tables[k], k), arrays[k].shape(a) * inner});
  if (total == 0) return y;
  const int64_t row_bytes = dims[a] * inner;
  auto* dst = static_cast<uint8_t*>(y.mutable_data());
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(row_bytes, 1));
  const int64_t tasks = (outer + rows_per_task - 1) / rows_per_task;
  py::gil_scoped_release release;
  ParallelFor(ThreadsFor(threads, total), tasks, [&](int64_t t) {
    Rows(parts, row_bytes, dst, t * rows_per_task, std::min(outer, (t + 1) * rows_per_task));
  });
  return y;
}

}  // namespace

void BindQLinearConcat(py::module_& m) {
  m.def("qlinear_concat", &QLinearConcatPy, py::arg("axis"), py::arg("tables"), py::arg("out"), py::arg("threads"),
        "com.microsoft QLinearConcat of the C-order int8/uint8 parts that follow along axis: part k's bytes copied "
        "(tables[k] None) or mapped through tables[k] (256 bytes: its requantization table), into out (ORT's buffer) "
        "or a new array");
}

}  // namespace npu_ep::kern
