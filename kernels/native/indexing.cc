// Indexing for the bound steps of kernels/ops/indexing.py: Gather (`kernels.gather`), Slice (`kernels.slice_copy`),
// Split (`kernels.split`), Concat (`kernels.concat_into`), GatherND (`kernels.gather_nd`) and ScatterND
// (`kernels.scatter_nd`). Every op copies rows of bytes by index or by stride, whatever the dtype: a fixed-size row
// (1, 2, 4 or 8 bytes) is one load and store, a longer one a memcpy. Indices are checked before anything is written
// and answered as ORT does: [-dim, dim) with negatives counted from the end, anything else an IndexError naming the
// index. ScatterND's reductions compute in the data's dtype as the reference's numpy ufuncs do (integers wrap,
// float16 rounds each step through float32, bool add/mul are or/and, max/min keep a NaN). Results go into ORT's
// output buffer when the step is given one (`out`), else into a new array; copies of 1 MB or more run in parallel
// tasks of kTaskBytes (a task's bytes depend only on its index, so the bits never depend on the thread count).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "half.h"
#include "movement.h"
#include "row_copy.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskBytes = int64_t{1} << 16;       // output bytes per parallel task
constexpr size_t kMaxRank = 64;                        // numpy's NPY_MAXDIMS
constexpr int64_t kPickRowBytes = 64;  // ScatterND without reduction picks each row from x or its update from here
constexpr int64_t kSplitRowRun = 32;  // Split and Concat take rows in one pass when every run has this many bytes

using Dims = SmallDims;

Dims ShapeOf(const py::array& a) { return Dims(a.shape(), a.shape() + a.ndim()); }

int64_t Product(const Dims& d, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= d[i];
  return n;
}

// A C-order array (a strided one is copied first, as numpy reads it) of plain data (not object).
py::array Plain(const char* fn, const py::object& h) {
  const py::array a = CArray(h);
  if (a.dtype().kind() == 'O') throw std::invalid_argument(std::string(fn) + ": object arrays are not supported");
  return a;
}

// ORT's buffer `out` (checked: writeable C-order, this dtype and element count) or a new array of `dims`.
py::array Result(const char* fn, const py::dtype& dtype, const Dims& dims, const py::object& out) {
  if (out.is_none()) return py::array(dtype, std::vector<py::ssize_t>(dims.begin(), dims.end()));
  // null when out is not an array (no empty array made to hold nothing)
  const auto y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  const int64_t n = Product(dims, 0, dims.size());
  if (!y || !y.dtype().equal(dtype) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != n)
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " + std::string(py::str(dtype)) +
                                " array of " + std::to_string(n) + " elements");
  return y;
}

// Runs fn(lo, hi) over [0, n) units of `unit` bytes in tasks of about kTaskBytes, in parallel from 1 MB on, without
// the GIL from kReleaseGilBytes on.
template <typename Fn>
void ForUnits(int64_t n, int64_t unit, int threads, const Fn& fn) {
  if (n <= 0) return;
  const int64_t bytes = n * std::max<int64_t>(unit, 1);
  const int64_t per_task = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(unit, 1));
  const int64_t tasks = (n + per_task - 1) / per_task;
  RunMoving(static_cast<size_t>(bytes), [&] {
    ParallelFor(ThreadsFor(threads, bytes), tasks,
                [&](int64_t t) { fn(t * per_task, std::min(n, (t + 1) * per_task)); });
  });
}

// Copies `row` bytes; B > 0 is the row size known at compile time (one load and store).
template <size_t B>
inline void CopyRow(char* d, const char* s, size_t row) {
  std::memcpy(d, s, B ? B : row);
}

// Calls body.template Rows<B>() with B the row size when it is 1, 2, 4 or 8 bytes, else 0 (a memcpy per row).
template <typename Body>
void ByRowSize(int64_t row, const Body& body) {
  switch (row) {
    case 1: body.template Rows<1>(); break;
    case 2: body.template Rows<2>(); break;
    case 4: body.template Rows<4>(); break;
    case 8: body.template Rows<8>(); break;
    default: body.template Rows<0>(); break;
  }
}

// ---- Gather, GatherND, ScatterND: rows by index ----------------------------------------------------------------

// The indices as int64 with negatives counted from the end: each must be in [-dim, dim) (ORT's check), else an
// IndexError naming the op, the axis and the index.
template <typename I>
void NormalizeInto(const I* idx, int64_t n, int64_t dim, int64_t axis, std::vector<int64_t>& rows) {
  rows.resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const auto v = static_cast<int64_t>(idx[k]);
    if (v < -dim || v >= dim)
      throw py::index_error("Gather: indices outside [-" + std::to_string(dim) + ", " + std::to_string(dim) +
                            ") on axis " + std::to_string(axis) + ", idx=" + std::to_string(v));
    rows[static_cast<size_t>(k)] = v < 0 ? v + dim : v;
  }
}

