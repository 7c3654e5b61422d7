// ORT graph objects -> plain Python dicts (the Python compiler's input). No decisions here.
#pragma once

#include <string>
#include <vector>

#include "python_interop.h"

namespace npu_ep {

// Constant initializers from this size on are borrowed (read in place) when borrowing is on; smaller ones are
// copied: ORT re-creates small initializers in the session state, so their Compile-time memory does not last.
inline constexpr size_t kBorrowMinBytes = 64 << 10;

// Constant initializer values larger than this are not copied into GetCapability's view (capability needs
// shapes and small constants such as Reshape targets; Compile gets every value).
inline constexpr size_t kCapabilityValueLimit = 1 << 20;

std::vector<const OrtNode*> GraphNodes(const OrtGraph* graph);

// Looks up OrtApi::TensorTypeAndShape_HasShape (ORT >= 1.24) so a tensor of unknown rank is told from a scalar.
// Called once from CreateEpFactories; without it (ORT 1.23) both read as rank 0.
void InitShapeApi(const OrtApiBase* api_base);

// {"name", "elem_type", "shape" (list of int|str|None; None: unknown rank), "is_constant", "is_graph_input",
//  "is_graph_output", and for a constant of <= value_limit bytes either "value" (numpy copy) or, for int4/uint4,
//  which numpy has no dtype for, "packed_value" (ONNX's packed bytes as uint8, low nibble first; Python unpacks)}
// borrow: constant values of kBorrowMinBytes or more are read-only views of ORT's initializers (InitializerView)
// instead of copies; only for initializers ORT keeps for the session (fused with drop_constant_initializers=false).
py::dict DescribeValue(const OrtValueInfo* vi, size_t value_limit, bool borrow = false);

// {"index", "name", "op_type", "domain", "since_version", "inputs", "outputs", "attrs", "ep"}; nodes holding
// graphs (If/Loop/Scan) add "subgraphs" ({attribute name: DescribeGraph}) and "implicit_inputs" (outer-scope values
// read inside them, as values).
py::dict DescribeNode(const OrtNode* node, size_t index, size_t value_limit, bool borrow = false);

// {"name", "nodes" (DescribeNode each), "inputs" (formal inputs, in order), "outputs" (values)}: a branch/body graph.
py::dict DescribeGraph(const OrtGraph* graph, size_t value_limit);

std::vector<const OrtValueInfo*> NodeInputs(const OrtNode* node);
std::vector<const OrtValueInfo*> NodeOutputs(const OrtNode* node);
std::string ValueName(const OrtValueInfo* vi);
std::string NodeName(const OrtNode* node);

// All session config entries (provider options arrive as "ep.npuep.<key>").
py::dict SessionConfig(const OrtSessionOptions* options);

}  // namespace npu_ep
