#include "py_bridge.h"

#include <dlfcn.h>

#include <cstdio>

#include <pybind11/embed.h>

namespace npu_ep {

bool PythonAlive() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

void EnsurePython() {
  if (Py_IsInitialized()) return;
  // ORT dlopen()s plugins RTLD_LOCAL: a libpython we pulled in is not in the global scope, and Python extension
  // modules (numpy) would fail with undefined Py* symbols. Promote it before starting the interpreter.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Py_IsInitialized), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  py::initialize_interpreter();
  PyEval_SaveThread();  // let any ORT thread take the GIL
}

void SafeDrop(py::object& o) {
  if (!o) return;
  if (PythonAlive()) {
    py::gil_scoped_acquire gil;
    o = py::object();
  } else {
    o.release();  // interpreter is gone or finalizing: leak rather than crash
  }
}

const char* NumpyDtypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "uint16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "uint32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return nullptr;
  }
}

py::dtype NumpyDtype(ONNXTensorElementDataType t) {
  const char* name = NumpyDtypeName(t);
  if (!name) throw OrtError(ORT_NOT_IMPLEMENTED, "tensor element type " + std::to_string(static_cast<int>(t)) +
                                                     " cannot be handed to the NPU runtime");
  return py::dtype(name);
}

TensorMeta GetTensorMeta(const OrtValue* v) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  Check(g_ort->GetTensorTypeAndShape(v, &info));
  TensorMeta m{};
  size_t rank = 0;
  OrtStatus* s = g_ort->GetTensorElementType(info, &m.elem_type);
  if (!s) s = g_ort->GetDimensionsCount(info, &rank);
  if (!s) {
    m.dims.resize(rank);
    s = g_ort->GetDimensions(info, m.dims.data(), rank);
  }
  g_ort->ReleaseTensorTypeAndShapeInfo(info);
  Check(s);
  return m;
}

// Base object for zero-copy views: without one pybind11 copies the buffer.
static py::handle ViewBase() {
  static PyObject* base = py::capsule(reinterpret_cast<void*>(&ViewBase), "npu_ep.view_base").release().ptr();
  return base;
}

py::array TensorView(const OrtValue* v, const py::dtype& dtype, const TensorMeta& meta) {
  const void* data = nullptr;
  Check(g_ort->GetTensorData(v, &data));
  std::vector<py::ssize_t> shape(meta.dims.begin(), meta.dims.end());
  py::array a(dtype, shape, {}, data, ViewBase());
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::array TensorCopy(const OrtValue* v) {
  TensorMeta meta = GetTensorMeta(v);
  const void* data = nullptr;
  Check(g_ort->GetTensorData(v, &data));
  std::vector<py::ssize_t> shape(meta.dims.begin(), meta.dims.end());
  return py::array(NumpyDtype(meta.elem_type), shape, {}, data);  // no base: pybind11 copies
}

py::handle InitializerBase() {
  static PyObject* base =
      py::capsule(reinterpret_cast<void*>(&InitializerBase), "npu_ep.ort_initializer").release().ptr();
  return base;
}

py::array InitializerBytes(const void* data, size_t bytes) {
  py::array a(py::dtype("uint8"), {static_cast<py::ssize_t>(bytes)}, {}, data, InitializerBase());
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::array InitializerView(const OrtValue* v) {
  TensorMeta meta = GetTensorMeta(v);
  const void* data = nullptr;
  Check(g_ort->GetTensorData(v, &data));
  std::vector<py::ssize_t> shape(meta.dims.begin(), meta.dims.end());
  py::array a(NumpyDtype(meta.elem_type), shape, {}, data, InitializerBase());
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

}  // namespace npu_ep