struct GatherRows {
  const char* x;
  char* out;
  const int64_t* idx;
  int64_t n_idx, dim, row, lo, hi;

  // Output rows [lo, hi): row r is x's row idx[r % n_idx] of block r / n_idx.
  template <size_t B>
  void Rows() const {
    const auto bytes = static_cast<size_t>(row);
    int64_t j = lo % n_idx;
    const char* block = x + (lo / n_idx) * dim * row;
    char* d = out + lo * row;
    for (int64_t r = lo; r < hi; ++r, d += row) {
      CopyRow<B>(d, block + idx[j] * row, bytes);
      if (++j == n_idx) {
        j = 0;
        block += dim * row;
      }
    }
  }
};

py::array GatherPy(const py::object& x_in, const py::object& idx_in, int64_t axis, const py::object& out, int threads) {
  const py::array x = Plain("gather", x_in), idx = Plain("gather", idx_in);
  const bool i64 = idx.dtype().equal(py::dtype::of<int64_t>());
  if (!i64 && !idx.dtype().equal(py::dtype::of<int32_t>()))
    throw std::invalid_argument("gather: indices must be int32 or int64, got " + std::string(py::str(idx.dtype())));
  const auto rank = static_cast<int64_t>(x.ndim());
  if (axis < -rank || axis >= rank)
    throw std::invalid_argument("gather: axis " + std::to_string(axis) + " out of range for data " +
                                DimsText(ShapeOf(x)));
  if (axis < 0) axis += rank;
  const Dims xs = ShapeOf(x);
  const int64_t dim = xs[axis], n_idx = idx.size();
  std::vector<int64_t> rows;
  if (i64)
    NormalizeInto(static_cast<const int64_t*>(idx.data()), n_idx, dim, axis, rows);
  else
    NormalizeInto(static_cast<const int32_t*>(idx.data()), n_idx, dim, axis, rows);
  Dims dims(xs.begin(), xs.begin() + axis);
  for (py::ssize_t i = 0; i < idx.ndim(); ++i) dims.push_back(idx.shape(i));
  dims.append(xs.begin() + axis + 1, xs.end());
  py::array y = Result("gather", x.dtype(), dims, out);
  const int64_t row = Product(xs, static_cast<size_t>(axis) + 1, xs.size()) * x.itemsize();
  const int64_t n = Product(xs, 0, static_cast<size_t>(axis)) * n_idx;
  if (row == 0) return y;
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  ForUnits(n, row, threads,
           [&](int64_t lo, int64_t hi) { ByRowSize(row, GatherRows{src, dst, rows.data(), n_idx, dim, row, lo, hi}); });
  return y;
}

// ---- Slice, Split, Concat: strided copies ---------------------------------------------------------------------

// A copy of `dims` elements of `item` bytes between two strided layouts (byte strides, any sign), axes outermost
// first; the innermost axis is a line: one memcpy where it is contiguous on both sides, else element by element.
struct StridedCopy {
  Dims dims, dst, src;
  int64_t item = 1;

  // Drops size-1 axes and merges neighbours that are one run on both sides, so a line is as long as it can be (in
  // place: a call's fixed cost is mostly its allocations).
  void Coalesce() {
    size_t w = 0;  // axes kept so far; w <= a, so the kept ones overwrite axes already read
    for (size_t a = 0; a < dims.size(); ++a) {
      if (dims[a] == 1) continue;
      if (w > 0 && dst[w - 1] == dst[a] * dims[a] && src[w - 1] == src[a] * dims[a]) {
        dims[w - 1] *= dims[a];
        dst[w - 1] = dst[a];
        src[w - 1] = src[a];
        continue;
      }
      dims[w] = dims[a], dst[w] = dst[a], src[w] = src[a];
      ++w;
    }
    if (w == 0) {  // one element (every axis of size 1, or none at all)
      dims.assign(1, 1), dst.assign(1, item), src.assign(1, item);
      return;
    }
    dims.resize(w), dst.resize(w), src.resize(w);
  }

  bool Contiguous() const { return dst.back() == item && src.back() == item; }

  // Byte offsets (dst, src) of line `line`, counted over every axis but the last.
  std::pair<int64_t, int64_t> Offsets(int64_t line) const {
    int64_t d = 0, s = 0;
    for (size_t a = dims.size() - 1; a-- > 0;) {
      const int64_t i = line % dims[a];
      line /= dims[a];
      d += i * dst[a];
      s += i * src[a];
    }
    return {d, s};
  }
};

