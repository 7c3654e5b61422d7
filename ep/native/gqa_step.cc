// GroupQueryAttention as a bound step (kernels/ops/_gqa_native.py `bind`): the native kernel called from the
// program's loop without the Python kernel's per-call work. What the Python kernel resolves on every call is
// resolved here the same way: the lengths from seqlens_k and total_sequence_length (ORT's rules), the present
// length, and both presents as ORT's own output buffers. Anything the binding did not expect (another shape,
// dtype or layout, lengths the reference refuses, presents that are not ORT's buffers) declines, so the Python
// kernel runs and says what is wrong.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gqa_step.h"
#include "kernels/native/gqa_bindings.h"
#include "native_steps.h"
#include "output_buffers.h"

namespace py = pybind11;

namespace npu_ep {
namespace {

using Dims = std::vector<py::ssize_t>;

std::optional<Dims> OptionalDims(const py::object& o) {
  if (o.is_none()) return std::nullopt;
  return o.cast<Dims>();
}

// The array at step input i when it has this dtype and shape; nullopt otherwise (also for None).
std::optional<py::array> Bound(PyObject* v, int dtype, const Dims& dims) {
  if (v == Py_None || !py::isinstance<py::array>(v)) return std::nullopt;
  auto a = py::reinterpret_borrow<py::array>(v);
  if (a.dtype().num() != dtype || !SameShape(a, dims)) return std::nullopt;
  return a;
}

// A past key/value at step input i: Bound, except that its sequence length (dim 2) may be any (a decoder's past
// grows every token; the lengths are resolved from it on every call).
std::optional<py::array> BoundPast(PyObject* v, int dtype, const Dims& dims) {
  if (v == Py_None || !py::isinstance<py::array>(v)) return std::nullopt;
  auto a = py::reinterpret_borrow<py::array>(v);
  if (a.dtype().num() != dtype || a.ndim() != static_cast<py::ssize_t>(dims.size()) || dims.size() != 4)
    return std::nullopt;
  for (size_t k = 0; k < dims.size(); ++k)
    if (k != 2 && a.shape(static_cast<py::ssize_t>(k)) != dims[k]) return std::nullopt;
  return a;
}

class GqaStep : public NativeStep {
 public:
  GqaStep(const py::dtype& dtype, Dims query, const py::object& key, const py::object& past, Dims seqlens, Dims total,
          const py::object& position_ids, py::object cos, py::object sin, std::pair<size_t, size_t> presents,
          int64_t num_heads, int64_t kv_num_heads, float scale, float softcap, int64_t window, bool interleaved,
          int threads, const py::list& guards, py::object traffic)
      : dtype_(dtype.num()), query_(std::move(query)), key_(OptionalDims(key)), past_(OptionalDims(past)),
        seqlens_(std::move(seqlens)), total_(std::move(total)), position_ids_(OptionalDims(position_ids)),
        cos_(std::move(cos)), sin_(std::move(sin)), presents_(presents), num_heads_(num_heads),
        kv_num_heads_(kv_num_heads), scale_(scale), softcap_(softcap), window_(window), interleaved_(interleaved),
        threads_(threads), guards_(guards), traffic_(TrafficCounters(std::move(traffic))) {
    if (query_.size() != 3) throw py::value_error("GqaStep: query is [B, S, width]");
    if (cos_.is_none() != sin_.is_none()) throw py::value_error("GqaStep: cos and sin go together");
  }

