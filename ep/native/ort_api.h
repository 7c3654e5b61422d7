// The ORT API tables (filled once in CreateEpFactories) and error helpers shared by the shim's files.
#pragma once

#include <stdexcept>
#include <string>

#include "onnxruntime_c_api.h"  // includes onnxruntime_ep_c_api.h

namespace npu_ep {

// We request API 23 (ORT 1.23, what our headers describe) explicitly: newer runtimes accept it, and a newer header
// must not silently make us depend on a runtime we do not have.
inline constexpr uint32_t kOrtApiVersion = 23;

extern const OrtApi* g_ort;
extern const OrtEpApi* g_ep_api;
extern const OrtModelEditorApi* g_model_editor;

// OrtApi 24's GetTensorElementTypeAndShapeDataReference (ORT >= 1.24): a tensor's element type and a pointer to its
// own dims, with no OrtTensorTypeAndShapeInfo allocated and freed. nullptr on older runtimes (InitShapeApi).
using TensorShapeRefFn = OrtStatus*(ORT_API_CALL*)(const OrtValue*, ONNXTensorElementDataType*, const int64_t**,
                                                   size_t*);
extern TensorShapeRefFn g_tensor_shape_ref;

// A failed ORT call or a check of ours, carried to the callback boundary and turned into an OrtStatus there.
struct OrtError : std::runtime_error {
  OrtErrorCode code;
  OrtError(OrtErrorCode c, const std::string& m) : std::runtime_error(m), code(c) {}
};

inline void Check(OrtStatus* status) {
  if (status == nullptr) return;
  std::string msg = g_ort->GetErrorMessage(status);
  OrtErrorCode code = g_ort->GetErrorCode(status);
  g_ort->ReleaseStatus(status);
  throw OrtError(code, msg);
}

inline OrtStatus* MakeStatus(OrtErrorCode code, const std::string& msg) {
  return g_ort->CreateStatus(code, msg.c_str());
}

}  // namespace npu_ep
