#include "partition_kernel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "device_memory.h"
#include "kernels/native/thread_pool.h"
#include "output_buffers.h"
#include "program_call.h"

namespace npu_ep {

namespace {
std::mutex g_stats_mu;
std::atomic<bool> g_shutting_down{false};
std::atomic<int> g_in_flight{0};
std::map<std::string, std::unique_ptr<BridgeStats>>& StatsRegistry() {
  static auto* registry = new std::map<std::string, std::unique_ptr<BridgeStats>>();  // never destroyed
  return *registry;
}
uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// kern::HostLoop over ORT's intra-op pool. num_batch 0: ORT's threads and the caller claim tasks one by one (fixed
// batches would leave the caller waiting for a worker that is slow to wake). A refused call ran no task.
bool OrtParallelFor(const void* ctx, void (*task)(void*, size_t), size_t n, void* arg) {
  OrtStatus* status = g_ort->KernelContext_ParallelFor(static_cast<const OrtKernelContext*>(ctx), task, n, 0, arg);
  if (status == nullptr) return true;
  g_ort->ReleaseStatus(status);
  return false;
}

// The kept view's array (a new reference) when it can serve as the view of `data` with `dims` and `dtype`: only the
// kernel holds it (no other reference, no weak reference), so no one can tell it from a new view, and it is as it was
// made (its flags, and the C-order shape and strides of `dims`); else nullptr. A buffer other than the one it viewed
// (ORT's output buffers move every call) is set as its data when the view was made aligned and `data` is aligned to
// the item size (our dtypes' sizes are powers of two, numpy's alignment at most that): then its flags hold as they
// would for a new view, and nothing else refers to the old data (no base but ViewBase, no buffer export alive).
PyObject* ReuseView(const KeptView& kept, const void* data, const py::handle& dtype, const int64_t* dims, size_t rank) {
  PyObject* o = kept.array.ptr();
  if (o == nullptr || data == nullptr || Py_REFCNT(o) != 1) return nullptr;
  const Py_ssize_t weak = Py_TYPE(o)->tp_weaklistoffset;
  if (weak > 0 && *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + weak) != nullptr) return nullptr;
  auto* p = py::detail::array_proxy(o);
  if (p->descr != dtype.ptr() || p->flags != kept.flags || static_cast<size_t>(p->nd) != rank) return nullptr;
  py::ssize_t stride = kept.itemsize;
  for (size_t d = rank; d-- > 0;) {
    if (p->dimensions[d] != dims[d] || p->strides[d] != stride) return nullptr;
    stride *= dims[d];
  }
  if (p->data != data) {
    if (!(kept.flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_) || kept.itemsize <= 0 ||
        reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(kept.itemsize) != 0)
      return nullptr;
    p->data = static_cast<char*>(const_cast<void*>(data));
  }
  Py_INCREF(o);
  return o;
}

// Keeps `a` (a view just made) for later calls.
void KeepView(KeptView& kept, const py::array& a) {
  kept.array = a;
  kept.flags = py::detail::array_proxy(a.ptr())->flags;
  kept.itemsize = a.itemsize();
}

// ORT's output buffers of one partition call, lent to the steps it runs (output_buffers.h). It remembers what it
// lent, so the bridge hands an output computed in place to ORT without asking ORT for the buffer again; the first
// kInline outputs' records live in the object (no allocation per call), later ones in a vector.
class OrtOutputs : public OutputBuffers {
 public:
  // A buffer lent for output i: ORT's value, its data and the dims it was created with (at most kMaxRank; a view
  // of a higher rank is lent unrecorded, and the bridge asks ORT for that output again).
  struct Lent {
    static constexpr size_t kMaxRank = 8;
    OrtValue* value = nullptr;
    void* data = nullptr;
    size_t rank = 0;
    int64_t dims[kMaxRank];
  };

  OrtOutputs(OrtKernelContext* ctx, const PartitionKernel* kernel) : ctx_(ctx), kernel_(kernel) {}

