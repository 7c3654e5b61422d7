// com.microsoft EmbedLayerNormalization (`kernels.embed_layernorm`) for kernels/ops/embed_layernorm.py, float32,
// with the reference's bits: per token row e = word[id] + position[pos] (+ segment[seg]), mean = (0 + sum(e)) / d,
// c = e - mean, var = (0 + sum(c * c)) / d, y = c / sqrt(var + epsilon) * gamma + beta, each operation rounded to
// float32 in that order (no fused multiply-adds); the sums in numpy's pairwise order (np.add.reduce's over a
// contiguous row: under 8 values one by one, up to 128 in eight running sums combined ((0+1)+(2+3))+((4+5)+(6+7))
// and the rest one by one, longer rows split at half rounded down to a multiple of 8). Every index is checked before
// anything is written: one outside its table is a ValueError naming the table, as the reference's. mask_index is the
// count of mask entries equal to 1 per batch row (zeros without a mask). segment_ids and position_ids may be
// [1, S] (one row for every batch row, as the reference broadcasts them). Rows run in parallel tasks.
#if !defined(__clang__)     // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the element-wise loops vectorize (plain float operations: O3 changes no value)
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // the reference's separate multiply and add roundings
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "pairwise_sum.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F32 = py::array_t<float, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;

struct Tables {
  const float *word, *pos, *seg, *gamma, *beta;
  int64_t d;
  float epsilon;
};

// One token row: e (the embedding sum, kept when `sum` is given) and its normalization y; c is a scratch row.
void NormRow(const Tables& t, int64_t id, int64_t p, int64_t g, float* y, float* sum, float* c) {
  const int64_t d = t.d;
  const float* w = t.word + id * d;
  const float* ps = t.pos + p * d;
  float* e = sum != nullptr ? sum : y;
  for (int64_t i = 0; i < d; ++i) e[i] = w[i] + ps[i];
  if (t.seg != nullptr) {
    const float* s = t.seg + g * d;
    for (int64_t i = 0; i < d; ++i) e[i] += s[i];
  }
  const auto fd = static_cast<float>(d);
  const float mean = (0.0f + PairwiseSum(e, d)) / fd;
  for (int64_t i = 0; i < d; ++i) c[i] = e[i] - mean;
  for (int64_t i = 0; i < d; ++i) y[i] = c[i] * c[i];  // y holds the squares until the last pass
  const float denom = std::sqrt((0.0f + PairwiseSum(y, d)) / fd + t.epsilon);
  for (int64_t i = 0; i < d; ++i) {
    const float v = c[i] / denom * t.gamma[i];
    y[i] = v + t.beta[i];
  }
}

// ids must lie in [0, rows): else the reference's ValueError naming the table.
void CheckIndices(const int32_t* ids, int64_t n, int64_t rows, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      throw std::invalid_argument(std::string("EmbedLayerNormalization: ") + what + " index out of range [0, " +
                                  std::to_string(rows) + ")");
}

void CheckTable(const F32& t, int64_t d, const char* what) {
  if (t.ndim() != 2 || t.shape(1) != d)
    throw std::invalid_argument(std::string("embed_layernorm: ") + what + " must be [rows, " + std::to_string(d) +
                                "], got rank " + std::to_string(t.ndim()));
}

// `into` when it is a writeable C-order array of T with dims' size (ORT's buffer), else a new [dims] array.
template <typename T>
py::array_t<T, py::array::c_style> Result(const py::object& into, std::vector<py::ssize_t> dims) {
  using A = py::array_t<T, py::array::c_style>;
  py::ssize_t n = 1;
  for (const py::ssize_t d : dims) n *= d;
  if (A::check_(into)) {
    auto a = py::reinterpret_borrow<A>(into);
    if (a.writeable() && a.size() == n) return a;
  }
  return A(std::move(dims));
}

