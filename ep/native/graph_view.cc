#include "graph_view.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace npu_ep {

namespace {
using HasShapeFn = bool(ORT_API_CALL*)(const OrtTensorTypeAndShapeInfo*);
HasShapeFn g_has_shape = nullptr;
}  // namespace

TensorShapeRefFn g_tensor_shape_ref = nullptr;

static_assert(sizeof(OrtApi) == 3120, "the API 24 entries below are read past the OrtApi of ORT 1.23's headers");

void InitShapeApi(const OrtApiBase* api_base) {
  // ORT 1.24 appended TensorTypeAndShape_HasShape right after CreateExternalInitializerInfo, the last entry of the
  // 1.23 OrtApi our headers describe. The table is append-only and one struct serves every version, so on a
  // runtime offering API 24 the function is the slot just past our OrtApi. Ask only runtimes >= 1.24 (GetApi
  // prints an error for versions it lacks).
  int major = 0, minor = 0;
  const char* version = api_base->GetVersionString();
  if (!version || std::sscanf(version, "%d.%d", &major, &minor) != 2 || (major == 1 && minor < 24)) return;
  const OrtApi* v24 = api_base->GetApi(24);
  if (!v24) return;
  const char* past = reinterpret_cast<const char*>(v24) + sizeof(OrtApi);
  std::memcpy(&g_has_shape, past, sizeof(g_has_shape));
  // API 24 appended 25 entries; GetTensorElementTypeAndShapeDataReference is the last (offset 3312 of its 3320-byte
  // OrtApi, read back from onnxruntime 1.31: the dims of a [2,3,4] float tensor).
  std::memcpy(&g_tensor_shape_ref, past + 24 * sizeof(void*), sizeof(g_tensor_shape_ref));
}

std::vector<const OrtNode*> GraphNodes(const OrtGraph* graph) {
  size_t n = 0;
  Check(g_ort->Graph_GetNumNodes(graph, &n));
  std::vector<const OrtNode*> nodes(n);
  if (n) Check(g_ort->Graph_GetNodes(graph, nodes.data(), n));
  return nodes;
}

std::string ValueName(const OrtValueInfo* vi) {
  if (!vi) return "";
  const char* name = nullptr;
  Check(g_ort->GetValueInfoName(vi, &name));
  return name ? name : "";
}

std::string NodeName(const OrtNode* node) {
  const char* name = nullptr;
  Check(g_ort->Node_GetName(node, &name));
  return name ? name : "";
}

std::vector<const OrtValueInfo*> NodeInputs(const OrtNode* node) {
  size_t n = 0;
  Check(g_ort->Node_GetNumInputs(node, &n));
  std::vector<const OrtValueInfo*> v(n);
  if (n) Check(g_ort->Node_GetInputs(node, v.data(), n));
  return v;
}

std::vector<const OrtValueInfo*> NodeOutputs(const OrtNode* node) {
  size_t n = 0;
  Check(g_ort->Node_GetNumOutputs(node, &n));
  std::vector<const OrtValueInfo*> v(n);
  if (n) Check(g_ort->Node_GetOutputs(node, v.data(), n));
  return v;
}

static py::object ShapeOf(const OrtTensorTypeAndShapeInfo* info) {
  size_t rank = 0;
  Check(g_ort->GetDimensionsCount(info, &rank));
  std::vector<int64_t> dims(rank);
  std::vector<const char*> sym(rank, nullptr);
  Check(g_ort->GetDimensions(info, dims.data(), rank));
  Check(g_ort->GetSymbolicDimensions(info, sym.data(), rank));
  py::list shape;
  for (size_t i = 0; i < rank; ++i) {
    if (dims[i] >= 0)
      shape.append(dims[i]);
    else if (sym[i] && *sym[i])
      shape.append(py::str(sym[i]));
    else
      shape.append(py::none());
  }
  return std::move(shape);
}

py::dict DescribeValue(const OrtValueInfo* vi, size_t value_limit, bool borrow) {
  py::dict d;
  d["name"] = ValueName(vi);
  d["elem_type"] = 0;
  d["shape"] = py::none();
  if (!vi) return d;  // omitted optional input
  const OrtTypeInfo* type = nullptr;
  Check(g_ort->GetValueInfoTypeInfo(vi, &type));
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;
  if (type) Check(g_ort->CastTypeInfoToTensorInfo(type, &tensor));
  if (tensor) {
    ONNXTensorElementDataType et;
    Check(g_ort->GetTensorElementType(tensor, &et));
    d["elem_type"] = static_cast<int>(et);
    // Unknown rank: no shape at all (GetDimensionsCount would report 0, i.e. a scalar).
    if (!g_has_shape || g_has_shape(tensor)) d["shape"] = ShapeOf(tensor);
  }
  bool is_const = false, is_input = false, is_output = false;
  Check(g_ort->ValueInfo_IsConstantInitializer(vi, &is_const));
  Check(g_ort->ValueInfo_IsRequiredGraphInput(vi, &is_input));
  Check(g_ort->ValueInfo_IsGraphOutput(vi, &is_output));
  d["is_constant"] = is_const;
  d["is_graph_input"] = is_input;
  d["is_graph_output"] = is_output;
  if (is_const) {
    const OrtValue* value = nullptr;
    Check(g_ort->ValueInfo_GetInitializerValue(vi, &value));
    if (value) {
      size_t bytes = 0;
      Check(g_ort->GetTensorSizeInBytes(value, &bytes));
      if (bytes < kBorrowMinBytes) borrow = false;
      if (bytes <= value_limit) {
        TensorMeta meta = GetTensorMeta(value);
        if (NumpyDtypeName(meta.elem_type)) {
          d["value"] = borrow ? InitializerView(value) : TensorCopy(value);
        } else if (meta.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT4 ||
                   meta.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT4) {
          // numpy has no 4-bit dtype: hand over ONNX's packed bytes (low nibble first); Python unpacks them.
          const void* data = nullptr;
          Check(g_ort->GetTensorData(value, &data));
          d["packed_value"] = borrow ? InitializerBytes(data, bytes)
                                     : py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(bytes)}, {}, data);
        }
      }
    }
  }
  return d;
}

