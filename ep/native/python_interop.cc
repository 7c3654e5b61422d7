#include "python_interop.h"

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

std::string PythonErrorText(py::error_already_set& e) {
  try {
    return py::module_::import("npu_ep.ep.entry_points").attr("error_text")(e.value()).cast<std::string>();
  } catch (...) {  // the formatter itself failed (e.g. during interpreter shutdown): pybind11's text, traceback and all
    return e.what();
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
  if (!name)
    throw OrtError(ORT_NOT_IMPLEMENTED, "tensor element type " + std::to_string(static_cast<int>(t)) +
                                            " cannot be handed to the NPU runtime");
  return py::dtype(name);
}

TensorMeta GetTensorMeta(const OrtValue* v) {
  TensorMeta m{};
  ReadTensorMeta(v, m);
  return m;
}

void ReadTensorMeta(const OrtValue* v, TensorMeta& m) {
  if (g_tensor_shape_ref != nullptr) {
    const int64_t* dims = nullptr;
    size_t rank = 0;
    Check(g_tensor_shape_ref(v, &m.elem_type, &dims, &rank));
    m.dims.assign(dims, dims + rank);
    return;
  }
  OrtTensorTypeAndShapeInfo* info = nullptr;
  Check(g_ort->GetTensorTypeAndShape(v, &info));
  size_t rank = 0;
  OrtStatus* s = g_ort->GetTensorElementType(info, &m.elem_type);
  if (!s) s = g_ort->GetDimensionsCount(info, &rank);
  if (!s) {
    m.dims.resize(rank);
    s = g_ort->GetDimensions(info, m.dims.data(), rank);
  }
  g_ort->ReleaseTensorTypeAndShapeInfo(info);
  Check(s);
}

// Base object for zero-copy views: without one pybind11 copies the buffer.
static py::handle ViewBase() {
  static PyObject* base = py::capsule(reinterpret_cast<void*>(&ViewBase), "npu_ep.view_base").release().ptr();
  return base;
}

py::array TensorView(const OrtValue* v, const py::handle& dtype, const TensorMeta& meta) {
  static_assert(sizeof(int64_t) == sizeof(Py_intptr_t), "ORT's dims are handed to numpy as they are");
  const void* data = nullptr;
  Check(g_ort->GetTensorData(v, &data));
  // numpy's own constructor, as pybind11's py::array(dtype, shape, strides, data, base) calls it, without its
  // shape/stride vectors and with the view created read-only (flags 0) instead of cleared afterwards.
  auto& api = py::detail::npy_api::get();
  auto dims = const_cast<Py_intptr_t*>(reinterpret_cast<const Py_intptr_t*>(meta.dims.data()));
  PyObject* raw =
      api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype.inc_ref().ptr(), static_cast<int>(meta.dims.size()), dims,
                                nullptr, const_cast<void*>(data), 0, nullptr);
  if (!raw) throw py::error_already_set();
  py::array a = py::reinterpret_steal<py::array>(raw);
  if (!data) {  // an empty tensor without a buffer: numpy allocated one (writeable), as pybind11 did
    py::detail::array_proxy(raw)->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
  }
  if (api.PyArray_SetBaseObject_(raw, ViewBase().inc_ref().ptr()) != 0) throw py::error_already_set();
  return a;
}

py::array OutputView(void* data, const py::handle& dtype, const std::vector<int64_t>& dims) {
  auto& api = py::detail::npy_api::get();
  auto shape = const_cast<Py_intptr_t*>(reinterpret_cast<const Py_intptr_t*>(dims.data()));
  PyObject* raw = api.PyArray_NewFromDescr_(
      api.PyArray_Type_, dtype.inc_ref().ptr(), static_cast<int>(dims.size()), shape, nullptr, data,
      py::detail::npy_api::NPY_ARRAY_WRITEABLE_ | py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_, nullptr);
  if (!raw) throw py::error_already_set();
  py::array a = py::reinterpret_steal<py::array>(raw);
  if (data && api.PyArray_SetBaseObject_(raw, ViewBase().inc_ref().ptr()) != 0) throw py::error_already_set();
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
