#include "device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace npu_ep {

namespace {

OrtMemoryInfo* g_npu_memory_info = nullptr;

std::mutex g_stats_mu;
std::map<uint64_t, std::unique_ptr<DeviceStats>>& StatsRegistry() {
  static auto* registry = new std::map<uint64_t, std::unique_ptr<DeviceStats>>();  // never destroyed
  return *registry;
}
std::atomic<uint64_t> g_next_key{1};

// Which DeviceStats owns each live NPU buffer, and its size: a copy is charged to the owner of its NPU side, and a
// buffer ORT hands us that we did not allocate (a user's own memory described as NPU memory) owns nothing.
struct Block {
  size_t bytes;
  DeviceStats* owner;
};
std::mutex g_blocks_mu;
std::unordered_map<const void*, Block>& Blocks() {
  static auto* blocks = new std::unordered_map<const void*, Block>();  // never destroyed: frees may come late
  return *blocks;
}

DeviceStats* OwnerOf(const void* data) {
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  auto it = Blocks().find(data);
  return it == Blocks().end() ? nullptr : it->second.owner;
}

void RaisePeak(DeviceStats* s, uint64_t live) {
  uint64_t peak = s->peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !s->peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

struct NpuAllocator : OrtAllocator {
  DeviceStats* stats;
};

void* ORT_API_CALL Alloc(OrtAllocator* self, size_t size) noexcept {
  auto* a = static_cast<NpuAllocator*>(self);
  const size_t rounded = (std::max<size_t>(size, 1) + kNpuAlignment - 1) / kNpuAlignment * kNpuAlignment;
  void* p = std::aligned_alloc(kNpuAlignment, rounded);
  if (p == nullptr) return nullptr;
  {
    std::lock_guard<std::mutex> lock(g_blocks_mu);
    Blocks()[p] = Block{size, a->stats};
  }
  a->stats->allocations.fetch_add(1, std::memory_order_relaxed);
  RaisePeak(a->stats, a->stats->live_bytes.fetch_add(size, std::memory_order_relaxed) + size);
  return p;
}

void ORT_API_CALL Free(OrtAllocator*, void* p) noexcept {
  if (p == nullptr) return;
  Block block{0, nullptr};
  {
    std::lock_guard<std::mutex> lock(g_blocks_mu);
    auto it = Blocks().find(p);
    if (it != Blocks().end()) {
      block = it->second;
      Blocks().erase(it);
    }
  }
  if (block.owner) {
    block.owner->live_bytes.fetch_sub(block.bytes, std::memory_order_relaxed);
    block.owner->frees.fetch_add(1, std::memory_order_relaxed);
  }
  std::free(p);
}

const OrtMemoryInfo* ORT_API_CALL Info(const OrtAllocator*) noexcept { return g_npu_memory_info; }

// ORT's allocator statistics keys (onnxruntime's AllocatorStats): what ORT's own tools print for an allocator.
OrtStatus* ORT_API_CALL GetStats(const OrtAllocator* self, OrtKeyValuePairs** out) noexcept {
  const DeviceStats* s = static_cast<const NpuAllocator*>(self)->stats;
  g_ort->CreateKeyValuePairs(out);
  g_ort->AddKeyValuePair(*out, "InUse", std::to_string(s->live_bytes.load()).c_str());
  g_ort->AddKeyValuePair(*out, "MaxInUse", std::to_string(s->peak_bytes.load()).c_str());
  g_ort->AddKeyValuePair(*out, "NumAllocs", std::to_string(s->allocations.load()).c_str());
  return nullptr;
}

// -- data transfer ------------------------------------------------------------------------------------------------

bool IsCpuMemory(const OrtMemoryDevice* device) {
  return device != nullptr && g_ep_api->MemoryDevice_GetDeviceType(device) == OrtMemoryInfoDeviceType_CPU;
}

void ORT_API_CALL ReleaseTransfer(OrtDataTransferImpl* self) noexcept { delete self; }

bool ORT_API_CALL CanCopy(const OrtDataTransferImpl*, const OrtMemoryDevice* src, const OrtMemoryDevice* dst) noexcept {
  const bool src_npu = IsNpuMemory(src), dst_npu = IsNpuMemory(dst);
  return (src_npu && (dst_npu || IsCpuMemory(dst))) || (dst_npu && IsCpuMemory(src));
}

void Count(const OrtValue* src, const OrtValue* dst, size_t bytes) {
  const bool dst_npu = IsNpuValue(dst), src_npu = IsNpuValue(src);
  const void* npu_side = nullptr;  // the destination's buffer when it is on the NPU, else the source's
  Check(g_ort->GetTensorData(dst_npu ? dst : src, &npu_side));
  DeviceStats* owner = OwnerOf(npu_side);
  if (owner == nullptr) owner = DeviceStatsFor(0);  // memory we did not allocate: the shared counters
  if (src_npu && dst_npu) {
    owner->copies_on_npu.fetch_add(1, std::memory_order_relaxed);
    owner->bytes_on_npu.fetch_add(bytes, std::memory_order_relaxed);
  } else if (dst_npu) {
    owner->copies_to_npu.fetch_add(1, std::memory_order_relaxed);
    owner->bytes_to_npu.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    owner->copies_to_host.fetch_add(1, std::memory_order_relaxed);
    owner->bytes_to_host.fetch_add(bytes, std::memory_order_relaxed);
  }
}

OrtStatus* ORT_API_CALL CopyTensors(OrtDataTransferImpl*, const OrtValue** src, OrtValue** dst, OrtSyncStream**,
                                    size_t n) noexcept {
  try {
    for (size_t i = 0; i < n; ++i) {
      size_t src_bytes = 0, dst_bytes = 0;
      Check(g_ort->GetTensorSizeInBytes(src[i], &src_bytes));
      Check(g_ort->GetTensorSizeInBytes(dst[i], &dst_bytes));
      if (src_bytes != dst_bytes)
        return MakeStatus(ORT_INVALID_ARGUMENT, "NpuEP data transfer: tensor " + std::to_string(i) + " of " +
                                                    std::to_string(n) + " has " + std::to_string(src_bytes) +
                                                    " bytes, its destination " + std::to_string(dst_bytes));
      const void* from = nullptr;
      void* to = nullptr;
      Check(g_ort->GetTensorData(src[i], &from));
      Check(g_ort->GetTensorMutableData(dst[i], &to));
      if (src_bytes && from != to) std::memcpy(to, from, src_bytes);
      Count(src[i], dst[i], src_bytes);
    }
  } catch (OrtError& e) {
    return MakeStatus(e.code, std::string("NpuEP data transfer: ") + e.what());
  }
  return nullptr;
}

}  // namespace

const OrtMemoryInfo* NpuMemoryInfo() { return g_npu_memory_info; }

OrtStatus* CreateDeviceMemoryInfo() {
  if (g_npu_memory_info) return nullptr;
  return g_ort->CreateMemoryInfo_V2("NpuEP", OrtMemoryInfoDeviceType_NPU, kNpuVendorId, 0, OrtDeviceMemoryType_DEFAULT,
                                    kNpuAlignment, OrtDeviceAllocator, &g_npu_memory_info);
}

bool IsNpuMemory(const OrtMemoryDevice* device) {
  return device != nullptr && g_ep_api->MemoryDevice_GetDeviceType(device) == OrtMemoryInfoDeviceType_NPU &&
         g_ep_api->MemoryDevice_GetVendorId(device) == kNpuVendorId &&
         g_ep_api->MemoryDevice_GetMemoryType(device) == OrtDeviceMemoryType_DEFAULT;
}

bool IsNpuValue(const OrtValue* value) {
  return value != nullptr && IsNpuMemory(g_ep_api->Value_GetMemoryDevice(value));
}

uint64_t NewDeviceStatsKey() { return g_next_key.fetch_add(1); }

DeviceStats* DeviceStatsFor(uint64_t key) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  auto& slot = StatsRegistry()[key];
  if (!slot) slot = std::make_unique<DeviceStats>();
  return slot.get();
}

OrtAllocator* NewNpuAllocator(uint64_t key) {
  auto* a = new NpuAllocator();
  std::memset(static_cast<OrtAllocator*>(a), 0, sizeof(OrtAllocator));
  a->version = kOrtApiVersion;
  a->Alloc = Alloc;
  a->Free = Free;
  a->Info = Info;
  a->Reserve = Alloc;  // no arena of ours to bypass
  a->GetStats = GetStats;
  a->stats = DeviceStatsFor(key);
  return a;
}

bool ReleaseNpuAllocator(OrtAllocator* allocator) {
  if (allocator == nullptr || allocator->Alloc != Alloc) return false;
  delete static_cast<NpuAllocator*>(allocator);
  return true;
}

OrtDataTransferImpl* NewNpuDataTransfer() {
  auto* t = new OrtDataTransferImpl();
  std::memset(t, 0, sizeof(OrtDataTransferImpl));
  t->ort_version_supported = kOrtApiVersion;
  t->Release = ReleaseTransfer;
  t->CanCopy = CanCopy;
  t->CopyTensors = CopyTensors;
  return t;
}

}  // namespace npu_ep
