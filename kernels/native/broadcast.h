// ONNX (numpy) multidirectional broadcasting for the element-wise kernels (binary.cc, where.cc): the operands'
// shapes aligned from the right, size-1 output axes dropped and neighbouring axes that broadcast alike merged, so
// the innermost run is contiguous in the output and either contiguous or one repeated element in each operand
// ([N,C,H,W] + [1,C,1,1] is C rows of H*W against one value each). Operands are C-order arrays.
#pragma once

#include <pybind11/numpy.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace npu_ep::kern {

inline std::string ShapeText(const pybind11::array& a) {
  std::string s = "[";
  for (pybind11::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? "," : "") + std::to_string(a.shape(i));
  return s + "]";
}

// The broadcast of N operands as merged axes: extents (outermost first, at least one) and each operand's element
// stride per axis (0 where it repeats), plus the output shape and size.
template <size_t N>
struct Broadcast {
  std::vector<pybind11::ssize_t> out_shape;
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, N> strides;
  int64_t total = 1;
};

template <size_t N>
Broadcast<N> PlanBroadcast(const char* fn, const std::array<const pybind11::array*, N>& ops) {
  pybind11::ssize_t rank = 0;
  for (const auto* a : ops) rank = std::max(rank, a->ndim());
  // operand k's extent on output axis i (1 where it has no such axis), read from the array (no copies: a call's
  // plan makes only the vectors it returns)
  const auto ext = [&](size_t k, pybind11::ssize_t i) -> int64_t {
    const pybind11::ssize_t lead = rank - ops[k]->ndim();
    return i < lead ? 1 : static_cast<int64_t>(ops[k]->shape(i - lead));
  };
  Broadcast<N> p;
  p.out_shape.assign(static_cast<size_t>(rank), 1);
  for (pybind11::ssize_t i = 0; i < rank; ++i) {
    for (size_t k = 0; k < N; ++k) {
      const int64_t e = ext(k, i), d = p.out_shape[i];
      if (e != 1 && d != 1 && e != d) {
        std::string shapes;
        for (const auto* a : ops) shapes += (shapes.empty() ? "" : " and ") + ShapeText(*a);
        throw std::invalid_argument(std::string(fn) + ": shapes " + shapes + " do not broadcast (axis " +
                                    std::to_string(i) + ")");
      }
      if (e != 1) p.out_shape[i] = e;
    }
    p.total *= p.out_shape[i];
  }
  // Merge from the innermost axis out (built innermost first, reversed at the end); an operand's stride is the
  // product of its extents inside the axis.
  std::array<int64_t, N> stride;
  stride.fill(1);
  p.dims.reserve(static_cast<size_t>(std::max<pybind11::ssize_t>(rank, 1)));
  for (auto& s : p.strides) s.reserve(p.dims.capacity());
  for (pybind11::ssize_t i = rank - 1; i >= 0; --i) {
    const int64_t d = p.out_shape[i];
    if (d == 1) continue;
    bool same = !p.dims.empty();
    for (size_t k = 0; k < N && same; ++k) same = (ext(k, i) == 1) == (p.strides[k].back() == 0);
    if (same)
      p.dims.back() *= d;
    else
      p.dims.push_back(d);
    for (size_t k = 0; k < N; ++k) {
      const bool repeats = ext(k, i) == 1;
      if (!same) p.strides[k].push_back(repeats ? 0 : stride[k]);
      if (!repeats) stride[k] *= d;
    }
  }
  if (p.dims.empty()) {  // one element
    p.dims.push_back(1);
    for (auto& s : p.strides) s.push_back(0);
  }
  std::reverse(p.dims.begin(), p.dims.end());
  for (auto& s : p.strides) std::reverse(s.begin(), s.end());
  return p;
}

// Output elements [begin, end) as runs along the innermost merged axis: run(offsets of the N operands' first
// elements, their unit strides (0 or 1), output offset, length).
template <size_t N, typename Run>
void ForEachRun(const Broadcast<N>& p, int64_t begin, int64_t end, const Run& run) {
  const size_t inner = p.dims.size() - 1;
  const int64_t n = p.dims[inner];
  std::array<int64_t, N> unit, off;
  for (size_t k = 0; k < N; ++k) unit[k] = p.strides[k][inner] ? 1 : 0;
  for (int64_t at = begin; at < end;) {
    int64_t outer = at / n;
    const int64_t col = at - outer * n, len = std::min(n - col, end - at);
    for (size_t k = 0; k < N; ++k) off[k] = col * unit[k];
    for (size_t ax = inner; ax-- > 0;) {
      const int64_t idx = outer % p.dims[ax];
      outer /= p.dims[ax];
      for (size_t k = 0; k < N; ++k) off[k] += idx * p.strides[k][ax];
    }
    run(off, unit, at, len);
    at += len;
  }
}

// The result array: ``out`` when given (ORT's buffer: checked to be a writeable C-order array of ``dtype`` and the
// result's size), else a new array of the broadcast shape.
template <size_t N>
pybind11::array BroadcastResult(const char* fn, const pybind11::dtype& dtype, const Broadcast<N>& p,
                                const pybind11::object& out) {
  if (out.is_none()) return pybind11::array(dtype, p.out_shape);
  // null when out is not an array (a default pybind11::array would be a new empty numpy array per call)
  const auto y = pybind11::reinterpret_borrow<pybind11::array>(
      pybind11::isinstance<pybind11::array>(out) ? pybind11::handle(out) : pybind11::handle());
  if (!y || !y.dtype().equal(dtype) || !(y.flags() & pybind11::array::c_style) || !y.writeable() || y.size() != p.total)
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order " +
                                std::string(pybind11::str(dtype)) + " array of " + std::to_string(p.total) +
                                " elements");
  return y;
}

// ForEachRun over every output element in tasks of `task` elements on up to `threads` threads (one below
// `min_parallel` elements), without the GIL.
template <size_t N, typename Run>
void ParallelRuns(const Broadcast<N>& p, int threads, int64_t task, const Run& run,
                  int64_t min_parallel = kMinParallelWork) {
  pybind11::gil_scoped_release release;
  ParallelFor(p.total < min_parallel ? 1 : threads, (p.total + task - 1) / task,
              [&](int64_t t) { ForEachRun(p, t * task, std::min(p.total, (t + 1) * task), run); });
}

}  // namespace npu_ep::kern