struct StridedLines {
  const StridedCopy& c;
  char* out;
  const char* in;
  int64_t lo, hi, first, count;  // lines [lo, hi), elements [first, first + count) of each

  template <size_t B>
  void Rows() const {
    const size_t rank = c.dims.size();
    auto [d, s] = c.Offsets(lo);
    const int64_t ds = c.dst[rank - 1], ss = c.src[rank - 1];
    const bool contiguous = c.Contiguous();
    const auto bytes = static_cast<size_t>(count * c.item);
    const auto item = static_cast<size_t>(c.item);
    d += first * ds, s += first * ss;
    const RunCopier copy;
    auto line_copy = [&](int64_t dl, int64_t sl) {
      if (contiguous) {
        copy(out + dl, in + sl, bytes);
      } else {
        for (int64_t i = 0; i < count; ++i) CopyRow<B>(out + dl + i * ds, in + sl + i * ss, item);
      }
    };
    if (rank <= 2) {  // at most one outer axis: the next line is one step on (the steps held in registers)
      const int64_t dd = rank == 2 ? c.dst[0] : 0, sd = rank == 2 ? c.src[0] : 0;
      for (int64_t line = lo; line < hi; ++line, d += dd, s += sd) line_copy(d, s);
      return;
    }
    std::array<int64_t, kMaxRank> at;  // the line's index on each outer axis (only those are set and read)
    int64_t rest = lo;
    for (size_t a = rank - 1; a-- > 0;) at[a] = rest % c.dims[a], rest /= c.dims[a];
    for (int64_t line = lo; line < hi; ++line) {
      line_copy(d, s);
      for (size_t a = rank - 1; a-- > 0;) {  // the next line: an odometer over the outer axes
        d += c.dst[a], s += c.src[a];
        if (++at[a] < c.dims[a]) break;
        d -= c.dst[a] * c.dims[a], s -= c.src[a] * c.dims[a];
        at[a] = 0;
      }
    }
  }
};

// Runs the copy in tasks of about kTaskBytes: whole lines, or parts of one long contiguous line.
void RunStrided(StridedCopy c, char* out, const char* in, int threads) {
  if (Product(c.dims, 0, c.dims.size()) == 0) return;
  if (c.dims.size() > kMaxRank)
    throw std::invalid_argument("indexing: rank " + std::to_string(c.dims.size()) + " above numpy's " +
                                std::to_string(kMaxRank));
  c.Coalesce();
  const int64_t len = c.dims.back(), lines = Product(c.dims, 0, c.dims.size() - 1);
  const int64_t line_bytes = len * c.item;
  const int64_t parts = c.Contiguous() ? std::max<int64_t>(1, line_bytes / kTaskBytes) : 1;
  const int64_t part = (len + parts - 1) / parts;
  if (parts == 1) {
    ForUnits(lines, line_bytes, threads,
             [&](int64_t lo, int64_t hi) { ByRowSize(c.item, StridedLines{c, out, in, lo, hi, 0, len}); });
    return;
  }
  ForUnits(lines * parts, part * c.item, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t first = (u % parts) * part;
      StridedLines{c, out, in, u / parts, u / parts + 1, first, std::min(part, len - first)}.Rows<0>();
    }
  });
}

Dims CStrides(const Dims& dims, int64_t item) {
  Dims st(dims.size(), item);
  for (size_t a = dims.size(); a-- > 1;) st[a - 1] = st[a] * dims[a];
  return st;
}

// ONNX Slice after its clamping (kernels/ops/indexing.py onnx_slice): per axis the first element `starts`, the step
// `steps` and the element count `dims` of the result; x in any layout.
py::array SliceCopyPy(const py::array& x, const py::object& starts_in, const py::object& steps_in,
                      const py::object& dims_in, const py::object& out, int threads) {
  // a bound step's lists read without pybind11's list caster
  const Dims starts = IntsOf<Dims>(starts_in), steps = IntsOf<Dims>(steps_in), dims = IntsOf<Dims>(dims_in);
  const auto rank = static_cast<size_t>(x.ndim());
  if (starts.size() != rank || steps.size() != rank || dims.size() != rank || x.dtype().kind() == 'O')
    throw std::invalid_argument("slice_copy: starts, steps and dims need one entry per axis of data " +
                                DimsText(ShapeOf(x)) + " (not an object array)");
  StridedCopy c{dims, CStrides(dims, x.itemsize()), Dims(rank), x.itemsize()};
  int64_t base = 0;
  const bool empty = Product(dims, 0, rank) == 0;
  for (size_t a = 0; a < rank; ++a) {
    const int64_t last = starts[a] + (dims[a] - 1) * steps[a];
    if (!empty && (starts[a] < 0 || starts[a] >= x.shape(a) || last < 0 || last >= x.shape(a)))
      throw std::invalid_argument("slice_copy: axis " + std::to_string(a) + ": " + std::to_string(dims[a]) +
                                  " elements from " + std::to_string(starts[a]) + " by " + std::to_string(steps[a]) +
                                  " leave data " + DimsText(ShapeOf(x)));
    base += starts[a] * x.strides(a);
    c.src[a] = steps[a] * x.strides(a);
  }
  py::array y = Result("slice_copy", x.dtype(), dims, out);
  if (!empty)
    RunStrided(std::move(c), static_cast<char*>(y.mutable_data()), static_cast<const char*>(x.data()) + base, threads);
  return y;
}

