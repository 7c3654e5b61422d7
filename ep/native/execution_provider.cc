#include "execution_provider.h"

#include <cstring>
#include <map>

#include "graph_view.h"
#include "program_call.h"

namespace npu_ep {

namespace {

struct NpuComputeInfo : OrtNodeComputeInfo {
  NpuEp* ep;
};

OrtStatus* ORT_API_CALL CreateState(OrtNodeComputeInfo* self, OrtNodeComputeContext* ctx, void** state) noexcept {
  auto* ep = static_cast<NpuComputeInfo*>(self)->ep;
  const char* name = g_ep_api->NodeComputeContext_NodeName(ctx);
  std::lock_guard<std::mutex> lock(ep->mu);
  auto it = ep->kernels.find(name ? name : "");
  if (it == ep->kernels.end())
    return MakeStatus(ORT_EP_FAIL, std::string("NpuEP: no compiled partition named ") + (name ? name : "?"));
  *state = it->second.get();
  return nullptr;
}

void ORT_API_CALL ReleaseState(OrtNodeComputeInfo*, void*) noexcept {}

OrtStatus* ORT_API_CALL Compute(OrtNodeComputeInfo*, void* state, OrtKernelContext* ctx) noexcept {
  return ComputePartition(static_cast<PartitionKernel*>(state), ctx);
}

const char* ORT_API_CALL GetName(const OrtEp* self) noexcept { return static_cast<const NpuEp*>(self)->name.c_str(); }

py::dict GraphInfo(const OrtGraph* graph, bool with_parent = false) {
  py::dict d;
  const char* name = nullptr;
  const ORTCHAR_T* path = nullptr;
  Check(g_ort->Graph_GetName(graph, &name));
  Check(g_ort->Graph_GetModelPath(graph, &path));
  const OrtNode* parent = nullptr;
  Check(g_ort->Graph_GetParentNode(graph, &parent));
  d["name"] = name ? name : "";
  d["model_path"] = path ? path : "";
  d["is_subgraph"] = parent != nullptr;  // ORT partitions If/Loop bodies before the graph holding them
  // The node holding this subgraph, with all its branches: capability decides from it whether the whole If is
  // claimed later (then this branch is compiled with it) before ORT has shown it the sibling branch.
  if (with_parent && parent) d["parent"] = DescribeNode(parent, 0, kCapabilityValueLimit);
  return d;
}

OrtStatus* ORT_API_CALL GetCapability(OrtEp* self, const OrtGraph* graph, OrtEpGraphSupportInfo* support) noexcept {
  auto* ep = static_cast<NpuEp*>(self);
  return WithPython("GetCapability", [&]() {
    std::vector<const OrtNode*> nodes = GraphNodes(graph);
    py::list described;
    for (size_t i = 0; i < nodes.size(); ++i) described.append(DescribeNode(nodes[i], i, kCapabilityValueLimit));
    py::object groups = ep->session.attr("get_capability")(described, GraphInfo(graph, true));
    OrtNodeFusionOptions fusion{};
    fusion.ort_version_supported = kOrtApiVersion;
    // Borrowing: ORT keeps the weights and the program reads them in place; else Compile copies them.
    fusion.drop_constant_initializers = !ep->borrow_initializers;
    for (py::handle group : groups) {
      std::vector<const OrtNode*> selected;
      for (py::handle idx : group) {
        size_t i = idx.cast<size_t>();
        if (i >= nodes.size()) throw OrtError(ORT_EP_FAIL, "capability returned node index out of range");
        selected.push_back(nodes[i]);
      }
      if (!selected.empty())
        Check(g_ep_api->EpGraphSupportInfo_AddNodesToFuse(support, selected.data(), selected.size(), &fusion));
    }
  });
}

// EPContext node for one compiled partition, attributes given by Python as {name: int | str | bytes}.
void MakeEpContextNode(const OrtNode* fused, const py::dict& spec, OrtNode** out) {
  std::vector<std::string> in_names, out_names;
  for (auto* v : NodeInputs(fused)) in_names.push_back(ValueName(v));
  for (auto* v : NodeOutputs(fused)) out_names.push_back(ValueName(v));
  std::vector<const char*> in_c, out_c;
  for (auto& s : in_names) in_c.push_back(s.c_str());
  for (auto& s : out_names) out_c.push_back(s.c_str());
  std::string node_name = spec["node_name"].cast<std::string>();
  std::vector<OrtOpAttr*> attrs;
  std::vector<std::string> keep;  // strings must live until CreateOpAttr copied them
  auto release = [&]() {
    for (auto* a : attrs) g_ort->ReleaseOpAttr(a);
  };
  try {
    for (auto item : spec["attrs"].cast<py::dict>()) {
      std::string key = item.first.cast<std::string>();
      OrtOpAttr* a = nullptr;
      if (py::isinstance<py::int_>(item.second)) {
        int64_t v = item.second.cast<int64_t>();
        Check(g_ort->CreateOpAttr(key.c_str(), &v, 1, ORT_OP_ATTR_INT, &a));
      } else {
        keep.push_back(item.second.cast<std::string>());  // str or bytes
        Check(g_ort->CreateOpAttr(key.c_str(), keep.back().data(), static_cast<int>(keep.back().size()),
                                  ORT_OP_ATTR_STRING, &a));
      }
      attrs.push_back(a);
    }
    Check(g_model_editor->CreateNode("EPContext", "com.microsoft", node_name.c_str(), in_c.data(), in_c.size(),
                                     out_c.data(), out_c.size(), attrs.data(), attrs.size(), out));
  } catch (...) {
    release();
    throw;
  }
  release();  // CreateNode copied them
}

// Whether a tensor of this element type may cross a partition boundary: capability's own rule
// (npu_ep.dtypes.crosses_boundary), so Compile refuses exactly what GetCapability never claims.
static bool CrossesBoundary(ONNXTensorElementDataType et) {
  static PyObject* rule = py::object(py::module_::import("npu_ep.dtypes").attr("crosses_boundary")).release().ptr();
  return py::reinterpret_borrow<py::object>(rule)(static_cast<int>(et)).cast<bool>() && NumpyDtypeName(et);
}

std::vector<ONNXTensorElementDataType> ElementTypes(const py::list& values, const std::string& partition,
                                                    std::vector<py::object>& dtypes) {
  std::vector<ONNXTensorElementDataType> types;
  for (py::handle v : values) {
    auto et = static_cast<ONNXTensorElementDataType>(v["elem_type"].cast<int>());
    if (!CrossesBoundary(et)) {
      py::module_ dtypes_mod = py::module_::import("npu_ep.dtypes");
      auto type = dtypes_mod.attr("type_name")(static_cast<int>(et)).cast<std::string>();
      auto name = py::module_::import("npu_ep.log").attr("escape")(v["name"]).cast<std::string>();
      throw OrtError(ORT_NOT_IMPLEMENTED, "partition '" + partition + "': value '" + name + "' has element type " +
                                              type + ", which the NPU runtime cannot carry");
    }
    types.push_back(et);
    dtypes.push_back(NumpyDtype(et));
  }
  return types;
}

OrtStatus* ORT_API_CALL Compile(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count,
                                OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes) noexcept {
  auto* ep = static_cast<NpuEp*>(self);
  for (size_t i = 0; i < count; ++i) infos[i] = nullptr;
  return WithPython("Compile", [&]() {
    for (size_t gi = 0; gi < count; ++gi) {
      const OrtNode* fused = fused_nodes[gi];
      auto kernel = std::make_unique<PartitionKernel>();
      kernel->name = NodeName(fused);
      kernel->where = "partition '" + kernel->name + "'";
      py::list inputs, outputs, nodes;
      std::vector<const OrtNode*> graph_nodes = GraphNodes(graphs[gi]);
      for (size_t i = 0; i < graph_nodes.size(); ++i)
        nodes.append(DescribeNode(graph_nodes[i], i, SIZE_MAX, ep->borrow_initializers));
      // The fused node's own value infos do not know they are initializers; the partition's nodes' inputs do.
      std::map<std::string, const OrtValue*> constants;
      if (ep->borrow_initializers)
        for (auto* node : graph_nodes)
          for (auto* v : NodeInputs(node)) {
            bool is_const = false;
            if (v) Check(g_ort->ValueInfo_IsConstantInitializer(v, &is_const));
            if (!is_const) continue;
            const OrtValue* value = nullptr;
            Check(g_ort->ValueInfo_GetInitializerValue(v, &value));
            constants[ValueName(v)] = value;
          }
      std::vector<const OrtValueInfo*> fused_inputs = NodeInputs(fused);
      for (size_t i = 0; i < fused_inputs.size(); ++i) {
        auto c = constants.find(ValueName(fused_inputs[i]));
        if (c == constants.end()) {
          inputs.append(DescribeValue(fused_inputs[i], 0));
          continue;
        }
        // ORT passes the weight on every call; the program already reads it through the compile-time view.
        BorrowedInput b{i, nullptr, 0, c->first};
        if (c->second) {
          Check(g_ort->GetTensorSizeInBytes(c->second, &b.bytes));
          const void* data = nullptr;
          if (b.bytes >= kBorrowMinBytes) Check(g_ort->GetTensorData(c->second, &data));  // else: a copy
          b.data.store(data);
        }
        kernel->borrowed.push_back(std::move(b));
      }
      for (auto* v : NodeOutputs(fused)) outputs.append(DescribeValue(v, 0));
      kernel->input_types = ElementTypes(inputs, kernel->name, kernel->input_dtypes);
      kernel->output_types = ElementTypes(outputs, kernel->name, kernel->output_dtypes);
      std::map<std::string, std::string> producer;  // value name -> "node 'n' (op)"
      for (py::handle n : nodes) {
        std::string who = "node '" + n["name"].cast<std::string>() + "' (" + n["op_type"].cast<std::string>() + ")";
        for (py::handle v : n["outputs"]) producer[v["name"].cast<std::string>()] = who;
      }
      for (py::handle v : outputs) {
        std::vector<int64_t> dims;
        py::object shape = v["shape"];
        if (!shape.is_none())
          for (py::handle d : shape) dims.push_back(py::isinstance<py::int_>(d) ? d.cast<int64_t>() : -1);
        kernel->output_dims.push_back(std::move(dims));
        kernel->output_rank_known.push_back(!shape.is_none());
        std::string out_name = v["name"].cast<std::string>();
        auto who = producer.find(out_name);
        kernel->output_producers.push_back(who != producer.end() ? who->second : "the partition");
        kernel->output_names.push_back(std::move(out_name));
        kernel->output_warned.push_back(0);
      }

      py::tuple result = ep->session.attr("compile")(kernel->name, nodes, inputs, outputs, GraphInfo(graphs[gi]));
      kernel->program = result[0];
      if (!PyCallable_Check(kernel->program.ptr()))
        throw OrtError(ORT_EP_FAIL, "compile of partition '" + kernel->name + "' returned no callable program");
      // The program's C++ call (program_call.h): ORT's calls then enter no Python frame before the first kernel.
      kernel->call = py::getattr(kernel->program, "_call", py::none());
      kernel->call_ptr = AsProgramCall(kernel->call);
      if (py::hasattr(kernel->program, "label"))  // readable name for messages; ORT's node name stays the key
        kernel->where = "partition " + kernel->program.attr("label").cast<std::string>();
      if (ep_context_nodes && !result[1].is_none())
        MakeEpContextNode(fused, result[1].cast<py::dict>(), &ep_context_nodes[gi]);
      kernel->stats = StatsFor(kernel->name);

      auto info = std::make_unique<NpuComputeInfo>();
      std::memset(static_cast<OrtNodeComputeInfo*>(info.get()), 0, sizeof(OrtNodeComputeInfo));
      info->ort_version_supported = kOrtApiVersion;
      info->CreateState = CreateState;
      info->Compute = Compute;
      info->ReleaseState = ReleaseState;
      info->ep = ep;
      {
        std::lock_guard<std::mutex> lock(ep->mu);
        ep->kernels[kernel->name] = std::move(kernel);
      }
      infos[gi] = info.release();
    }
  });
}

void ORT_API_CALL ReleaseNodeComputeInfos(OrtEp*, OrtNodeComputeInfo** infos, size_t n) noexcept {
  for (size_t i = 0; i < n; ++i) delete static_cast<NpuComputeInfo*>(infos[i]);
}

OrtStatus* ORT_API_CALL GetPreferredDataLayout(OrtEp*, OrtEpDataLayout* layout) noexcept {
  *layout = OrtEpDataLayout_NCHW;
  return nullptr;
}

const char* ORT_API_CALL GetCompatibilityInfo(OrtEp* self, const OrtGraph* graph) noexcept {
  auto* ep = static_cast<NpuEp*>(self);
  OrtStatus* s = WithPython("GetCompiledModelCompatibilityInfo", [&]() {
    ep->compat_info = ep->session.attr("compatibility_info")(GraphInfo(graph)).cast<std::string>();
  });
  if (s) {
    g_ort->ReleaseStatus(s);
    ep->compat_info.clear();
  }
  return ep->compat_info.c_str();
}

// The session's own NPU allocator, so that its counters are its own (the factory's serves the environment).
OrtStatus* ORT_API_CALL CreateAllocator(OrtEp* self, const OrtMemoryInfo* info, OrtAllocator** allocator) noexcept {
  *allocator = nullptr;
  if (info != nullptr && !IsNpuMemory(g_ep_api->MemoryInfo_GetMemoryDevice(info)))
    return MakeStatus(ORT_INVALID_ARGUMENT, "NpuEP: no allocator for that memory (NpuEP allocates NPU memory)");
  *allocator = NewNpuAllocator(static_cast<NpuEp*>(self)->device_key);
  return nullptr;
}

}  // namespace

NpuEp::NpuEp(NpuEpFactory* f, std::string n, py::object s) : factory(f), name(std::move(n)), session(std::move(s)) {
  std::memset(static_cast<OrtEp*>(this), 0, sizeof(OrtEp));
  ort_version_supported = kOrtApiVersion;
  GetName = npu_ep::GetName;
  OrtEp::GetCapability = npu_ep::GetCapability;
  OrtEp::Compile = npu_ep::Compile;
  OrtEp::ReleaseNodeComputeInfos = npu_ep::ReleaseNodeComputeInfos;
  OrtEp::GetPreferredDataLayout = npu_ep::GetPreferredDataLayout;
  OrtEp::GetCompiledModelCompatibilityInfo = GetCompatibilityInfo;
  OrtEp::CreateAllocator = npu_ep::CreateAllocator;
}

NpuEp::~NpuEp() {
  {
    std::lock_guard<std::mutex> lock(mu);
    kernels.clear();
  }
  if (PythonAlive()) {
    py::gil_scoped_acquire gil;
    try {
      session.attr("release")();
    } catch (py::error_already_set&) {
      PyErr_Clear();
    }
  }
  SafeDrop(session);
}

}  // namespace npu_ep