  py::object View(size_t index, const std::vector<int64_t>& dims) const override {
    const PartitionKernel* k = kernel_;
    if (index >= k->output_types.size())
      throw std::out_of_range("partition_output: output " + std::to_string(index) + " of " + k->where + ", which has " +
                              std::to_string(k->output_types.size()));
    if (!k->output_rank_known[index] || k->output_dims[index].size() != dims.size())
      return py::none();  // an output whose rank ORT does not state, or another rank: the bridge checks and copies it
    OrtValue* out = nullptr;
    Check(g_ort->KernelContext_GetOutput(ctx_, index, dims.data(), dims.size(), &out));
    void* data = nullptr;
    Check(g_ort->GetTensorMutableData(out, &data));
    if (dims.size() <= Lent::kMaxRank) {
      Lent& l = Slot(index);
      l.value = out;
      l.data = data;
      l.rank = dims.size();
      std::copy(dims.begin(), dims.end(), l.dims);
    }
    KeptView& kept = k->output_views[index];
    if (PyObject* again = ReuseView(kept, data, k->output_dtypes[index], dims.data(), dims.size()))
      return py::reinterpret_steal<py::object>(again);
    py::array view = OutputView(data, k->output_dtypes[index], dims);
    if (data != nullptr) KeepView(kept, view);
    return std::move(view);
  }

  // The buffer lent for output `index` if `a` is exactly it (its data, its dims), else nullptr: then the bridge asks
  // ORT for the output with a's dims and copies a into it.
  const Lent* LentAs(size_t index, const py::array& a) const {
    const Lent* l = index < kInline                  ? &inline_[index]
                    : index - kInline < more_.size() ? &more_[index - kInline]
                                                     : nullptr;
    if (l == nullptr || l->data == nullptr || a.data() != l->data) return nullptr;
    if (static_cast<size_t>(a.ndim()) != l->rank) return nullptr;
    for (size_t d = 0; d < l->rank; ++d)
      if (a.shape(static_cast<py::ssize_t>(d)) != l->dims[d]) return nullptr;
    return l;
  }

 private:
  static constexpr size_t kInline = 4;
  Lent& Slot(size_t index) const {
    if (index < kInline) return inline_[index];
    if (more_.size() <= index - kInline) more_.resize(index - kInline + 1);
    return more_[index - kInline];
  }

  OrtKernelContext* ctx_;
  const PartitionKernel* kernel_;
  mutable Lent inline_[kInline];  // outputs 0..kInline-1; data nullptr until a buffer is lent
  mutable std::vector<Lent> more_;  // outputs from kInline on
};

}  // namespace

BridgeStats* StatsFor(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  auto& slot = StatsRegistry()[name];
  if (!slot) slot = std::make_unique<BridgeStats>();
  return slot.get();
}

py::dict AllStats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  py::dict out;
  for (auto& [name, s] : StatsRegistry()) {
    py::dict d;
    d["calls"] = s->calls.load();
    d["total_ns"] = s->total_ns.load();
    d["program_ns"] = s->program_ns.load();
    d["bytes_in"] = s->bytes_in.load();
    d["bytes_out"] = s->bytes_out.load();
    d["bytes_in_npu"] = s->bytes_in_npu.load();
    d["bytes_out_npu"] = s->bytes_out_npu.load();
    out[py::str(name)] = d;
  }
  return out;
}

void ResetStats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  for (auto& [name, s] : StatsRegistry()) {
    s->calls = 0;
    s->total_ns = 0;
    s->program_ns = 0;
    s->bytes_in = 0;
    s->bytes_out = 0;
    s->bytes_in_npu = 0;
    s->bytes_out_npu = 0;
  }
}

PartitionKernel::~PartitionKernel() {
  SafeDrop(call);
  SafeDrop(program);
  for (auto& d : input_dtypes) SafeDrop(d);
  for (auto& d : output_dtypes) SafeDrop(d);
  for (auto& v : input_views) SafeDrop(v.array);
  for (auto& v : output_views) SafeDrop(v.array);
  SafeDrop(spare_args);
}

