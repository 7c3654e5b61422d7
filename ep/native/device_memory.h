// NPU device memory in ORT's plugin-EP terms: its OrtMemoryInfo (device type NPU, NpuEP's vendor id, device 0),
// an allocator (host RAM underneath, 64-byte aligned) and a data transfer (CPU<->NPU, NPU<->NPU memcpy). Memory
// is emulated, but ownership, placement and copies are real: ORT allocates there, and copies through us.
//
// Every allocation and copy is counted on the DeviceStats of the allocator that owns the NPU-side buffer: one per
// session (OrtEp::CreateAllocator) and one shared by values ORT's environment allocates (OrtValues a user creates
// with device "npu" outside a session). Emulated DMA time is not computed here: Python derives it from the counts
// with the target's one DMA formula (npu_ep.kernels.cost.dma_cycles).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "ort_api.h"

namespace npu_ep {

inline constexpr uint32_t kNpuVendorId = 0x4E50;  // "NP": also OrtEpFactory::GetVendorId
inline constexpr size_t kNpuAlignment = 64;

struct DeviceStats {
  std::atomic<uint64_t> live_bytes{0};
  std::atomic<uint64_t> peak_bytes{0};
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> frees{0};
  std::atomic<uint64_t> copies_to_npu{0};
  std::atomic<uint64_t> copies_to_host{0};
  std::atomic<uint64_t> copies_on_npu{0};
  std::atomic<uint64_t> bytes_to_npu{0};
  std::atomic<uint64_t> bytes_to_host{0};
  std::atomic<uint64_t> bytes_on_npu{0};
};

// The NPU memory's OrtMemoryInfo (created once; nullptr before CreateDeviceMemoryInfo).
const OrtMemoryInfo* NpuMemoryInfo();
OrtStatus* CreateDeviceMemoryInfo();

// Whether `device` is NpuEP's NPU memory.
bool IsNpuMemory(const OrtMemoryDevice* device);
bool IsNpuValue(const OrtValue* value);

// Counters by key: 0 is the environment's shared allocator; sessions get fresh keys (NewDeviceStatsKey). Never
// destroyed, so a report reads a session's counters after ORT released it.
uint64_t NewDeviceStatsKey();
DeviceStats* DeviceStatsFor(uint64_t key);

// An allocator of NPU memory whose allocations and copies count on DeviceStatsFor(key).
OrtAllocator* NewNpuAllocator(uint64_t key);
// Releases an allocator made by NewNpuAllocator; false for any other (then the caller does not own it).
bool ReleaseNpuAllocator(OrtAllocator* allocator);

OrtDataTransferImpl* NewNpuDataTransfer();

}  // namespace npu_ep
