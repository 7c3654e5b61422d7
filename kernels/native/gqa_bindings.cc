// Python binding of the native GroupQueryAttention (`kernels.gqa`). Shapes, dtypes and contiguity are checked
// here, so a wrong call is a clear ValueError; the kernel then runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "gqa_bindings.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

// The message is built only on failure (a decode step makes ~15 checks; building strings would cost microseconds).
#define EXPECT(ok, what)                                                   \
  do {                                                                     \
    if (!(ok)) throw std::invalid_argument(std::string("gqa: ") + (what)); \
  } while (0)

// A C-contiguous array of the call's dtype (float32, or float16 when fp16) as given: no converting copy, so a
// wrong caller is an error, not a slow path.
const void* Tensor(const py::array& a, const char* name, py::ssize_t ndim, bool fp16) {
  const bool dtype_ok = a.dtype().kind() == 'f' && a.itemsize() == (fp16 ? 2 : 4);
  EXPECT(dtype_ok && (a.flags() & py::array::c_style) && a.ndim() == ndim,
         std::string(name) + " must be a C-contiguous " + (fp16 ? "float16" : "float32") + " array of rank " +
             std::to_string(ndim) + ", got " + Dims(a) + " " + std::string(py::str(a.dtype())));
  return a.data();
}

const float* F32(const py::array& a, const char* name, py::ssize_t ndim) {
  return static_cast<const float*>(Tensor(a, name, ndim, false));
}

// Query/key/value [B, S, W] whose rows (b, s) lie at one pitch with unit element stride: C-contiguous, or column
// slices of one [B, S, wider] product (a fused QKV group's outputs, read in place). Returns the data; *pitch is
// the row pitch in elements.
const void* Rows(const py::array& a, const char* name, bool fp16, int64_t* pitch) {
  const py::ssize_t item = fp16 ? 2 : 4;
  const bool dtype_ok = a.dtype().kind() == 'f' && a.itemsize() == item;
  bool rows_ok = dtype_ok && a.ndim() == 3;
  if (rows_ok) {  // strides of extent-1 axes mean nothing: the pitch comes from an axis that has rows
    const py::ssize_t row = a.shape(1) > 1 ? a.strides(1) : a.shape(0) > 1 ? a.strides(0) : a.shape(2) * item;
    rows_ok = (a.shape(2) <= 1 || a.strides(2) == item) && row % item == 0 && row >= a.shape(2) * item &&
              (a.shape(0) <= 1 || a.shape(1) <= 1 || a.strides(0) == a.shape(1) * row);
    *pitch = row / item;
  }
  EXPECT(rows_ok, std::string(name) + " must be a " + (fp16 ? "float16" : "float32") +
                      " array of rank 3 with unit element stride and evenly spaced rows, got " + Dims(a) + " " +
                      std::string(py::str(a.dtype())));
  return a.data();
}

}  // namespace