  PyObject* Run(PyObject* args) override {
    if (!guards_.Hold()) return nullptr;
    try {
      return Attend(args);
    } catch (py::error_already_set& e) {
      e.restore();
    } catch (const std::invalid_argument&) {
      return nullptr;  // a layout the kernel does not take: the Python kernel copies or reports
    } catch (const std::out_of_range& e) {
      PyErr_SetString(PyExc_IndexError, e.what());  // as the binding raises it (a position outside the caches)
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
  }

 private:
  PyObject* Attend(PyObject* args) {
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    auto in = [&](Py_ssize_t i) { return i < n ? PyTuple_GET_ITEM(args, i) : Py_None; };
    auto query = Bound(in(0), dtype_, query_);
    if (!query) return nullptr;
    std::optional<py::array> key, value, past_key, past_value, position_ids;
    if (key_ && !((key = Bound(in(1), dtype_, *key_)) && (value = Bound(in(2), dtype_, *key_)))) return nullptr;
    if (!key_ && (in(1) != Py_None || in(2) != Py_None)) return nullptr;
    if (past_ && !((past_key = BoundPast(in(3), dtype_, *past_)) && (past_value = BoundPast(in(4), dtype_, *past_)) &&
                   past_key->shape(2) == past_value->shape(2)))
      return nullptr;
    if (!past_ && (in(3) != Py_None || in(4) != Py_None)) return nullptr;
    auto seqlens = Bound(in(5), int32_, seqlens_);
    auto total = Bound(in(6), int32_, total_);
    if (!seqlens || !total || !(seqlens->flags() & py::array::c_style) || total->size() != 1) return nullptr;
    if (in(7) != Py_None || in(8) != Py_None) return nullptr;  // the caches are the node's constants
    if (position_ids_) {
      position_ids = Bound(in(9), int64_, *position_ids_);
      if (!position_ids || !(position_ids->flags() & py::array::c_style)) return nullptr;
    } else if (in(9) != Py_None) {
      return nullptr;
    }

    // Lengths as attention_gqa.py's _run and _lengths resolve them; what they refuse is left to them.
    const int64_t B = query_[0], S = query_[1], P = past_ ? static_cast<int64_t>(past_key->shape(2)) : 0;
    const int64_t total_len = *static_cast<const int32_t*>(total->data());
    if (total_len != P + S && total_len > P) return nullptr;
    const int64_t T = std::max(total_len, P);
    if (seqlens->size() != B) return nullptr;
    std::vector<int32_t> past_b(static_cast<size_t>(B)), total_b(static_cast<size_t>(B));
    const auto* sk = static_cast<const int32_t*>(seqlens->data());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = int64_t{sk[b]} + 1, p = S == total_len ? 0 : t - S;
      if (p < 0 || p + S > T || (past_ && p > P)) return nullptr;
      total_b[static_cast<size_t>(b)] = static_cast<int32_t>(t);
      past_b[static_cast<size_t>(b)] = static_cast<int32_t>(p);
    }

    const int64_t width = query_[2];
    const int64_t H = key_ ? width / num_heads_ : width / (num_heads_ + 2 * kv_num_heads_);
    const std::vector<int64_t> dims{B, kv_num_heads_, T, H};
    py::object pk = PartitionOutput(presents_.first, dims), pv = PartitionOutput(presents_.second, dims);
    if (pk.is_none() || pv.is_none()) return nullptr;  // not inside a partition call: the pooled buffers
    auto present_key = py::reinterpret_borrow<py::array>(pk), present_value = py::reinterpret_borrow<py::array>(pv);
    if (present_key.dtype().num() != dtype_ || present_value.dtype().num() != dtype_) return nullptr;

    std::optional<py::array> cos, sin;
    if (!cos_.is_none()) cos = py::reinterpret_borrow<py::array>(cos_), sin = py::reinterpret_borrow<py::array>(sin_);
    std::optional<kern::Arr<int64_t>> positions;
    if (position_ids) positions = py::reinterpret_borrow<kern::Arr<int64_t>>(*position_ids);
    kern::GqaArgs a =
        kern::GqaArgsFor(*query, key, value, past_key, past_value, present_key, present_value, T, past_b, total_b,
                         num_heads_, kv_num_heads_, scale_, softcap_, window_, cos, sin, interleaved_, positions);
    py::array out = kern::RunGqa(a, *query, threads_);
    if (traffic_) Count(kern::TrafficOf(a));
    return py::make_tuple(std::move(out), std::move(present_key), std::move(present_value)).release().ptr();
  }

  // The node's KV counters (kernels/ops/_kv_traffic.py): in-place calls, appended bytes, copied bytes, full copies.
  static std::optional<py::array_t<int64_t>> TrafficCounters(py::object traffic) {
    if (traffic.is_none()) return std::nullopt;
    auto a = py::reinterpret_borrow<py::array>(traffic);
    if (a.dtype().num() != py::dtype::of<int64_t>().num() || a.ndim() != 1 || a.shape(0) != 4 || !a.writeable() ||
        !(a.flags() & py::array::c_style))
      throw py::value_error("GqaStep: traffic must be a writeable int64 array of 4 counters");
    return py::reinterpret_borrow<py::array_t<int64_t>>(a);
  }

  void Count(const kern::KvTraffic& t) {
    int64_t* c = traffic_->mutable_data();
    c[0] += t.in_place;
    c[1] += t.appended_bytes;
    c[2] += t.copied_bytes;
    c[3] += t.copied_bytes > 0;
  }

  int dtype_;
  const int int32_ = py::dtype::of<int32_t>().num(), int64_ = py::dtype::of<int64_t>().num();
  Dims query_;
  std::optional<Dims> key_, past_;
  Dims seqlens_, total_;
  std::optional<Dims> position_ids_;
  py::object cos_, sin_;
  std::pair<size_t, size_t> presents_;  // ORT output indices of present_key, present_value
  int64_t num_heads_, kv_num_heads_;
  float scale_, softcap_;
  int64_t window_;
  bool interleaved_;
  int threads_;
  Guards guards_;
  std::optional<py::array_t<int64_t>> traffic_;
};

}  // namespace

void RegisterGqaStep(py::module_& m) {
  py::class_<GqaStep, NativeStep>(
      m, "GqaStep",
      "GroupQueryAttention bound for one signature: query dtype and shape, key shape (None: packed QKV), past "
      "shape (None: no past), seqlens_k and total_sequence_length shapes (int32), position_ids shape (None: "
      "omitted), the float32 cos/sin caches (None: no rotary), the ORT output indices of both presents, the "
      "node's scalars, threads, guards [(counter, generation) | (dict, key, expected object | None)] and the "
      "node's KV counters (an int64 array of 4 the step adds to: in-place calls, appended bytes, copied bytes, full "
      "copies; None: not counted)")
      .def(py::init<const py::dtype&, Dims, const py::object&, const py::object&, Dims, Dims, const py::object&,
                    py::object, py::object, std::pair<size_t, size_t>, int64_t, int64_t, float, float, int64_t, bool,
                    int, const py::list&, py::object>(),
           py::arg("dtype"), py::arg("query"), py::arg("key"), py::arg("past"), py::arg("seqlens_k"),
           py::arg("total_sequence_length"), py::arg("position_ids"), py::arg("cos"), py::arg("sin"),
           py::arg("presents"), py::arg("num_heads"), py::arg("kv_num_heads"), py::arg("scale"), py::arg("softcap"),
           py::arg("local_window_size"), py::arg("interleaved"), py::arg("threads"), py::arg("guards"),
           py::arg("traffic") = py::none());
}

}  // namespace npu_ep
