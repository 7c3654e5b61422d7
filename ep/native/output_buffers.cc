#include "output_buffers.h"

namespace npu_ep {
namespace {
thread_local const OutputBuffers* t_buffers = nullptr;
}  // namespace

OutputBuffersScope::OutputBuffersScope(const OutputBuffers* buffers) : previous_(t_buffers) { t_buffers = buffers; }

OutputBuffersScope::~OutputBuffersScope() { t_buffers = previous_; }

py::object PartitionOutput(size_t index, const std::vector<int64_t>& dims) {
  const OutputBuffers* buffers = t_buffers;
  return buffers == nullptr ? py::none() : buffers->View(index, dims);
}

}  // namespace npu_ep