// The byte rows of a split/concat along `axis`: (outer rows, bytes per element of the axis).
std::pair<int64_t, int64_t> AxisRows(const Dims& dims, size_t axis, int64_t item) {
  return {Product(dims, 0, axis), Product(dims, axis + 1, dims.size()) * item};
}

size_t AxisOf(const char* fn, int64_t axis, const Dims& dims) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < -rank || axis >= rank)
    throw std::invalid_argument(std::string(fn) + ": axis " + std::to_string(axis) + " out of range for " +
                                DimsText(dims));
  return static_cast<size_t>(axis < 0 ? axis + rank : axis);
}

// A part of a split or concat: its data (written by a split, only read by a concat) and its run in each row of the
// whole, in bytes.
struct PartRun {
  char* data;
  int64_t run;
};

// The parts' runs of one call: up to kInline in place (no allocation per call), more on the heap.
class PartRuns {
 public:
  explicit PartRuns(size_t n) : n_(n) {
    if (n > kInline) heap_.resize(n);
  }
  PartRun* data() { return n_ > kInline ? heap_.data() : inline_; }
  const PartRun* data() const { return n_ > kInline ? heap_.data() : inline_; }
  PartRun& operator[](size_t k) { return data()[k]; }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kInline = 16;
  PartRun inline_[kInline];
  std::vector<PartRun> heap_;
  size_t n_;
};

// Rows [lo, hi) of the whole (`row` bytes each) cut into the parts' rows (kToParts, Split) or assembled from them
// (Concat), part by part in order.
template <bool kToParts>
void RowsOfParts(char* whole, const PartRuns& parts, int64_t row, int64_t lo, int64_t hi) {
  const PartRun* p = parts.data();
  const size_t n = parts.size();
  const RunCopier copy;
  for (int64_t r = lo; r < hi; ++r) {
    char* w = whole + r * row;
    for (size_t k = 0; k < n; ++k) {
      const int64_t run = p[k].run;
      char* part = p[k].data + r * run;
      if (kToParts)
        copy(part, w, static_cast<size_t>(run));
      else
        copy(w, part, static_cast<size_t>(run));
      w += run;
    }
  }
}

// ONNX Split of x along axis into parts of `sizes` (summing to the axis), each into its ORT buffer (outs[k], None
// for a new array).
py::tuple SplitPy(const py::object& x_in, int64_t axis, const py::object& sizes_in, int threads, const py::args& outs) {
  const py::array x = Plain("split", x_in);
  const Dims sizes = IntsOf<Dims>(sizes_in);  // a bound step's list read without pybind11's list caster
  const Dims xs = ShapeOf(x);
  const size_t a = AxisOf("split", axis, xs);
  int64_t total = 0;
  for (int64_t s : sizes) total += s < 0 ? xs[a] + 1 : s;  // a negative size can never sum right
  if (total != xs[a] || (outs.size() != 0 && outs.size() != sizes.size()))
    throw std::invalid_argument("split: sizes " + DimsText(sizes) + " do not split axis " + std::to_string(a) + " of " +
                                DimsText(xs) + " (or not one out per part)");
  const auto [outer, unit] = AxisRows(xs, a, x.itemsize());
  py::tuple ys(sizes.size());
  PartRuns runs(sizes.size());  // each part's data and its run in a row of x
  int64_t min_run = xs[a] * unit;
  const py::dtype dtype = x.dtype();
  Dims dims = xs;  // each part's dims in turn
  for (size_t k = 0; k < sizes.size(); ++k) {
    dims[a] = sizes[k];
    py::array y = Result("split", dtype, dims, outs.size() ? py::reinterpret_borrow<py::object>(outs[k]) : py::none());
    runs[k] = {static_cast<char*>(y.mutable_data()), sizes[k] * unit};
    if (sizes[k] != 0) min_run = std::min(min_run, sizes[k] * unit);
    ys[k] = std::move(y);
  }
  const auto* src = static_cast<const char*>(x.data());
  const int64_t row = xs[a] * unit;
  if (row <= kTaskBytes && min_run >= kSplitRowRun) {
    // One pass over x's rows, each cut into its parts in turn: x read once in order, and one parallel loop
    ForUnits(outer, row, threads,
             [&](int64_t lo, int64_t hi) { RowsOfParts<true>(const_cast<char*>(src), runs, row, lo, hi); });
    return ys;
  }
  int64_t at = 0;  // long rows (split in tasks within a part) or short runs (a fixed-size copy per part)
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t run = sizes[k] * unit;
    RunStrided({{outer, run}, {run, 1}, {row, 1}, 1}, runs[k].data, src + at * unit, threads);
    at += sizes[k];
  }
  return ys;
}