static std::string ShapeString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

bool PrepareShutdown(double timeout_s) {
  g_shutting_down = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (g_in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return g_in_flight.load() == 0;
}

// Called with the GIL held (inside WithPython). A shape, or a rank, other than the graph declares is ORT's own
// executor's warning (VerifyOutputSizes), not an error: exporters declare wrong output shapes (ddddocr's CRNN says
// [1, seqlen] for a [T, 1, classes] output) and the CPU EP runs those models.
static void CheckOutputShape(PartitionKernel* k, size_t i, const int64_t* dims, size_t rank) {
  if (!k->output_rank_known[i]) return;
  const auto& declared = k->output_dims[i];
  bool same = declared.size() == rank;
  for (size_t d = 0; same && d < declared.size(); ++d) same = declared[d] < 0 || declared[d] == dims[d];
  if (same || k->output_warned[i]) return;  // every call: no message built
  k->output_warned[i] = 1;
  const std::string what = "output '" + k->output_names[i] + "' of " + k->output_producers[i] + " has shape " +
                           ShapeString(std::vector<int64_t>(dims, dims + rank)) + " but the graph declares " +
                           ShapeString(declared);
  py::module_::import("npu_ep.log")
      .attr("logger")
      .attr("warning")(k->where + ": " + what +
                       " (the shape ORT holds for it; its CPU EP computes the same shape and warns too)");
}

// Called with the GIL held. Makes the program's views of borrowed initializers read the buffers ORT passes now.
static const void* InputData(OrtKernelContext* ctx, size_t index) {
  const OrtValue* v = nullptr;
  Check(g_ort->KernelContext_GetInput(ctx, index, &v));
  const void* data = nullptr;
  if (v) Check(g_ort->GetTensorData(v, &data));
  return data;
}

// The hot path: ORT hands the same weights on every run, so no lock and no GIL release unless one moved.
static bool BorrowedUnmoved(PartitionKernel* k, OrtKernelContext* ctx) {
  for (const BorrowedInput& w : k->borrowed) {
    const void* expect = w.data.load(std::memory_order_acquire);
    if (expect && InputData(ctx, w.index) != expect) return false;
  }
  return true;
}

static void CheckBorrowed(PartitionKernel* k, OrtKernelContext* ctx) {
  if (BorrowedUnmoved(k, ctx)) return;
  std::unique_lock<std::mutex> lock(k->borrowed_mu, std::defer_lock);
  {
    py::gil_scoped_release nogil;  // a thread holding the lock may need the GIL to finish a rebase
    lock.lock();
  }
  py::list moves;
  std::vector<std::pair<BorrowedInput*, const void*>> moved;
  for (BorrowedInput& w : k->borrowed) {
    const void* have = w.data.load(std::memory_order_relaxed);  // written only under the lock we hold
    if (!have) continue;  // a small constant the program holds a copy of
    const OrtValue* v = nullptr;
    Check(g_ort->KernelContext_GetInput(ctx, w.index, &v));
    const void* data = nullptr;
    size_t bytes = 0;
    if (v) Check(g_ort->GetTensorData(v, &data));
    if (data == have) continue;
    if (v) Check(g_ort->GetTensorSizeInBytes(v, &bytes));
    if (!data || bytes != w.bytes)
      throw OrtError(ORT_EP_FAIL, "constant initializer '" + w.name + "' has " + std::to_string(bytes) +
                                      " bytes at run time, " + std::to_string(w.bytes) + " at Compile");
    moves.append(py::make_tuple(reinterpret_cast<uintptr_t>(have), w.bytes, InitializerBytes(data, bytes)));
    moved.emplace_back(&w, data);
  }
  if (moved.empty()) return;
  py::module_::import("npu_ep.ep.weight_arena").attr("rebase_borrowed")(k->program, moves);
  for (auto& [w, data] : moved) w->data.store(data, std::memory_order_release);  // after the views moved
}

// An output as an aligned C-contiguous array of its declared dtype: taken as it is when it already is one (an exact
// ndarray with that very descriptor), else numpy's conversion (a copy where needed).
static py::array OutputArray(PyObject* o, const py::object& dtype) {
  auto& api = py::detail::npy_api::get();
  constexpr int kLayout = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
  if (Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) {
    const auto* proxy = py::detail::array_proxy(o);
    if (proxy->descr == dtype.ptr() && (proxy->flags & kLayout) == kLayout) return py::reinterpret_borrow<py::array>(o);
  }
  py::array a =
      py::reinterpret_steal<py::array>(api.PyArray_FromAny_(o, dtype.inc_ref().ptr(), 0, 0, kLayout, nullptr));
  if (!a) throw py::error_already_set();
  return a;
}

OrtStatus* ComputePartition(PartitionKernel* k, OrtKernelContext* ctx) noexcept {
  if (g_shutting_down.load())
    return MakeStatus(ORT_EP_FAIL, "NpuEP: " + k->where + ": the Python interpreter is shutting down");
  struct InFlight {
    InFlight() { g_in_flight.fetch_add(1); }
    ~InFlight() { g_in_flight.fetch_sub(1); }
  } in_flight;
  const uint64_t t0 = NowNs();
  uint64_t program_ns = 0, bytes_in = 0, bytes_out = 0, bytes_in_npu = 0, bytes_out_npu = 0;
  OrtStatus* status = WithPython(k->where, [&]() {
    // Counted as the body ends, failed or not, with the GIL still held: every writer of the counters holds it (and
    // every reader: partition_stats, reset_stats), so the adds need no locked read-modify-write.
    struct Count {
      BridgeStats* s;
      uint64_t t0;
      const uint64_t &program_ns, &bytes_in, &bytes_out, &bytes_in_npu, &bytes_out_npu;
      static void Add(std::atomic<uint64_t>& c, uint64_t v) {
        c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
      }
      ~Count() {
        Add(s->calls, 1);
        Add(s->total_ns, NowNs() - t0);
        Add(s->program_ns, program_ns);
        Add(s->bytes_in, bytes_in);
        Add(s->bytes_out, bytes_out);
        Add(s->bytes_in_npu, bytes_in_npu);
        Add(s->bytes_out_npu, bytes_out_npu);
      }
    } count{k->stats, t0, program_ns, bytes_in, bytes_out, bytes_in_npu, bytes_out_npu};
    size_t n_in = 0, n_out = 0;
    Check(g_ort->KernelContext_GetInputCount(ctx, &n_in));
    Check(g_ort->KernelContext_GetOutputCount(ctx, &n_out));
    const size_t n_prog = k->input_types.size();
    if (n_in != n_prog + k->borrowed.size() || n_out != k->output_types.size())
      throw OrtError(ORT_EP_FAIL, "expected " + std::to_string(n_prog + k->borrowed.size()) + " inputs/" +
                                      std::to_string(k->output_types.size()) + " outputs, ORT passed " +
                                      std::to_string(n_in) + "/" + std::to_string(n_out));
    if (!k->borrowed.empty()) CheckBorrowed(k, ctx);
    if (k->input_views.size() != n_prog) k->input_views.resize(n_prog);
    if (k->output_views.size() != n_out) k->output_views.resize(n_out);
    py::tuple args = k->spare_args ? py::reinterpret_steal<py::tuple>(k->spare_args.release())
                                   : py::tuple(static_cast<py::ssize_t>(n_prog));
    size_t j = 0, b = 0;  // next program input, next borrowed input
    for (size_t i = 0; i < n_in; ++i) {
      const OrtValue* v = nullptr;
      Check(g_ort->KernelContext_GetInput(ctx, i, &v));
      if (b < k->borrowed.size() && k->borrowed[b].index == i) {
        ++b;  // checked by CheckBorrowed
        continue;
      }
      thread_local TensorMeta meta;  // its dims' capacity kept: no allocation per input (no Python runs until reused)
      ReadTensorMeta(v, meta);
      if (meta.elem_type != k->input_types[j])
        throw OrtError(ORT_EP_FAIL, "input " + std::to_string(j) + " has element type " +
                                        std::to_string(meta.elem_type) + ", compiled for " +
                                        std::to_string(k->input_types[j]));
      const void* data = nullptr;
      Check(g_ort->GetTensorData(v, &data));
      KeptView& kept = k->input_views[j];
      py::array view = py::reinterpret_steal<py::array>(
          ReuseView(kept, data, k->input_dtypes[j], meta.dims.data(), meta.dims.size()));
      if (!view) {
        view = TensorView(v, k->input_dtypes[j], meta);
        if (data != nullptr) KeepView(kept, view);
      }
      bytes_in += static_cast<uint64_t>(view.nbytes());
      if (IsNpuValue(v)) bytes_in_npu += static_cast<uint64_t>(view.nbytes());
      PyTuple_SET_ITEM(args.ptr(), j++, view.release().ptr());  // the new tuple's empty slot takes the reference
    }
    kern::CallContextScope on_orts_pool({OrtParallelFor, ctx});  // native kernels' loops run on ORT's threads
    const OrtOutputs outputs(ctx, k);
    OutputBuffersScope in_place(&outputs);  // kernels may compute outputs straight into ORT's buffers
    // PyObject_Call takes the tuple as is (pybind11's call with *args would build a second one); the native call
    // times itself, so only a Python program's call is stamped here
    PyObject* raw = nullptr;
    if (k->call_ptr != nullptr) {
      raw = CallProgram(*k->call_ptr, args.ptr(), &program_ns);
    } else {
      const uint64_t tp = NowNs();
      raw = PyObject_Call(k->program.ptr(), args.ptr(), nullptr);
      program_ns = NowNs() - tp;
    }
    if (!raw) throw py::error_already_set();
    py::object result = py::reinterpret_steal<py::object>(raw);
    py::tuple outs = py::isinstance<py::tuple>(result) ? result.cast<py::tuple>() : py::tuple(result);
    if (outs.size() != n_out)
      throw OrtError(ORT_EP_FAIL,
                     "program returned " + std::to_string(outs.size()) + " outputs, expected " + std::to_string(n_out));
    for (size_t i = 0; i < n_out; ++i) {
      py::array a = OutputArray(PyTuple_GET_ITEM(outs.ptr(), static_cast<Py_ssize_t>(i)), k->output_dtypes[i]);
      const auto* dims = reinterpret_cast<const int64_t*>(a.shape());
      const auto rank = static_cast<size_t>(a.ndim());
      CheckOutputShape(k, i, dims, rank);
      const size_t nbytes = static_cast<size_t>(a.nbytes());
      if (const OrtOutputs::Lent* lent = outputs.LentAs(i, a)) {  // computed in place: ORT has it already
        bytes_out += nbytes;
        if (IsNpuValue(lent->value)) bytes_out_npu += nbytes;
        continue;
      }
      OrtValue* out = nullptr;
      Check(g_ort->KernelContext_GetOutput(ctx, i, dims, rank, &out));
      void* dst = nullptr;
      Check(g_ort->GetTensorMutableData(out, &dst));
      size_t expected = 0;
      Check(g_ort->GetTensorSizeInBytes(out, &expected));
      if (expected != nbytes)
        throw OrtError(ORT_EP_FAIL, "output " + std::to_string(i) + " " +
                                        ShapeString(std::vector<int64_t>(dims, dims + rank)) + " size mismatch");
      if (expected && dst != a.data()) std::memcpy(dst, a.data(), expected);  // equal: computed in place
      bytes_out += expected;
      if (IsNpuValue(out)) bytes_out_npu += expected;
    }
    if (n_prog > 0 && Py_REFCNT(args.ptr()) == 1 && !k->spare_args) {  // no one kept the inputs: kept, emptied
      for (size_t i = 0; i < n_prog; ++i) Py_CLEAR(PyTuple_GET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i)));
      k->spare_args = std::move(args);
    }
  });
  return status;
}

}  // namespace npu_ep