static py::dict UnreadableAttr(int elem_type);

template <typename T>
static py::object ReadArrayAttr(const OrtOpAttr* a, OrtOpAttrType type) {
  size_t need = 0;
  OrtStatus* s = g_ort->ReadOpAttr(a, type, nullptr, 0, &need);  // size query reports "buffer too small"
  if (s) g_ort->ReleaseStatus(s);
  std::vector<T> v(need / sizeof(T));
  if (need) Check(g_ort->ReadOpAttr(a, type, v.data(), need, &need));
  py::list out;
  for (const T& x : v) out.append(x);
  return std::move(out);
}

static py::object ReadAttr(const OrtOpAttr* a, OrtOpAttrType type, const std::string& name) {
  size_t need = 0;
  switch (type) {
    case ORT_OP_ATTR_INT: {
      int64_t v = 0;
      Check(g_ort->ReadOpAttr(a, type, &v, sizeof(v), &need));
      return py::int_(v);
    }
    case ORT_OP_ATTR_FLOAT: {
      float v = 0;
      Check(g_ort->ReadOpAttr(a, type, &v, sizeof(v), &need));
      return py::float_(v);
    }
    case ORT_OP_ATTR_INTS: return ReadArrayAttr<int64_t>(a, type);
    case ORT_OP_ATTR_FLOATS: return ReadArrayAttr<float>(a, type);
    case ORT_OP_ATTR_STRING: {
      OrtStatus* s = g_ort->ReadOpAttr(a, type, nullptr, 0, &need);
      if (s) g_ort->ReleaseStatus(s);
      std::string v(need, '\0');
      if (need) Check(g_ort->ReadOpAttr(a, type, v.data(), need, &need));
      v.resize(need);
      if (name == "ep_cache_context") return py::bytes(v);  // binary-safe payload
      return py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(v.data(), (Py_ssize_t)v.size(), "replace"));
    }
    case ORT_OP_ATTR_STRINGS: {  // one buffer, each string NUL-terminated (ReadOpAttr's format)
      OrtStatus* s = g_ort->ReadOpAttr(a, type, nullptr, 0, &need);  // size query reports "buffer too small"
      if (s) g_ort->ReleaseStatus(s);
      std::string buf(need, '\0');
      if (need) Check(g_ort->ReadOpAttr(a, type, buf.data(), need, &need));
      py::list out;
      for (size_t at = 0; at < need;) {
        const size_t stop = std::min(buf.find('\0', at), need);
        out.append(py::reinterpret_steal<py::object>(
            PyUnicode_DecodeUTF8(buf.data() + at, static_cast<Py_ssize_t>(stop - at), "replace")));
        at = stop + 1;
      }
      return std::move(out);
    }
    case ORT_OP_ATTR_TENSOR: {
      OrtValue* value = nullptr;
      Check(g_ort->OpAttr_GetTensorAttributeAsOrtValue(a, &value));
      py::object arr;
      try {
        ONNXTensorElementDataType et = GetTensorMeta(value).elem_type;
        arr = NumpyDtypeName(et) ? py::object(TensorCopy(value)) : py::object(UnreadableAttr(static_cast<int>(et)));
      } catch (...) {
        g_ort->ReleaseValue(value);
        throw;
      }
      g_ort->ReleaseValue(value);
      return arr;
    }
    default: return py::none();  // GRAPH: read as subgraphs below
  }
}

// An attribute the EP cannot read: {"unreadable": element type of a tensor numpy cannot hold (a string tensor), or
// -1 for an attribute type the plugin API does not expose (TYPE_PROTO, SPARSE_TENSOR)}. Capability declines the
// node with a reason naming it; GetCapability must not fail on it (ORT would then log an error per graph).
static py::dict UnreadableAttr(int elem_type) {
  py::dict d;
  d["unreadable"] = elem_type;
  return d;
}

