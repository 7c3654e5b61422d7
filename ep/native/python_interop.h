// Python interop: running a callback body with the GIL, numpy views of ORT tensors, and dtype mapping.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "embedded_python.h"
#include "ort_api.h"

namespace npu_ep {
namespace py = pybind11;

bool PythonAlive();

// Start an interpreter when loaded into a non-Python host (C/C++ application); no-op inside Python.
void EnsurePython();

// Drop a Python reference safely, also during interpreter shutdown (then it is leaked on purpose).
void SafeDrop(py::object& o);

// The text of a Python exception for an OrtStatus: npu_ep.ep.entry_points.error_text (type and message; the traceback
// only at log_level=debug), or pybind11's own text if that cannot run. Call with the GIL held.
std::string PythonErrorText(py::error_already_set& e);

// Run body() with the GIL held. Every exception becomes an OrtStatus naming `where`; a Python exception's text is
// PythonErrorText's. The GIL is taken outside the try so error_already_set is formatted while holding it.
template <typename F>
OrtStatus* WithPython(const std::string& where, F&& body) noexcept {
  if (!PythonAlive()) return MakeStatus(ORT_EP_FAIL, "NpuEP: Python interpreter not available in " + where);
  AdoptHostThread();  // a non-Python host's thread keeps one thread state, not one per call
  py::gil_scoped_acquire gil;
  try {
    body();
    return nullptr;
  } catch (py::error_already_set& e) {
    return MakeStatus(ORT_EP_FAIL, "NpuEP: " + where + ": " + PythonErrorText(e));
  } catch (OrtError& e) {
    return MakeStatus(e.code, "NpuEP: " + where + ": " + e.what());
  } catch (std::exception& e) {
    return MakeStatus(ORT_EP_FAIL, "NpuEP: " + where + ": " + e.what());
  } catch (...) {
    return MakeStatus(ORT_EP_FAIL, "NpuEP: " + where + ": unknown C++ exception");
  }
}

// numpy dtype for an ONNX element type, or nullptr when numpy cannot carry it.
const char* NumpyDtypeName(ONNXTensorElementDataType t);
py::dtype NumpyDtype(ONNXTensorElementDataType t);

struct TensorMeta {
  ONNXTensorElementDataType elem_type;
  std::vector<int64_t> dims;
};
TensorMeta GetTensorMeta(const OrtValue* v);
// The same into `meta`, reusing its dims' capacity (a partition call reads every input's with no allocation of ours).
void ReadTensorMeta(const OrtValue* v, TensorMeta& meta);

// Read-only zero-copy view of an ORT tensor: valid only while ORT keeps the tensor alive (one Compute call).
py::array TensorView(const OrtValue* v, const py::handle& dtype, const TensorMeta& meta);
// A writeable numpy view (C order) of `data`, ORT's buffer of a partition output: valid until Compute returns.
py::array OutputView(void* data, const py::handle& dtype, const std::vector<int64_t>& dims);

// Owned copy of an ORT tensor (initializers we keep beyond the lifetime of the OrtGraph).
py::array TensorCopy(const OrtValue* v);

// Read-only zero-copy view of a constant initializer that ORT keeps for the session (fused with
// drop_constant_initializers=false). Its base is InitializerBase(), so Python can tell it from memory it owns.
py::array InitializerView(const OrtValue* v);
py::array InitializerBytes(const void* data, size_t bytes);  // the same, as flat read-only uint8
py::handle InitializerBase();

}  // namespace npu_ep