py::tuple EmbedLayerNormPy(const py::object& ids_in, const py::object& seg_ids, const py::object& word_in,
                           const py::object& pos_in, const py::object& seg_table, const py::object& gamma_in,
                           const py::object& beta_in, const py::object& mask, const py::object& pos_ids, float epsilon,
                           bool want_sum, const py::object& out, int threads, const py::object& mask_out,
                           const py::object& sum_out) {
  const I32 ids = AsArray<int32_t>(ids_in, "embed_layernorm", "input_ids");
  const F32 word = AsArray<float>(word_in, "embed_layernorm", "word_embedding"),
            pos = AsArray<float>(pos_in, "embed_layernorm", "position_embedding");
  const F32 gamma = AsArray<float>(gamma_in, "embed_layernorm", "gamma"),
            beta = AsArray<float>(beta_in, "embed_layernorm", "beta");
  if (ids.ndim() != 2) throw std::invalid_argument("embed_layernorm: input_ids must be [batch, sequence]");
  const int64_t b = ids.shape(0), s = ids.shape(1), d = word.ndim() == 2 ? word.shape(1) : -1;
  CheckTable(word, d, "word_embedding");
  CheckTable(pos, d, "position_embedding");
  if (gamma.size() != d || beta.size() != d)
    throw std::invalid_argument("embed_layernorm: gamma and beta must hold " + std::to_string(d) + " values");
  if (seg_ids.is_none() != seg_table.is_none())
    throw std::invalid_argument("embed_layernorm: segment_ids and segment_embedding go together");
  const auto as_ids = [&](const py::object& o, const char* what) {
    I32 a = AsArray<int32_t>(o, "embed_layernorm", what);
    const bool ok = a.ndim() == 2 && a.shape(1) == s && (a.shape(0) == b || a.shape(0) == 1);
    if (!ok) throw std::invalid_argument(std::string("embed_layernorm: ") + what + " must be [batch, sequence]");
    return a;
  };
  std::optional<I32> seg, msk, pids;  // a default array would be a new empty one per call
  std::optional<F32> segt;
  const bool has_seg = !seg_ids.is_none(), has_mask = !mask.is_none(), has_pids = !pos_ids.is_none();
  if (has_seg) {
    seg = as_ids(seg_ids, "segment_ids");
    segt = AsArray<float>(seg_table, "embed_layernorm", "segment_embedding");
    CheckTable(*segt, d, "segment_embedding");
  }
  if (has_mask) msk = as_ids(mask, "mask");
  if (has_pids) pids = as_ids(pos_ids, "position_ids");
  CheckIndices(ids.data(), ids.size(), word.shape(0), "input_ids");
  if (has_pids) {
    CheckIndices(pids->data(), pids->size(), pos.shape(0), "position");
  } else if (s > pos.shape(0)) {
    throw std::invalid_argument("EmbedLayerNormalization: position index out of range [0, " +
                                std::to_string(pos.shape(0)) + ")");
  }
  if (has_seg) CheckIndices(seg->data(), seg->size(), segt->shape(0), "segment_ids");

  F32 y;
  if (out.is_none()) {
    y = F32({b, s, d});
  } else {
    if (!py::isinstance<F32>(out) || !py::reinterpret_borrow<py::array>(out).writeable() ||
        py::reinterpret_borrow<py::array>(out).size() != b * s * d)
      throw std::invalid_argument("embed_layernorm: out must be a writeable C-order float32 array of " +
                                  std::to_string(b * s * d) + " elements");
    y = py::reinterpret_borrow<F32>(out);
  }
  std::optional<F32> sum;
  if (want_sum) sum = Result<float>(sum_out, {b, s, d});
  I32 mask_index = Result<int32_t>(mask_out, {b});
  for (int64_t i = 0; i < b; ++i) {
    int32_t count = 0;
    if (has_mask)
      for (int64_t j = 0; j < s; ++j) count += msk->data()[(msk->shape(0) == 1 ? 0 : i) * s + j] == 1;
    mask_index.mutable_data()[i] = count;
  }
  const Tables t{word.data(), pos.data(), has_seg ? segt->data() : nullptr, gamma.data(), beta.data(), d, epsilon};
  const int32_t* pid = has_pids ? pids->data() : nullptr;
  const bool pid_rows = has_pids && pids->shape(0) == b;
  const int32_t* sid = has_seg ? seg->data() : nullptr;
  const bool sid_rows = has_seg && seg->shape(0) == b;
  float* py_ = y.mutable_data();
  float* ps = want_sum ? sum->mutable_data() : nullptr;
  const int32_t* id = ids.data();
  {
    py::gil_scoped_release release;
    const int64_t rows = b * s, per = std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1));
    ParallelFor(ThreadsFor(threads, rows * d * 8), (rows + per - 1) / per, [&](int64_t task) {
      std::vector<float> c(static_cast<size_t>(d));
      for (int64_t r = task * per; r < std::min(rows, (task + 1) * per); ++r) {
        const int64_t j = r % s;
        const int64_t p = pid == nullptr ? j : pid[(pid_rows ? r : j)];
        const int64_t g = sid == nullptr ? 0 : sid[(sid_rows ? r : j)];
        NormRow(t, id[r], p, g, py_ + r * d, ps == nullptr ? nullptr : ps + r * d, c.data());
      }
    });
  }
  return py::make_tuple(y, mask_index, want_sum ? py::object(*sum) : py::object(py::none()));
}

}  // namespace

void BindEmbedLayerNorm(py::module_& m) {
  m.def("embed_layernorm", &EmbedLayerNormPy, py::arg("input_ids"), py::arg("segment_ids"), py::arg("word"),
        py::arg("position"), py::arg("segment"), py::arg("gamma"), py::arg("beta"), py::arg("mask"),
        py::arg("position_ids"), py::arg("epsilon"), py::arg("want_sum"), py::arg("out"), py::arg("threads"),
        py::arg("mask_out") = py::none(), py::arg("sum_out") = py::none(),
        "com.microsoft EmbedLayerNormalization in float32 with the reference's bits: (output [B, S, D], mask_index "
        "int32 [B], embedding_sum [B, S, D] or None); int32 ids [B, S] (position_ids [B, S] or [1, S]), float32 "
        "tables [rows, D]; output into out (ORT's buffer) when given; mask_index and embedding_sum into mask_out and "
        "sum_out when they are writeable C-order arrays of their dtype and size, else new arrays");
}

}  // namespace npu_ep::kern
