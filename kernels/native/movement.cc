// Data movement for the bound steps of kernels/ops/movement.py: Expand (`kernels.expand`, a broadcast copy) and
// Tile (`kernels.tile`, the same copy of x viewed with a 1 before each axis); BindMovement also registers the
// kernels of transpose.cc, pad.cc and trilu.cc. The copies
// move whole contiguous runs with memcpy, which is where the reference's numpy calls lose their time: a decoder's
// repeat_kv Expand copies 64 KB runs, and numpy's copy of a broadcast view walks them 128 bytes at a time. Values
// are moved, never computed, so the results equal the reference's bit for bit for every dtype. An Expand output of
// kStreamBytes or more is written with non-temporal stores (StreamRun): past half the L3 it would evict the caches
// anyway, and a store that skips them reads no line for ownership first.
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

// Tile views x with a 1 before each axis: twice numpy's axes.
using AxisInts = InlineInts<2 * kMaxAxes>;

// Writes `copies` copies of the first `chunk` bytes at `out` after it, doubling what one memcpy moves.
void Replicate(char* out, size_t chunk, py::ssize_t copies) {
  size_t done = chunk, total = chunk * static_cast<size_t>(copies);
  while (done < total) {
    const size_t n = std::min(done, total - done);
    std::memcpy(out + done, out, n);
    done += n;
  }
}