// ONNX Concat of parts of one dtype along axis, into out (ORT's buffer) or a new array.
py::array ConcatIntoPy(int64_t axis, const py::object& out, int threads, const py::args& parts_in) {
  if (parts_in.size() == 0) throw std::invalid_argument("concat_into: no inputs");
  std::vector<py::array> parts;
  parts.reserve(parts_in.size());
  for (const py::handle h : parts_in) parts.push_back(Plain("concat_into", py::reinterpret_borrow<py::object>(h)));
  const Dims first = ShapeOf(parts[0]);
  const size_t a = AxisOf("concat_into", axis, first);
  Dims dims = first;
  dims[a] = 0;
  const py::dtype dtype = parts[0].dtype();
  for (const py::array& p : parts) {
    bool ok = static_cast<size_t>(p.ndim()) == first.size() && (&p == &parts[0] || p.dtype().equal(dtype));
    for (size_t i = 0; ok && i < first.size(); ++i) ok = i == a || p.shape(i) == first[i];
    if (!ok)
      throw std::invalid_argument("concat_into: input " + DimsText(ShapeOf(p)) + " (" +
                                  std::string(py::str(p.dtype())) + ") does not match " + DimsText(first) + " (" +
                                  std::string(py::str(dtype)) + ") off axis " + std::to_string(a));
    dims[a] += p.shape(a);
  }
  py::array y = Result("concat_into", dtype, dims, out);
  const auto [outer, unit] = AxisRows(dims, a, parts[0].itemsize());
  auto* dst = static_cast<char*>(y.mutable_data());
  const int64_t row = dims[a] * unit;
  int64_t min_run = row;
  PartRuns runs(parts.size());  // each part's data and its run in a row of y
  for (size_t k = 0; k < parts.size(); ++k) {
    runs[k] = {static_cast<char*>(const_cast<void*>(parts[k].data())), parts[k].shape(a) * unit};
    if (parts[k].shape(a) != 0) min_run = std::min(min_run, runs[k].run);
  }
  if (row <= kTaskBytes && min_run >= kSplitRowRun) {
    // One pass over y's rows, each assembled from its parts in turn: y written once in order, one parallel loop
    ForUnits(outer, row, threads, [&](int64_t lo, int64_t hi) { RowsOfParts<false>(dst, runs, row, lo, hi); });
    return y;
  }
  for (const py::array& p : parts) {  // long rows (split in tasks within a part) or short runs (fixed-size copies)
    const int64_t run = p.shape(a) * unit;
    RunStrided({{outer, run}, {dims[a] * unit, 1}, {run, 1}, 1}, dst, static_cast<const char*>(p.data()), threads);
    dst += run;
  }
  return y;
}

// ---- GatherND, ScatterND: rows at index tuples ------------------------------------------------------------------

// Byte offsets of the rows that `q`-tuples of int64 indices name in `dims` (row strides `strides`), `n_batch` blocks
// of `per_batch` tuples, block b `batch_bytes` further; an index outside [-dim, dim) raises IndexError naming it.
[[noreturn]] void TupleIndexError(const char* op, const Dims& dims, int64_t v) {
  throw py::index_error(std::string(op) + ": indices outside the data dims " + DimsText(dims) +
                        ", index = " + std::to_string(v));
}

std::vector<int64_t> TupleOffsets(const char* op, const int64_t* idx, int64_t n_batch, int64_t per_batch,
                                  const Dims& dims, const Dims& strides, int64_t batch_bytes) {
  const size_t q = dims.size();
  std::vector<int64_t> offsets(static_cast<size_t>(n_batch * per_batch));
  // plain pointers held across the loop: the stores to offsets cannot move them
  const int64_t *d = dims.data(), *st = strides.data();
  int64_t* out = offsets.data();
  for (int64_t b = 0; b < n_batch; ++b)
    for (int64_t t = 0; t < per_batch; ++t, idx += q) {
      int64_t off = b * batch_bytes;
      for (size_t k = 0; k < q; ++k) {
        const int64_t v = idx[k];
        if (v < -d[k] || v >= d[k]) TupleIndexError(op, dims, v);
        off += (v < 0 ? v + d[k] : v) * st[k];
      }
      *out++ = off;
    }
  return offsets;
}

