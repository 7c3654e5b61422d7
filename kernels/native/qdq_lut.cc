// npu::QdqLut: 8-bit element-wise QDQ units as table reads (kernels/ops/qdq_lut.py is the reference):
// y[i] = table[a[i]] (256 entries), table[256 * a[i] + b[i]] (65536 entries, a and b of one shape), or with a
// per-channel operand one 256-entry row of the table per run of elements.
// Tasks are fixed chunks of elements; a byte gather has no rounding, so the bits never depend on the split.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <initializer_list>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "qdq_lut.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kLutChunk = int64_t{1} << 18;  // elements per task

void RowScalar(const uint8_t* x, int64_t n, const uint8_t* row, uint8_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = row[x[i]];
}

#if NPU_EP_X86
// 64 bytes per step: the 256-entry row is four 64-byte registers; vpermi2b picks within each half (7 index bits)
// and bit 7 of the index chooses the half.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void RowVbmi(const uint8_t* x, int64_t n, const uint8_t* row,
                                                                    uint8_t* y) {
  const __m512i t0 = _mm512_loadu_si512(row), t1 = _mm512_loadu_si512(row + 64), t2 = _mm512_loadu_si512(row + 128),
                t3 = _mm512_loadu_si512(row + 192);
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 k = n - i >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - i)) - 1;
    const __m512i idx = _mm512_maskz_loadu_epi8(k, x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_mask_storeu_epi8(y + i, k, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
  }
}

bool HasVbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has && ActiveIsa() >= Isa::kAvx512;
}
#endif

template <typename Fn>
void Chunks(int threads, int64_t n, const Fn& fn) {
  const int64_t tasks = (n + kLutChunk - 1) / kLutChunk;
  ParallelFor(ThreadsFor(threads, n), tasks, [&](int64_t t) {
    const int64_t lo = t * kLutChunk;
    fn(lo, std::min(n, lo + kLutChunk));
  });
}

// y[i] = table[256 * a[i] + b[i]]: a 64 KiB table, one scalar read per element.
void LutBinary(const uint8_t* a, const uint8_t* b, int64_t n, const uint8_t* table, uint8_t* y, int threads) {
  Chunks(threads, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = table[(static_cast<uint32_t>(a[i]) << 8) | b[i]];
  });
}

// y[i] = rows[256 * s[i / inner] + x[i]]: the small operand s is constant over runs of `inner` elements (per channel),
// so each run is one 256-entry row.
void LutRows(const uint8_t* x, const uint8_t* s, int64_t n, int64_t inner, const uint8_t* rows, uint8_t* y,
             int threads) {
  Chunks(threads, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi;) {
      const int64_t j = i / inner, end = std::min(hi, (j + 1) * inner);
      LutRow(x + i, end - i, rows + 256 * static_cast<int64_t>(s[j]), y + i);
      i = end;
    }
  });
}

void CheckBytes(const char* op, std::initializer_list<const py::array*> arrays) {
  for (const py::array* a : arrays) {
    if (!(py::isinstance<py::array_t<uint8_t>>(*a) || py::isinstance<py::array_t<int8_t>>(*a)))
      throw std::invalid_argument(std::string(op) + ": inputs and table must be uint8 or int8");
    if (!(a->flags() & py::array::c_style))
      throw std::invalid_argument(std::string(op) + ": arrays must be C-contiguous");
  }
}

// The result: `out` (ORT's buffer, when the step writes a partition output in place) if given, else a new array of
// the table's dtype and `like`'s shape.
py::array Output(const char* op, const py::array& like, const py::array& table, const py::object& out) {
  if (out.is_none())
    return py::array(table.dtype(), std::vector<py::ssize_t>(like.shape(), like.shape() + like.ndim()));
  if (!py::isinstance<py::array>(out)) throw std::invalid_argument(std::string(op) + ": out must be an array or None");
  auto y = py::reinterpret_borrow<py::array>(out);
  if (!y.dtype().equal(table.dtype()) || y.size() != like.size() || !(y.flags() & py::array::c_style) || !y.writeable())
    throw std::invalid_argument(std::string(op) + ": out must be a writable C-order array of the table's dtype with " +
                                std::to_string(like.size()) + " elements");
  return y;
}

py::array QdqLutPy(const py::array& a, const std::optional<py::array>& b, const py::array& table, int threads,
                   const py::object& out) {
  const char* op = "qdq_lut";
  CheckBytes(op, {&a, &table});
  if (b) CheckBytes(op, {&*b});
  const int64_t want = b ? 65536 : 256;
  if (table.size() != want)
    throw std::invalid_argument(std::string(op) + ": table has " + std::to_string(table.size()) +
                                " entries, expected " + std::to_string(want));
  if (b && b->size() != a.size())
    throw std::invalid_argument(std::string(op) + ": a and b must have the same number of elements");
  py::array y = Output(op, a, table, out);
  const auto* pa = static_cast<const uint8_t*>(a.data());
  const auto* pb = b ? static_cast<const uint8_t*>(b->data()) : nullptr;
  const auto* pt = static_cast<const uint8_t*>(table.data());
  auto* dst = static_cast<uint8_t*>(y.mutable_data());
  const int64_t n = a.size();
  {
    py::gil_scoped_release release;
    if (pb)
      LutBinary(pa, pb, n, pt, dst, threads);
    else
      Chunks(threads, n, [&](int64_t lo, int64_t hi) { LutRow(pa + lo, hi - lo, pt, dst + lo); });
  }
  return y;
}

py::array QdqLutRowsPy(const py::array& x, const py::array& s, int64_t inner, const py::array& rows, int threads,
                       const py::object& out) {
  const char* op = "qdq_lut_rows";
  CheckBytes(op, {&x, &s, &rows});
  if (rows.size() != 65536) throw std::invalid_argument(std::string(op) + ": rows must have 65536 entries");
  if (inner <= 0 || s.size() * inner != x.size())
    throw std::invalid_argument(std::string(op) + ": x must hold `inner` = " + std::to_string(inner) +
                                " elements per element of s");
  py::array y = Output(op, x, rows, out);
  const auto* px = static_cast<const uint8_t*>(x.data());
  const auto* ps = static_cast<const uint8_t*>(s.data());
  const auto* pr = static_cast<const uint8_t*>(rows.data());
  auto* dst = static_cast<uint8_t*>(y.mutable_data());
  {
    py::gil_scoped_release release;
    LutRows(px, ps, x.size(), inner, pr, dst, threads);
  }
  return y;
}

}  // namespace

void LutRow(const uint8_t* x, int64_t n, const uint8_t* row, uint8_t* y) {
#if NPU_EP_X86
  if (HasVbmi()) return RowVbmi(x, n, row, y);
#endif
  RowScalar(x, n, row, y);
}

void BindQdqLut(py::module_& m) {
  m.def("qdq_lut", &QdqLutPy, py::arg("a"), py::arg("b"), py::arg("table"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "8-bit table read: table[a] (256 entries) or table[256 * a + b] (65536, a and b the same size); the output "
        "has the table's dtype and a's shape, into out (ORT's buffer) or a new array");
  m.def("qdq_lut_rows", &QdqLutRowsPy, py::arg("x"), py::arg("s"), py::arg("inner"), py::arg("rows"),
        py::arg("threads") = 1, py::arg("out") = py::none(),
        "8-bit table read with a broadcast operand: y[i] = rows[256 * s[i / inner] + x[i]] (rows: 65536 entries), "
        "into out (ORT's buffer) or a new array");
}

}  // namespace npu_ep::kern