#if NPU_EP_X86
// dst[0, n) = src[0, n) with non-temporal stores from dst's first 32-byte boundary (memcpy around them), fenced.
__attribute__((target("avx2"))) void StreamRun(char* dst, const char* src, size_t n) {
  size_t i = std::min(n, (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31);
  std::memcpy(dst, src, i);
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}

// Half a 32 MB L3: below it the next reader of the output finds much of it in the caches, which streaming forgoes.
constexpr int64_t kStreamBytes = int64_t{1} << 24;
#endif

// A broadcast copy: output dims `out`, input strides `in_strides` (bytes; 0 on broadcast axes), output strides
// `out_strides` (bytes); axes from `contiguous` on are one run of `run` bytes in both. `stream`: runs by StreamRun.
struct Broadcast {
  AxisInts out, in_strides, out_strides;
  size_t contiguous = 0, run = 0;
  RunCopier copy;
  bool stream = false;

  void Fill(char* dst, const char* src, size_t axis) const {
    if (axis == contiguous) {
      copy(dst, src, run);
      return;
    }
    // one run out[axis] times: each copy from the input (reading back the run just written costs more)
    if (in_strides[axis] == 0 && axis + 1 == contiguous) {
      for (py::ssize_t i = 0; i < out[axis]; ++i) copy(dst + i * out_strides[axis], src, run);
      return;
    }
    if (in_strides[axis] == 0) {  // the same sub-block out[axis] times: write it once, then replicate it
      Fill(dst, src, axis + 1);
      Replicate(dst, static_cast<size_t>(out_strides[axis]), out[axis]);
      return;
    }
    for (py::ssize_t i = 0; i < out[axis]; ++i) Fill(dst + i * out_strides[axis], src + i * in_strides[axis], axis + 1);
  }
};

constexpr int64_t kTaskBytes = int64_t{1} << 16;  // output bytes per parallel task
constexpr size_t kParallelRun = 256;  // shorter runs stay on one thread: Fill's doubling copies move them in bulk

// Runs [lo, hi) of a broadcast, bytes [first, first + len) of each: run i is the output's bytes from i * run, read
// from where its index over the axes before `contiguous` points in the input.
void CopyRuns(const Broadcast& b, char* dst, const char* src, int64_t lo, int64_t hi, size_t first, size_t len) {
  AxisInts at(b.contiguous);
  int64_t rest = lo, s = 0;
  for (size_t a = b.contiguous; a-- > 0;) {
    at[a] = rest % b.out[a];
    rest /= b.out[a];
    s += at[a] * b.in_strides[a];
  }
  for (int64_t i = lo; i < hi; ++i) {
#if NPU_EP_X86
    if (b.stream)
      StreamRun(dst + i * static_cast<int64_t>(b.run) + first, src + s + first, len);
    else
#endif
      b.copy(dst + i * static_cast<int64_t>(b.run) + first, src + s + first, len);
    for (size_t a = b.contiguous; a-- > 0;) {  // the next run: an odometer over the outer axes
      s += b.in_strides[a];
      if (++at[a] < b.out[a]) break;
      s -= b.in_strides[a] * b.out[a];
      at[a] = 0;
    }
  }
}

// The broadcast over `threads` threads (1 MB of output or more, runs of kParallelRun bytes or more): runs in tasks of
// about kTaskBytes, a longer run in parts of one; each run copied from the input (the bytes never depend on the
// split).
void ParallelFill(const Broadcast& b, char* dst, const char* src, int64_t total, int threads) {
  const auto run = static_cast<int64_t>(b.run);
  const int64_t runs = total / run;
  const int64_t parts = std::max<int64_t>(1, run / kTaskBytes);
  const int64_t part = (run + parts - 1) / parts;
  if (parts == 1) {
    const int64_t per_task = std::max<int64_t>(1, kTaskBytes / run);
    ParallelFor(threads, (runs + per_task - 1) / per_task,
                [&](int64_t t) { CopyRuns(b, dst, src, t * per_task, std::min(runs, (t + 1) * per_task), 0, b.run); });
    return;
  }
  ParallelFor(threads, runs * parts, [&](int64_t t) {
    const int64_t first = (t % parts) * part;
    CopyRuns(b, dst, src, t / parts, t / parts + 1, static_cast<size_t>(first),
             static_cast<size_t>(std::min(part, run - first)));
  });
}

// y = x broadcast from `in_dims` (x's dims with 1s where it repeats) to `out` (same rank), in C order; `stream`:
// non-temporal stores from kStreamBytes of output and runs of kParallelRun bytes (on AVX2).
void BroadcastCopy(const py::array& x, const AxisInts& in_dims, Broadcast& b, py::array& y, int threads,
                   bool stream = false) {
  const AxisInts& out = b.out;
  const auto rank = static_cast<py::ssize_t>(out.size());
  const auto item = static_cast<py::ssize_t>(x.itemsize());
  b.in_strides.resize(out.size());
  b.out_strides.resize(out.size());
  b.contiguous = out.size();
  py::ssize_t in_stride = item, out_stride = item;
  for (py::ssize_t i = rank - 1; i >= 0; --i) {
    b.in_strides[i] = in_dims[i] == 1 ? 0 : in_stride;
    b.out_strides[i] = out_stride;
    in_stride *= in_dims[i];
    out_stride *= out[i];
  }
  b.run = static_cast<size_t>(item);
  while (b.contiguous > 0 && in_dims[b.contiguous - 1] == out[b.contiguous - 1]) {
    --b.contiguous;
    b.run *= static_cast<size_t>(out[b.contiguous]);
  }
  auto* dst = static_cast<char*>(y.mutable_data());
  const auto* src = static_cast<const char*>(x.data());
  const auto total = static_cast<int64_t>(y.nbytes());
  const int use = b.run >= kParallelRun ? ThreadsFor(threads, total) : 1;
#if NPU_EP_X86
  b.stream = stream && total >= kStreamBytes && b.run >= kParallelRun && ActiveIsa() >= Isa::kAvx2;
#endif
  RunMoving(static_cast<size_t>(total), [&] {
    if (use > 1 || b.stream)
      ParallelFill(b, dst, src, total, use);
    else
      b.Fill(dst, src, 0);
  });
}

// ONNX Expand: x broadcast against `shape` both ways (numpy's rules), materialized (into `out` when given).
py::array ExpandPy(const py::object& x_in, const py::object& shape_in, const py::object& out_buffer, int threads) {
  const py::array x = CArray(x_in);  // a strided x is copied first, as numpy reads it
  // a bound step's tuple read without pybind11's list caster
  const SmallDims shape = IntsOf<SmallDims>(shape_in);
  if (x.dtype().kind() == 'O') throw std::invalid_argument("expand: object arrays are not supported");
  const auto rank = static_cast<py::ssize_t>(std::max<size_t>(shape.size(), static_cast<size_t>(x.ndim())));
  AxisInts in_dims(rank, 1);
  Broadcast b;
  AxisInts& out = b.out;
  out.assign(rank, 1);
  for (py::ssize_t i = 0; i < x.ndim(); ++i) in_dims[rank - x.ndim() + i] = x.shape(i);
  for (size_t i = 0; i < shape.size(); ++i) out[rank - shape.size() + i] = shape[i];
  for (py::ssize_t i = 0; i < rank; ++i) {
    if (in_dims[i] == out[i] || out[i] == 1) {
      out[i] = in_dims[i];
    } else if (in_dims[i] != 1) {
      throw std::invalid_argument("expand: input shape " + DimsText(SmallDimsOf(x)) + " does not broadcast to " +
                                  DimsText(shape));
    }
  }
  py::array y = MovementResult("expand", x.dtype(), out.data(), out.size(), out_buffer);
  if (y.size() != 0) BroadcastCopy(x, in_dims, b, y, threads, true);
  return y;
}

// ONNX Tile: x repeated `repeats[i]` times along each axis i, which is the broadcast of x viewed as
// [1, d0, 1, d1, ...] to [r0, d0, r1, d1, ...] (into `out` when given).
py::array TilePy(const py::object& x_in, const py::object& repeats_in, const py::object& out_buffer, int threads) {
  const py::array x = CArray(x_in);  // a strided x is copied first, as numpy reads it
  const SmallDims repeats = IntsOf<SmallDims>(repeats_in);  // a bound step's tuple without pybind11's list caster
  const bool negative = std::any_of(repeats.begin(), repeats.end(), [](int64_t r) { return r < 0; });
  if (x.dtype().kind() == 'O' || static_cast<py::ssize_t>(repeats.size()) != x.ndim() || negative)
    throw std::invalid_argument("tile: repeats " + DimsText(repeats) + " do not match input shape " +
                                DimsText(SmallDimsOf(x)) + " (one count >= 0 per axis, no object arrays)");
  AxisInts in_dims;
  Broadcast b;
  SmallDims result;
  for (py::ssize_t i = 0; i < x.ndim(); ++i) {
    in_dims.push_back(1);
    in_dims.push_back(x.shape(i));
    b.out.push_back(repeats[i]);
    b.out.push_back(x.shape(i));
    result.push_back(repeats[i] * x.shape(i));
  }
  py::array y = MovementResult("tile", x.dtype(), result.data(), result.size(), out_buffer);
  if (y.size() != 0) BroadcastCopy(x, in_dims, b, y, threads);
  return y;
}

}  // namespace

void BindTranspose(py::module_&);
void BindPad(py::module_&);
void BindTrilu(py::module_&);

void BindMovement(py::module_& m) {
  m.def("expand", &ExpandPy, py::arg("x"), py::arg("shape"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "ONNX Expand: x broadcast against shape both ways (numpy's rules), as a C-contiguous array, into out (ORT's "
        "buffer) or a new array; from 1 MB of output on `threads` threads");
  m.def("tile", &TilePy, py::arg("x"), py::arg("repeats"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "ONNX Tile: x repeated repeats[i] times along each axis i, as a C-contiguous array, into out (ORT's buffer) "
        "or a new array; from 1 MB of output on `threads` threads");
  BindTranspose(m);  // transpose.cc
  BindPad(m);        // pad.cc
  BindTrilu(m);      // trilu.cc
}

}  // namespace npu_ep::kern