py::array Int64Indices(const char* fn, const py::object& h) {
  py::array idx = Plain(fn, h);
  if (!idx.dtype().equal(py::dtype::of<int64_t>()) || idx.ndim() < 1)
    throw std::invalid_argument(std::string(fn) + ": indices must be int64 of rank >= 1, got " +
                                std::string(py::str(idx.dtype())) + DimsText(ShapeOf(idx)));
  return idx;
}

struct OffsetRows {
  const char* x;
  char* out;
  const int64_t* offsets;
  int64_t row, lo, hi;

  template <size_t B>
  void Rows() const {
    for (int64_t r = lo; r < hi; ++r) CopyRow<B>(out + r * row, x + offsets[r], static_cast<size_t>(row));
  }
};

// ONNX GatherND: out[b..., m...] = x[b..., *indices[b..., m..., :]] over batch_dims leading axes.
py::array GatherNdPy(const py::object& x_in, const py::object& idx_in, int64_t batch_dims, const py::object& out,
                     int threads) {
  const py::array x = Plain("gather_nd", x_in), idx = Int64Indices("gather_nd", idx_in);
  const Dims xs = ShapeOf(x), is = ShapeOf(idx);
  const auto b = static_cast<size_t>(batch_dims);
  const int64_t q = is.back();
  bool ok = batch_dims >= 0 && b < is.size() && q >= 1 && static_cast<size_t>(q) + b <= xs.size();
  for (size_t i = 0; ok && i < b; ++i) ok = is[i] == xs[i];
  if (!ok)
    throw std::invalid_argument("gather_nd: indices " + DimsText(is) + " do not index data " + DimsText(xs) +
                                " with batch_dims " + std::to_string(batch_dims));
  const Dims tuple_dims(xs.begin() + b, xs.begin() + b + q);
  const Dims strides = CStrides(Dims(xs.begin() + b, xs.end()), x.itemsize());
  const int64_t n_batch = Product(xs, 0, b), row = Product(xs, b + q, xs.size()) * x.itemsize();
  const int64_t per_batch = Product(is, b, is.size() - 1);
  const std::vector<int64_t> offsets =
      TupleOffsets("GatherND", static_cast<const int64_t*>(idx.data()), n_batch, per_batch, tuple_dims,
                   Dims(strides.begin(), strides.begin() + q), Product(xs, b, xs.size()) * x.itemsize());
  Dims dims(is.begin(), is.end() - 1);
  dims.append(xs.begin() + b + q, xs.end());
  py::array y = Result("gather_nd", x.dtype(), dims, out);
  if (row == 0) return y;
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  ForUnits(n_batch * per_batch, row, threads,
           [&](int64_t lo, int64_t hi) { ByRowSize(row, OffsetRows{src, dst, offsets.data(), row, lo, hi}); });
  return y;
}

// ScatterND's reductions on one element, as the reference's numpy ufuncs compute them in the data's dtype.
enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction ReductionOf(const std::string& name) {
  if (name == "none") return Reduction::kNone;
  if (name == "add") return Reduction::kAdd;
  if (name == "mul") return Reduction::kMul;
  if (name == "max") return Reduction::kMax;
  if (name == "min") return Reduction::kMin;
  throw std::invalid_argument("scatter_nd: reduction '" + name + "' unknown (none, add, mul, max, min)");
}

template <typename T>
T Reduce(Reduction r, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {  // numpy's bool add/mul are or/and; max/min the same
    return (r == Reduction::kAdd || r == Reduction::kMax) ? (a || b) : (a && b);
  } else if constexpr (std::is_integral_v<T>) {  // wrapping, as numpy's integer ufuncs
    using W = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
    if (r == Reduction::kAdd) return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    if (r == Reduction::kMul) return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    return r == Reduction::kMax ? std::max(a, b) : std::min(a, b);
  } else {  // numpy's maximum/minimum keep a NaN from either side
    if (r == Reduction::kAdd) return a + b;
    if (r == Reduction::kMul) return a * b;
    if (r == Reduction::kMax) return (a >= b || std::isnan(a)) ? a : b;
    return (a <= b || std::isnan(a)) ? a : b;
  }
}

template <typename T>
void ReduceRow(Reduction r, T* d, const T* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Reduce<T>(r, d[i], s[i]);
}