GqaArgs GqaArgsFor(const py::array& query, const std::optional<py::array>& key, const std::optional<py::array>& value,
                   const std::optional<py::array>& past_key, const std::optional<py::array>& past_value,
                   const py::array& present_key, const py::array& present_value, int64_t dirty,
                   const std::vector<int32_t>& past_len, const std::vector<int32_t>& total_len, int64_t num_heads,
                   int64_t kv_num_heads, float scale, float softcap, int64_t local_window_size,
                   const std::optional<py::array>& cos, const std::optional<py::array>& sin, bool interleaved,
                   const std::optional<Arr<int64_t>>& position_ids) {
  GqaArgs a;
  a.fp16 = query.dtype().kind() == 'f' && query.itemsize() == 2;
  const bool h = a.fp16;
  a.q = Rows(query, "query", h, &a.q_tok);
  a.B = query.shape(0);
  a.S = query.shape(1);
  a.N = num_heads;
  a.Nkv = kv_num_heads;
  EXPECT(a.N > 0 && a.Nkv > 0 && a.N % a.Nkv == 0, "num_heads must be a positive multiple of kv_num_heads");
  const int64_t d = query.shape(2);
  if (key) {
    EXPECT(value.has_value(), "key without value");
    a.H = d / a.N;
    EXPECT(a.H * a.N == d, "query width " + std::to_string(d) + " is not num_heads x head size");
    a.k = Rows(*key, "key", h, &a.k_tok);
    a.v = Rows(*value, "value", h, &a.v_tok);
    for (const py::array* x : {&*key, &*value})
      EXPECT(x->shape(0) == a.B && x->shape(1) == a.S && x->shape(2) == a.Nkv * a.H,
             "key/value " + Dims(*x) + " do not match query " + Dims(query));
  } else {
    a.H = d / (a.N + 2 * a.Nkv);
    EXPECT(a.H * (a.N + 2 * a.Nkv) == d, "packed QKV width " + std::to_string(d) + " is not (N + 2 Nkv) x H");
    a.k_tok = a.v_tok = a.q_tok;
    const auto* base = static_cast<const char*>(a.q);
    a.k = base + a.N * a.H * query.itemsize();
    a.v = base + (a.N + a.Nkv) * a.H * query.itemsize();
  }
  for (const py::array* pr : {&present_key, &present_value}) {
    EXPECT(pr->writeable(), "presents must be writeable");
    Tensor(*pr, "present", 4, h);
    EXPECT(pr->shape(0) == a.B && pr->shape(1) == a.Nkv && pr->shape(2) == present_key.shape(2) && pr->shape(3) == a.H,
           "present " + Dims(*pr) + " is not [B, Nkv, T, H] like present_key " + Dims(present_key));
  }
  a.present_k = const_cast<void*>(present_key.data());
  a.present_v = const_cast<void*>(present_value.data());
  a.T = present_key.shape(2);
  a.dirty = std::min(dirty, a.T);
  if (past_key) {
    EXPECT(past_value.has_value(), "past_key without past_value");
    a.past_k = Tensor(*past_key, "past_key", 4, h);
    a.past_v = Tensor(*past_value, "past_value", 4, h);
    a.P = past_key->shape(2);
    for (const py::array* x : {&*past_key, &*past_value})
      EXPECT(x->shape(0) == a.B && x->shape(1) == a.Nkv && x->shape(2) == a.P && x->shape(3) == a.H,
             "past " + Dims(*x) + " is not [B, Nkv, P, H]");
  }
  EXPECT(static_cast<int64_t>(past_len.size()) == a.B && static_cast<int64_t>(total_len.size()) == a.B,
         "past/total lengths need one entry per batch row");
  a.past_len = past_len.data();
  a.total_len = total_len.data();
  a.scale = scale;
  a.softcap = softcap;
  a.window = local_window_size;
  if (cos) {
    EXPECT(sin.has_value(), "cos without sin");
    a.cos = F32(*cos, "cos_cache", 2);
    a.sin = F32(*sin, "sin_cache", 2);
    EXPECT(sin->shape(0) == cos->shape(0) && sin->shape(1) == cos->shape(1), "cos/sin caches differ in shape");
    a.max_pos = cos->shape(0);
    a.half = cos->shape(1);
    a.interleaved = interleaved;
    if (position_ids) {
      EXPECT(position_ids->size() == a.B * a.S, "position_ids must have B x S entries");
      a.position_ids = position_ids->data();
    }
  }
  return a;
}

py::array RunGqa(GqaArgs a, const py::array& query, int threads) {
  py::array out(query.dtype(), std::vector<py::ssize_t>{a.B, a.S, a.N * a.H});
  a.out = out.mutable_data();
  a.threads = threads;
  {
    py::gil_scoped_release release;
    GroupQueryAttention(a);
  }
  return out;
}

namespace {

py::array GqaPy(const py::array& query, const std::optional<py::array>& key, const std::optional<py::array>& value,
                const std::optional<py::array>& past_key, const std::optional<py::array>& past_value,
                const py::array& present_key, const py::array& present_value, int64_t dirty,
                const std::vector<int32_t>& past_len, const std::vector<int32_t>& total_len, int64_t num_heads,
                int64_t kv_num_heads, float scale, float softcap, int64_t local_window_size,
                const std::optional<py::array>& cos, const std::optional<py::array>& sin, bool interleaved,
                const std::optional<Arr<int64_t>>& position_ids, int threads) {
  return RunGqa(
      GqaArgsFor(query, key, value, past_key, past_value, present_key, present_value, dirty, past_len, total_len,
                 num_heads, kv_num_heads, scale, softcap, local_window_size, cos, sin, interleaved, position_ids),
      query, threads);
}

}  // namespace

void BindGqa(py::module_& m) {
  m.def("gqa", &GqaPy, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("past_key"), py::arg("past_value"),
        py::arg("present_key"), py::arg("present_value"), py::arg("dirty"), py::arg("past_len"), py::arg("total_len"),
        py::arg("num_heads"), py::arg("kv_num_heads"), py::arg("scale"), py::arg("softcap"),
        py::arg("local_window_size"), py::arg("cos"), py::arg("sin"), py::arg("interleaved"), py::arg("position_ids"),
        py::arg("threads") = 1,
        "GroupQueryAttention (float32, or float16 in/out with float32 math; cos/sin float32): fills "
        "present_key/present_value [B, Nkv, T, H] (past prefix, new "
        "rows, zeroes rows up to dirty) and returns the output [B, S, N*H]; lengths and buffers as "
        "kernels/ops/attention_gqa.py resolves them");
}

}  // namespace npu_ep::kern