py::dict DescribeNode(const OrtNode* node, size_t index, size_t value_limit, bool borrow) {
  py::dict d;
  const char *op = nullptr, *domain = nullptr, *ep = nullptr;
  int since = 0;
  Check(g_ort->Node_GetOperatorType(node, &op));
  Check(g_ort->Node_GetDomain(node, &domain));
  Check(g_ort->Node_GetSinceVersion(node, &since));
  Check(g_ort->Node_GetEpName(node, &ep));
  d["index"] = index;
  d["name"] = NodeName(node);
  d["op_type"] = op ? op : "";
  d["domain"] = domain ? domain : "";
  d["since_version"] = since;
  d["ep"] = ep ? ep : "";
  py::list inputs, outputs;
  for (auto* v : NodeInputs(node)) inputs.append(DescribeValue(v, value_limit, borrow));
  for (auto* v : NodeOutputs(node)) outputs.append(DescribeValue(v, 0));
  d["inputs"] = inputs;
  d["outputs"] = outputs;

  size_t n = 0;
  Check(g_ort->Node_GetNumAttributes(node, &n));
  py::dict attrs;
  if (n) {
    std::vector<const OrtOpAttr*> av(n);
    Check(g_ort->Node_GetAttributes(node, av.data(), n));
    for (auto* a : av) {
      const char* name = nullptr;
      OrtOpAttrType type;
      Check(g_ort->OpAttr_GetName(a, &name));
      std::string sname = name ? name : "";
      if (OrtStatus* s = g_ort->OpAttr_GetType(a, &type)) {  // "Unexpected attribute type." (e.g. TYPE_PROTO)
        g_ort->ReleaseStatus(s);
        attrs[py::str(sname)] = UnreadableAttr(-1);
        continue;
      }
      attrs[py::str(sname)] = ReadAttr(a, type, sname);
    }
  }
  d["attrs"] = attrs;

  // If/Loop/Scan: the branch/body graphs (attribute name -> graph) and the outer-scope values they read. Subgraph
  // constants are copied, never borrowed: a claimed If's branches leave the session graph with the If node.
  size_t n_sub = 0;
  Check(g_ort->Node_GetNumSubgraphs(node, &n_sub));
  if (n_sub) {
    std::vector<const OrtGraph*> subs(n_sub);
    std::vector<const char*> names(n_sub, nullptr);
    Check(g_ort->Node_GetSubgraphs(node, subs.data(), n_sub, names.data()));
    py::dict subgraphs;
    for (size_t i = 0; i < n_sub; ++i)
      subgraphs[py::str(names[i] ? names[i] : "")] = DescribeGraph(subs[i], value_limit);
    d["subgraphs"] = subgraphs;
    size_t n_implicit = 0;
    Check(g_ort->Node_GetNumImplicitInputs(node, &n_implicit));
    std::vector<const OrtValueInfo*> implicit(n_implicit);
    if (n_implicit) Check(g_ort->Node_GetImplicitInputs(node, implicit.data(), n_implicit));
    py::list implicit_inputs;
    for (auto* v : implicit) implicit_inputs.append(DescribeValue(v, value_limit));
    d["implicit_inputs"] = implicit_inputs;
  }
  return d;
}

py::dict DescribeGraph(const OrtGraph* graph, size_t value_limit) {
  py::dict d;
  const char* name = nullptr;
  Check(g_ort->Graph_GetName(graph, &name));
  d["name"] = name ? name : "";
  std::vector<const OrtNode*> nodes = GraphNodes(graph);
  py::list described;
  for (size_t i = 0; i < nodes.size(); ++i) described.append(DescribeNode(nodes[i], i, value_limit));
  d["nodes"] = described;
  size_t n_in = 0;  // a Loop/Scan body's formal inputs bind by position (iteration, condition, carried, scanned)
  Check(g_ort->Graph_GetNumInputs(graph, &n_in));
  std::vector<const OrtValueInfo*> ins(n_in);
  if (n_in) Check(g_ort->Graph_GetInputs(graph, ins.data(), n_in));
  py::list inputs;
  for (auto* v : ins) inputs.append(DescribeValue(v, 0));
  d["inputs"] = inputs;
  size_t n = 0;
  Check(g_ort->Graph_GetNumOutputs(graph, &n));
  std::vector<const OrtValueInfo*> outs(n);
  if (n) Check(g_ort->Graph_GetOutputs(graph, outs.data(), n));
  py::list outputs;
  for (auto* v : outs) outputs.append(DescribeValue(v, 0));
  d["outputs"] = outputs;
  return d;
}

py::dict SessionConfig(const OrtSessionOptions* options) {
  py::dict out;
  OrtKeyValuePairs* kvps = nullptr;
  Check(g_ort->GetSessionOptionsConfigEntries(options, &kvps));
  const char* const* keys = nullptr;
  const char* const* values = nullptr;
  size_t n = 0;
  g_ort->GetKeyValuePairs(kvps, &keys, &values, &n);
  for (size_t i = 0; i < n; ++i) out[py::str(keys[i])] = py::str(values[i] ? values[i] : "");
  g_ort->ReleaseKeyValuePairs(kvps);
  return out;
}

}  // namespace npu_ep
