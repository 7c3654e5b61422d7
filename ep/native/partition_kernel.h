// One compiled partition: the Python program to call, the I/O types ORT will hand us, and bridge timing.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "python_interop.h"

namespace npu_ep {

class ProgramCall;

// Per-partition counters of the C++ side of each call, read by `npu_ep.ep._native.partition_stats()` so reports
// can separate bridge cost (views, call, output copies) from the time the Python program runs. Written and read
// with the GIL held only (ComputePartition counts before it releases the GIL).
struct BridgeStats {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> total_ns{0};    // whole Compute callback, incl. GIL wait
  std::atomic<uint64_t> program_ns{0};  // inside the Python program
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  // Of bytes_in/bytes_out, those found in NPU memory (device_memory.h): they did not cross at this call (a copy
  // that brought them there is counted by the data transfer). The rest sat in host memory: each call crossed them.
  std::atomic<uint64_t> bytes_in_npu{0};
  std::atomic<uint64_t> bytes_out_npu{0};
};

// A fused-node input that is a constant initializer ORT keeps for the session (NpuEp::borrow_initializers): the
// program reads it through a view made at Compile. Compute checks that ORT passes that memory; if ORT passes
// another buffer (Compile saw a temporary copy, e.g. of external data), the program's views are moved onto it
// once (weight_arena.rebase_borrowed) before anything reads them.
struct BorrowedInput {
  size_t index;  // position among the fused node's inputs
  // The memory the program's view reads; nullptr: the program holds a copy (small constant). Atomic: runs compare
  // it without the lock and take the lock only when ORT hands other memory (then a rebase stores the new address).
  std::atomic<const void*> data;
  size_t bytes;
  std::string name;

  BorrowedInput(size_t i, const void* d, size_t b, std::string n) : index(i), data(d), bytes(b), name(std::move(n)) {}
  BorrowedInput(BorrowedInput&& o) noexcept
      : index(o.index), data(o.data.load()), bytes(o.bytes), name(std::move(o.name)) {}
};

// A numpy view of an ORT buffer (one per input and per output of a partition), kept from an earlier call: ORT often
// hands the same buffer again, and a view that nothing else holds serves that call instead of a new array.
struct KeptView {
  py::object array;
  int flags = 0;  // as made: a view whose flags, shape or strides Python set in place is not reused
  py::ssize_t itemsize = 0;
};

struct PartitionKernel {
  std::string name;
  std::string where;   // "partition '<name>'", built once: error context must not cost an allocation per call
  py::object program;  // callable(*inputs) -> tuple of arrays
  py::object call;     // program._call, a ProgramCall (called directly), or None: the program is called
  ProgramCall* call_ptr = nullptr;
  std::vector<ONNXTensorElementDataType> input_types;
  std::vector<py::object> input_dtypes;  // py::dtype per input, cached (creating one per call costs ~100 ns)
  std::vector<BorrowedInput> borrowed;   // by ascending index; not among input_types (the program's inputs)
  std::mutex borrowed_mu;                // guards borrowed[].data (checked and rebased by concurrent runs)
  std::vector<ONNXTensorElementDataType> output_types;
  std::vector<py::object> output_dtypes;
  // Declared output shapes (-1: symbolic/unknown dim), from ORT's shape inference. An output of unknown rank is
  // not checked. A rank that differs is our kernel's bug and fails the call; dims that differ are what ORT's own
  // kernels produce in some cases (a static KV buffer that overflows, pool rounding), where ORT only warns: so
  // do we, once per output.
  std::vector<std::vector<int64_t>> output_dims;
  std::vector<bool> output_rank_known;
  std::vector<std::string> output_names;
  std::vector<std::string> output_producers;  // "node 'name' (op)" that computes each output, for messages
  std::vector<char> output_warned;
  BridgeStats* stats = nullptr;  // owned by the global registry (outlives sessions so reports can read it)
  // Sized at the first call, then read and replaced under the GIL; mutable: lending an output (OrtOutputs::View)
  // sees the kernel as const.
  std::vector<KeptView> input_views;
  mutable std::vector<KeptView> output_views;
  // The program's input tuple of an earlier call, emptied, that nothing else held when that call was done: the next
  // call fills it instead of making one (a call running meanwhile on another thread makes its own).
  py::object spare_args;

  ~PartitionKernel();
};

OrtStatus* ComputePartition(PartitionKernel* kernel, OrtKernelContext* context) noexcept;

// Interpreter shutdown: from this point partition calls fail with an error instead of entering Python, and the
// caller waits (GIL released) up to `timeout_s` for calls already inside Python to return. Called from an
// atexit hook, i.e. before Python starts tearing down while daemon threads may still be inside session.run.
bool PrepareShutdown(double timeout_s);

BridgeStats* StatsFor(const std::string& partition_name);
py::dict AllStats();
void ResetStats();

}  // namespace npu_ep