// float16: each step in float32, rounded back (numpy's half loops), in blocks through the shared conversion rows.
void ReduceRowHalf(Reduction r, uint16_t* d, const uint16_t* s, int64_t n) {
  constexpr int64_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    HalfToFloatRow(d + i, a, m);
    HalfToFloatRow(s + i, b, m);
    ReduceRow<float>(r, a, b, m);
    FloatToHalfRow(a, d + i, m);
  }
}

// Applies every update row in index order to columns [c0, c1) of its data row; elements of numpy kind `kind` and
// `item` bytes (plain values: this runs without the GIL).
void ScatterColumns(Reduction r, char kind, int64_t item, char* out, const char* upd,
                    const std::vector<int64_t>& offsets, int64_t row_elems, int64_t c0, int64_t c1) {
  const int64_t n = c1 - c0;
  for (size_t k = 0; k < offsets.size(); ++k) {
    char* d = out + offsets[k] + c0 * item;
    const char* s = upd + (static_cast<int64_t>(k) * row_elems + c0) * item;
    if (r == Reduction::kNone) {
      std::memcpy(d, s, static_cast<size_t>(n * item));
    } else if (kind == 'b') {
      ReduceRow(r, reinterpret_cast<bool*>(d), reinterpret_cast<const bool*>(s), n);
    } else if (kind == 'f') {
      if (item == 2) ReduceRowHalf(r, reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(s), n);
      if (item == 4) ReduceRow(r, reinterpret_cast<float*>(d), reinterpret_cast<const float*>(s), n);
      if (item == 8) ReduceRow(r, reinterpret_cast<double*>(d), reinterpret_cast<const double*>(s), n);
    } else if (kind == 'i') {
      if (item == 1) ReduceRow(r, reinterpret_cast<int8_t*>(d), reinterpret_cast<const int8_t*>(s), n);
      if (item == 2) ReduceRow(r, reinterpret_cast<int16_t*>(d), reinterpret_cast<const int16_t*>(s), n);
      if (item == 4) ReduceRow(r, reinterpret_cast<int32_t*>(d), reinterpret_cast<const int32_t*>(s), n);
      if (item == 8) ReduceRow(r, reinterpret_cast<int64_t*>(d), reinterpret_cast<const int64_t*>(s), n);
    } else {
      if (item == 1) ReduceRow(r, reinterpret_cast<uint8_t*>(d), reinterpret_cast<const uint8_t*>(s), n);
      if (item == 2) ReduceRow(r, reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(s), n);
      if (item == 4) ReduceRow(r, reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(s), n);
      if (item == 8) ReduceRow(r, reinterpret_cast<uint64_t*>(d), reinterpret_cast<const uint64_t*>(s), n);
    }
  }
}

bool Reducible(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto item = dt.itemsize();
  if (kind == 'b') return item == 1;
  if (kind == 'f') return item == 2 || item == 4 || item == 8;
  return (kind == 'i' || kind == 'u') && (item == 1 || item == 2 || item == 4 || item == 8);
}

