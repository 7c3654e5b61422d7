// The OrtEp: hands GetCapability and Compile to the Python session object (`npu_ep.ep.entry_points.EpSession`).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device_memory.h"
#include "partition_kernel.h"

namespace npu_ep {

struct NpuEpFactory;

struct NpuEp : OrtEp {
  NpuEp(NpuEpFactory* factory, std::string name, py::object session);
  ~NpuEp();

  NpuEpFactory* factory;
  std::string name;
  py::object session;           // Python EpSession: all decisions and compute
  std::string compat_info;      // kept alive for GetCompiledModelCompatibilityInfo's returned pointer
  // Fuse with drop_constant_initializers=false and compile from read-only views of ORT's initializers (no copy
  // of the weights; ORT keeps them for the session and passes them as fused-node inputs, which Compute checks
  // and skips). Off when the session writes an EPContext model, whose nodes must not reference the weights.
  bool borrow_initializers = false;
  // This session's NPU-memory counters (device_memory.h): its allocator's buffers and the copies into and out of them.
  uint64_t device_key = NewDeviceStatsKey();
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<PartitionKernel>> kernels;  // by fused node name
};

}  // namespace npu_ep
