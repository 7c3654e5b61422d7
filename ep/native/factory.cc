// OrtEpFactory and the two exported entry points ORT looks up in a plugin EP library.
#include <cstring>
#include <string>

#include "device_memory.h"
#include "execution_provider.h"
#include "graph_view.h"

#define NPU_EP_EXPORT __attribute__((visibility("default")))

namespace npu_ep {

const OrtApi* g_ort = nullptr;
const OrtEpApi* g_ep_api = nullptr;
const OrtModelEditorApi* g_model_editor = nullptr;

inline constexpr const char* kEntryPointsModule = "npu_ep.ep.entry_points";
inline constexpr const char* kMemoryKey = "npu_ep.memory";  // OrtEpDevice metadata: "host" or "npu"
// The NPU-memory factory's name: the registered name plus this. Its OrtEpDevice must not share the EP name of the
// host-memory one: hosts that append every device of a name (onnxruntime-genai) would hand ORT two devices with
// different device memories, which ORT refuses.
inline constexpr const char* kNpuMemorySuffix = "NpuMemory";

struct NpuEpFactory : OrtEpFactory {
  std::string ep_name;       // the EP's name (OrtEp::GetName, ORT's graph assignment): the registered name
  std::string factory_name;  // its OrtEpDevice's ep_name: the registered name, or + kNpuMemorySuffix
  std::string memory;        // where partitions keep inputs/outputs: "host" or "npu" (device_memory.h)
  std::string vendor = "NpuEP";
  std::string version;
};

namespace {

const char* ORT_API_CALL FactoryName(const OrtEpFactory* f) noexcept {
  return static_cast<const NpuEpFactory*>(f)->factory_name.c_str();
}
const char* ORT_API_CALL FactoryVendor(const OrtEpFactory* f) noexcept {
  return static_cast<const NpuEpFactory*>(f)->vendor.c_str();
}
uint32_t ORT_API_CALL FactoryVendorId(const OrtEpFactory*) noexcept { return kNpuVendorId; }
const char* ORT_API_CALL FactoryVersion(const OrtEpFactory* f) noexcept {
  return static_cast<const NpuEpFactory*>(f)->version.c_str();
}

// One OrtEpDevice on the CPU per factory: the emulated NPU computes in host memory either way. The host-memory
// factory's (what providers=["NpuEP"] selects) keeps partition inputs and outputs in host memory, where ORT's CPU
// allocator serves them and no copy is made; the NPU-memory factory's declares NPU memory as its device memory, so
// ORT allocates partition inputs and outputs there and copies at CPU<->NPU boundaries through NpuEP's data
// transfer. Metadata npu_ep.memory says which.
OrtStatus* ORT_API_CALL GetSupportedDevices(OrtEpFactory* f, const OrtHardwareDevice* const* devices, size_t n,
                                            OrtEpDevice** ep_devices, size_t max_ep_devices,
                                            size_t* num_ep_devices) noexcept {
  auto* factory = static_cast<NpuEpFactory*>(f);
  *num_ep_devices = 0;
  for (size_t i = 0; i < n && *num_ep_devices < max_ep_devices; ++i) {
    if (g_ort->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    OrtKeyValuePairs* metadata = nullptr;
    g_ort->CreateKeyValuePairs(&metadata);
    g_ort->AddKeyValuePair(metadata, "npu_ep.device", "emulated-npu");
    g_ort->AddKeyValuePair(metadata, kMemoryKey, factory->memory.c_str());
    OrtEpDevice* device = nullptr;
    OrtStatus* s = g_ep_api->CreateEpDevice(f, devices[i], metadata, nullptr, &device);
    g_ort->ReleaseKeyValuePairs(metadata);
    if (s) return s;
    if (factory->memory == "npu" && (s = g_ep_api->EpDevice_AddAllocatorInfo(device, NpuMemoryInfo()))) return s;
    ep_devices[(*num_ep_devices)++] = device;
    break;
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL CreateEp(OrtEpFactory* f, const OrtHardwareDevice* const*, const OrtKeyValuePairs* const*,
                                 size_t num_devices, const OrtSessionOptions* options, const OrtLogger*,
                                 OrtEp** out) noexcept {
  auto* factory = static_cast<NpuEpFactory*>(f);
  *out = nullptr;
  if (num_devices != 1) return MakeStatus(ORT_INVALID_ARGUMENT, "NpuEP: expected exactly one device");
  EnsurePython();
  return WithPython("CreateEp", [&]() {
    py::object entry_points = py::module_::import(kEntryPointsModule);
    py::dict config = SessionConfig(options);
    const bool writes_epcontext = config.attr("get")("ep.context_enable", "0").cast<std::string>() == "1";
    // ORT names the provider options' session keys after the device's ep_name: ep.<factory name>.<key>
    py::object session = entry_points.attr("create_ep")(factory->ep_name, config, factory->factory_name);
    auto* ep = new NpuEp(factory, factory->ep_name, std::move(session));
    ep->session.attr("device_stats_key") = ep->device_key;
    ep->session.attr("device_memory") = factory->memory;
    ep->borrow_initializers = !writes_epcontext;
    *out = ep;
  });
}

void ORT_API_CALL ReleaseEp(OrtEpFactory*, OrtEp* ep) noexcept { delete static_cast<NpuEp*>(ep); }

OrtStatus* ORT_API_CALL ValidateCompatibility(OrtEpFactory*, const OrtHardwareDevice* const*, size_t, const char* info,
                                              OrtCompiledModelCompatibility* result) noexcept {
  *result = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
  EnsurePython();
  return WithPython("ValidateCompiledModelCompatibilityInfo", [&]() {
    int verdict = py::module_::import(kEntryPointsModule).attr("validate_compatibility")(info ? info : "").cast<int>();
    *result = static_cast<OrtCompiledModelCompatibility>(verdict);
  });
}

// Fields "since 1.23" are called unconditionally by ORT when ort_version_supported >= 23: all must be set.
// The environment's shared NPU allocator (values users create outside a session); sessions get their own from
// OrtEp::CreateAllocator, so their counters stay apart.
OrtStatus* ORT_API_CALL CreateAllocator(OrtEpFactory*, const OrtMemoryInfo* info, const OrtKeyValuePairs*,
                                        OrtAllocator** allocator) noexcept {
  *allocator = nullptr;
  if (info != nullptr && !IsNpuMemory(g_ep_api->MemoryInfo_GetMemoryDevice(info)))
    return MakeStatus(ORT_INVALID_ARGUMENT, "NpuEP: no allocator for that memory (NpuEP allocates NPU memory)");
  *allocator = NewNpuAllocator(0);
  return nullptr;
}
void ORT_API_CALL ReleaseAllocator(OrtEpFactory*, OrtAllocator* allocator) noexcept { ReleaseNpuAllocator(allocator); }
OrtStatus* ORT_API_CALL CreateDataTransfer(OrtEpFactory* f, OrtDataTransferImpl** transfer) noexcept {
  // CPU<->NPU and NPU<->NPU, from the factory whose device has NPU memory; the host-memory one copies nothing
  *transfer = static_cast<NpuEpFactory*>(f)->memory == "npu" ? NewNpuDataTransfer() : nullptr;
  return nullptr;
}
bool ORT_API_CALL IsStreamAware(const OrtEpFactory*) noexcept { return false; }
OrtStatus* ORT_API_CALL CreateSyncStream(OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                         OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

}  // namespace
}  // namespace npu_ep

extern "C" {

NPU_EP_EXPORT OrtStatus* CreateEpFactories(const char* registered_name, const OrtApiBase* api_base, const OrtLogger*,
                                           OrtEpFactory** factories, size_t max_factories, size_t* num_factories) {
  using namespace npu_ep;
  *num_factories = 0;
  const OrtApi* api = api_base->GetApi(kOrtApiVersion);
  if (!api) return nullptr;  // runtime older than 1.23: no OrtApi to even build an error status with
  // The API tables are process-wide and the last registration's serve every session. Two copies of one ORT
  // version (onnxruntime's Python module and the libonnxruntime onnxruntime-genai loads) run the same code on the
  // same structures; a different version would not, so it is refused.
  static std::string first_version;
  const std::string version = api_base->GetVersionString();
  if (first_version.empty()) first_version = version;
  if (version != first_version) {
    return api->CreateStatus(ORT_FAIL, ("NpuEP: already serving ONNX Runtime " + first_version +
                                        " in this process; "
                                        "it cannot also serve ONNX Runtime " +
                                        version)
                                           .c_str());
  }
  g_ort = api;
  InitShapeApi(api_base);
  g_ep_api = api->GetEpApi();
  g_model_editor = api->GetModelEditorApi();
  if (!g_ep_api || !g_model_editor) return MakeStatus(ORT_FAIL, "NpuEP: this ONNX Runtime build lacks the EP API");
  if (max_factories < 1) return MakeStatus(ORT_INVALID_ARGUMENT, "NpuEP: no room for a factory");
  if (OrtStatus* s = CreateDeviceMemoryInfo()) return s;

  // The host-memory factory first: providers=["NpuEP"] and hosts picking the first NpuEP device get it.
  const std::string names[2] = {registered_name, std::string(registered_name) + kNpuMemorySuffix};
  const char* memories[2] = {"host", "npu"};
  for (size_t k = 0; k < 2 && k < max_factories; ++k) {
    auto* f = new NpuEpFactory();
    std::memset(static_cast<OrtEpFactory*>(f), 0, sizeof(OrtEpFactory));
    f->ort_version_supported = kOrtApiVersion;
    f->ep_name = registered_name;
    f->factory_name = names[k];
    f->memory = memories[k];
    f->version = NPU_EP_VERSION;
    f->GetName = FactoryName;
    f->GetVendor = FactoryVendor;
    f->GetVendorId = FactoryVendorId;
    f->GetVersion = FactoryVersion;
    f->GetSupportedDevices = GetSupportedDevices;
    f->CreateEp = CreateEp;
    f->ReleaseEp = ReleaseEp;
    f->ValidateCompiledModelCompatibilityInfo = ValidateCompatibility;
    f->CreateAllocator = CreateAllocator;
    f->ReleaseAllocator = ReleaseAllocator;
    f->CreateDataTransfer = CreateDataTransfer;
    f->IsStreamAware = IsStreamAware;
    f->CreateSyncStreamForDevice = CreateSyncStream;
    factories[(*num_factories)++] = f;
  }
  return nullptr;
}

NPU_EP_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<npu_ep::NpuEpFactory*>(factory);
  return nullptr;
}

}  // extern "C"
