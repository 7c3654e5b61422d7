// ORT's output buffers of the partition call running on this thread, lent to the steps it runs: a native step or
// kernel that computes an output of the partition writes it into ORT's buffer, and the bridge copies nothing.
// The partition kernel lends them (OutputBuffersScope around the program's call); native steps (CallStep, the
// GroupQueryAttention step) and kernels (through `_native.partition_output`) borrow them. Both include this
// header and neither includes the other's, so the executor's includes point one way: the partition kernel ->
// program call -> step loop -> native steps -> here.
#pragma once

#include <cstdint>
#include <vector>

#include "python_interop.h"

namespace npu_ep {

// What a partition call lends: a writeable view of ORT's buffer for output `index` with `dims`, or None for an
// output the bridge must check and copy itself (ORT does not state its rank, or `dims` has another rank).
class OutputBuffers {
 public:
  virtual py::object View(size_t index, const std::vector<int64_t>& dims) const = 0;

 protected:
  ~OutputBuffers() = default;
};

// While alive, PartitionOutput on this thread reads `buffers`. Nests (restores the previous ones), so a partition
// called from inside another one lends its own.
class OutputBuffersScope {
 public:
  explicit OutputBuffersScope(const OutputBuffers* buffers);
  ~OutputBuffersScope();
  OutputBuffersScope(const OutputBuffersScope&) = delete;
  OutputBuffersScope& operator=(const OutputBuffersScope&) = delete;

 private:
  const OutputBuffers* previous_;
};

// Inside a partition call on this thread: a writeable view of ORT's buffer for output `index` with `dims` (the
// output's declared element type), so a kernel computing that output writes it in place and the bridge copies
// nothing; None outside a partition call. ORT keeps the buffer; the view must not outlive the call.
py::object PartitionOutput(size_t index, const std::vector<int64_t>& dims);

}  // namespace npu_ep