// ONNX ScatterND: a copy of x with the update rows written (or reduced) at the index tuples, in index order (with
// duplicate indices and reduction none the last wins, as the reference).
py::array ScatterNdPy(const py::object& x_in, const py::object& idx_in, const py::object& upd_in,
                      const std::string& reduction, const py::object& out, int threads) {
  const py::array x = Plain("scatter_nd", x_in), idx = Int64Indices("scatter_nd", idx_in);
  const py::array upd = Plain("scatter_nd", upd_in);
  const Reduction r = ReductionOf(reduction);
  const Dims xs = ShapeOf(x), is = ShapeOf(idx), us = ShapeOf(upd);
  const int64_t q = is.back();
  Dims want(is.begin(), is.end() - 1);
  if (q >= 1 && static_cast<size_t>(q) <= xs.size()) want.append(xs.begin() + q, xs.end());
  if (q < 1 || static_cast<size_t>(q) > xs.size() || us != want || !upd.dtype().equal(x.dtype()))
    throw std::invalid_argument("scatter_nd: updates " + DimsText(us) + " do not fit indices " + DimsText(is) +
                                " into data " + DimsText(xs) + " (or differ in dtype)");
  if (r != Reduction::kNone && !Reducible(x.dtype()))
    throw std::invalid_argument("scatter_nd: reduction '" + reduction + "' on " + std::string(py::str(x.dtype())));
  const Dims strides = CStrides(xs, x.itemsize());
  const std::vector<int64_t> offsets =
      TupleOffsets("ScatterND", static_cast<const int64_t*>(idx.data()), 1, Product(is, 0, is.size() - 1),
                   Dims(xs.begin(), xs.begin() + q), Dims(strides.begin(), strides.begin() + q), 0);
  py::array y = Result("scatter_nd", x.dtype(), xs, out);
  auto* dst = static_cast<char*>(y.mutable_data());
  const auto* src = static_cast<const char*>(x.data());
  const int64_t row_elems = Product(xs, static_cast<size_t>(q), xs.size());
  const char kind = x.dtype().kind();
  const int64_t item = x.itemsize();
  const auto* u = static_cast<const char*>(upd.data());
  const int64_t row_bytes = row_elems * item;
  if (r == Reduction::kNone && dst != src && row_bytes >= kPickRowBytes) {
    // Each row of the result is x's or its last update's: written once, from one of them (x's rows an update
    // replaces are not copied first); runs of rows no update touches are one copy.
    std::vector<int64_t> last(static_cast<size_t>(Product(xs, 0, static_cast<size_t>(q))), -1);
    for (size_t k = 0; k < offsets.size(); ++k)
      last[static_cast<size_t>(offsets[k] / row_bytes)] = static_cast<int64_t>(k);
    ForUnits(static_cast<int64_t>(last.size()), row_bytes, threads, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi;) {
        const int64_t k = last[static_cast<size_t>(i)];
        int64_t j = i + 1;
        if (k >= 0) {
          std::memcpy(dst + i * row_bytes, u + k * row_bytes, static_cast<size_t>(row_bytes));
        } else {
          while (j < hi && last[static_cast<size_t>(j)] < 0) ++j;
          std::memcpy(dst + i * row_bytes, src + i * row_bytes, static_cast<size_t>((j - i) * row_bytes));
        }
        i = j;
      }
    });
    return y;
  }
  if (dst != src)
    ForUnits(x.nbytes(), 1, threads,
             [&](int64_t lo, int64_t hi) { std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo)); });
  // One contiguous column range per thread: each element still sees its updates in index order, so the bits do not
  // depend on the split (narrow column tasks would walk the rows once per task, 4 KB apart).
  const int64_t parts = std::min<int64_t>(ThreadsFor(threads, upd.nbytes()), std::max<int64_t>(row_elems, 1));
  auto scatter = [&](int64_t t) {
    ScatterColumns(r, kind, item, dst, u, offsets, row_elems, row_elems * t / parts, row_elems * (t + 1) / parts);
  };
  if (static_cast<size_t>(upd.nbytes()) < kReleaseGilBytes) {
    scatter(0);  // parts is 1 below the parallel threshold
  } else {
    py::gil_scoped_release release;
    ParallelFor(static_cast<int>(parts), parts, scatter);
  }
  return y;
}

}  // namespace

void BindIndexing(py::module_& m) {
  m.def("gather", &GatherPy, py::arg("x"), py::arg("indices"), py::arg("axis"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "ONNX Gather of x's slices along axis at int32/int64 indices ([-dim, dim), negatives from the end; others "
        "raise IndexError), any dtype, into out (ORT's buffer) or a new array");
  m.def("slice_copy", &SliceCopyPy, py::arg("x"), py::arg("starts"), py::arg("steps"), py::arg("dims"),
        py::arg("out") = py::none(), py::arg("threads") = 1,
        "ONNX Slice after its clamping: per axis dims[a] elements from starts[a] by steps[a] of x (any layout), "
        "into out (ORT's buffer) or a new C-order array");
  m.def("split", &SplitPy, py::arg("x"), py::arg("axis"), py::arg("sizes"), py::arg("threads"),
        "ONNX Split of x along axis into parts of sizes, each into the matching remaining positional argument "
        "(ORT's buffer, or None) or a new array; returns the tuple of parts");
  m.def("concat_into", &ConcatIntoPy, py::arg("axis"), py::arg("out"), py::arg("threads"),
        "ONNX Concat of the remaining positional arguments (arrays of one dtype) along axis into out (ORT's "
        "buffer) or, when out is None, a new array");
  m.def("gather_nd", &GatherNdPy, py::arg("x"), py::arg("indices"), py::arg("batch_dims"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "ONNX GatherND with batch_dims, int64 indices ([-dim, dim), others raise IndexError), any dtype, into out "
        "(ORT's buffer) or a new array");
  m.def("scatter_nd", &ScatterNdPy, py::arg("x"), py::arg("indices"), py::arg("updates"), py::arg("reduction"),
        py::arg("out") = py::none(), py::arg("threads") = 1,
        "ONNX ScatterND: a copy of x with updates written (reduction none) or reduced (add/mul/max/min, in x's "
        "dtype as numpy's ufuncs) at int64 index tuples, in index order, into out (ORT's buffer) or a new array");
}

}  // namespace npu_ep::kern
