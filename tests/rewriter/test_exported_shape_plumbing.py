"""Cleanup on TorchScript-exporter idioms (no torch needed): shape plumbing -> constant operands, RMSNorm whose
ReduceMean takes axes as an attribute (opset 17), and the last dim a MatMul weight implies.

The graphs are hand-built in the exact spelling ``torch.onnx.export(dynamo=False)`` emits for
``q.view(*x.shape[:-1], -1, head_dim)``, HF ``repeat_kv`` (``expand`` lowers through Where(Equal(shape, -1)))
and ``rotate_half`` (``x.shape[-1] // 2``). Near misses (dims not provably equal, allowzero=1, a reduction over
the wrong axis) are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from npu_ep.rewriter import rewrite

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
H, N, HD = 64, 4, 16


class _G:
    """Tiny graph builder in TorchScript style: Constant nodes, Shape -> Gather -> Unsqueeze chains."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.k += 1
        out = f"{op_type.lower()}_{self.k}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"/{op_type}_{self.k}", **attrs))
        return out

    def const(self, value, dtype=np.int64) -> str:
        self.k += 1
        name = f"c_{self.k}"
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(np.array(value, dtype=dtype))))
        return name

    def weight(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def dim(self, x: str, axis: int) -> str:
        return self.op("Unsqueeze", self.op("Gather", self.op("Shape", x), self.const(axis), axis=0), self.const([0]))

    def model(self, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 10
        return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _cleanup(model: onnx.ModelProto):
    result = rewrite(model, passes=("cleanup",))
    return result, ir.serde.serialize_model(result.model)


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == op_type]
    return node


def _const_input(model: onnx.ModelProto, node: onnx.NodeProto, index: int) -> list[int] | None:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    arr = inits.get(node.input[index])
    return None if arr is None else [int(a) for a in arr.reshape(-1)]


def _shape(model: onnx.ModelProto, name: str) -> list:
    infos = {v.name: v for v in (*model.graph.value_info, *model.graph.output)}
    return [d.dim_param or d.dim_value for d in infos[name].type.tensor_type.shape.dim]


def _head_split(g: _G, x: str, source_of_dims: str, allowzero: int = 0) -> str:
    """q.view(*src.shape[:-1], -1, HD).transpose(1, 2) for q = x @ Wq."""
    q = g.op("MatMul", x, g.weight("wq", (np.random.default_rng(0).standard_normal((H, H)) / 8).astype(np.float32)))
    target = g.op("Concat", g.dim(source_of_dims, 0), g.dim(source_of_dims, 1), g.const([-1]), g.const([HD]), axis=0)
    attrs = {"allowzero": allowzero} if allowzero else {}
    return g.op("Transpose", g.op("Reshape", q, target, **attrs), perm=[0, 2, 1, 3])


def _total(g: _G, x: str) -> str:
    """A scalar graph output (a graph output whose shape inference would refine is not a drop-in)."""
    return g.op("ReduceSum", x, keepdims=0)


def _x(name: str = "x", dims=("batch", "sequence")):
    return helper.make_tensor_value_info(name, F32, [*dims, H])


def test_head_split_reshape_gets_a_constant_target_and_a_static_head_count():
    g = _G()
    out = _head_split(g, "x", "x")
    model = g.model([_x()], [helper.make_tensor_value_info(out, F32, ["batch", N, "sequence", HD])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 1
    reshape = _node(fused, "Reshape")
    assert _const_input(fused, reshape, 1) == [0, 0, N, HD]  # -1 absorbed the static 64: heads = 4
    assert _shape(fused, out) == ["batch", N, "sequence", HD]
    assert not [n for n in fused.graph.node if n.op_type in ("Shape", "Gather", "Concat")]
    x = np.random.default_rng(1).standard_normal((2, 3, H)).astype(np.float32)
    np.testing.assert_array_equal(_run(model, {"x": x})[0], _run(fused, {"x": x})[0])


def test_dims_of_another_value_are_not_assumed_equal():
    g = _G()
    out = _total(g, _head_split(g, "x", "other"))
    inputs = [_x(), helper.make_tensor_value_info("other", F32, ["p", "q", 5])]
    model = g.model(inputs, [helper.make_tensor_value_info(out, F32, [])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 0
    assert _const_input(fused, _node(fused, "Reshape"), 1) is None  # still computed at run time


def test_allowzero_reshape_is_left_alone():
    g = _G()
    out = _total(g, _head_split(g, "x", "x", allowzero=1))
    model = g.model([_x()], [helper.make_tensor_value_info(out, F32, [])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 0
    assert _const_input(fused, _node(fused, "Reshape"), 1) is None


def test_repeat_kv_expand_through_where_equal_minus_one_becomes_constant():
    g = _G()
    kv = "kv"
    x5 = g.op("Unsqueeze", kv, g.const([2]))
    shape = g.op("Concat", g.dim(kv, 0), g.dim(kv, 1), g.const([2]), g.dim(kv, 2), g.dim(kv, 3), axis=0)
    shape = g.op("Reshape", shape, g.const([-1]))
    ones = g.op("ConstantOfShape", g.const([5]), value=numpy_helper.from_array(np.array([1], np.int64)))
    keep = g.op("Where", g.op("Equal", shape, g.op("Mul", ones, g.const(-1))), ones, shape)
    out = g.op("Expand", x5, keep)
    kv_info = helper.make_tensor_value_info(kv, F32, ["batch", 2, "total", HD])
    model = g.model([kv_info], [helper.make_tensor_value_info(out, F32, ["batch", 2, 2, "total", HD])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 1
    assert _const_input(fused, _node(fused, "Expand"), 1) == [1, 2, 2, 1, HD]  # 1 keeps batch and total
    assert _shape(fused, out) == ["batch", 2, 2, "total", HD]
    feeds = {kv: np.random.default_rng(2).standard_normal((3, 2, 5, HD)).astype(np.float32)}
    np.testing.assert_array_equal(_run(model, feeds)[0], _run(fused, feeds)[0])


def test_rotate_half_slice_bound_from_shape_division_becomes_constant():
    g = _G()
    half = g.op("Unsqueeze", g.op("Div", g.op("Gather", g.op("Shape", "x"), g.const(2), axis=0), g.const(2)),
                g.const([0]))
    out = g.op("Slice", "x", g.const([0]), half, g.const([2]), g.const([1]))
    model = g.model([_x()], [helper.make_tensor_value_info(out, F32, ["batch", "sequence", H // 2])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 1
    assert _const_input(fused, _node(fused, "Slice"), 2) == [H // 2]
    assert _shape(fused, out) == ["batch", "sequence", H // 2]


def test_matmul_weight_fixes_the_last_dim_inference_lost():
    g = _G()
    # the attention output reshape after a mask of unknown shape: [?, ?, N, HD] -> [B, S, -1]
    merged = g.op("Reshape", "attn", g.op("Concat", g.dim("x", 0), g.dim("x", 1), g.const([-1]), axis=0))
    out = _total(g, g.op("MatMul", merged, g.weight("wo", np.eye(H, dtype=np.float32))))
    inputs = [_x(), helper.make_tensor_value_info("attn", F32, ["u", "v", N, HD])]
    model = g.model(inputs, [helper.make_tensor_value_info(out, F32, [])])
    _, fused = _cleanup(model)
    assert _shape(fused, merged)[-1] == H


def _rms_norm_opset17(axes: list[int]) -> onnx.ModelProto:
    g = _G()
    mean = g.op("ReduceMean", g.op("Pow", "x", g.const(2.0, np.float32)), axes=axes, keepdims=1)
    inv = g.op("Div", g.const(1.0, np.float32), g.op("Sqrt", g.op("Add", mean, g.const(1e-6, np.float32))))
    gamma = g.weight("gamma", np.linspace(0.5, 1.5, H, dtype=np.float32))
    out = g.op("Mul", gamma, g.op("Mul", "x", inv))
    return g.model([_x()], [helper.make_tensor_value_info(out, F32, ["batch", "sequence", H])])


def test_rms_norm_with_axes_attribute_is_fused():
    model = _rms_norm_opset17([-1])
    result, fused = _cleanup(model)
    assert result.report.counts["RmsNormDivFusionAxesAttr"] == 1
    assert [n.op_type for n in fused.graph.node] == ["SimplifiedLayerNormalization"]
    x = np.random.default_rng(3).standard_normal((2, 3, H)).astype(np.float32)
    np.testing.assert_allclose(_run(model, {"x": x})[0], _run(fused, {"x": x})[0], atol=1e-5)


def test_rms_norm_over_another_axis_is_not_fused():
    result, fused = _cleanup(_rms_norm_opset17([1]))
    assert result.report.counts["RmsNormDivFusionAxesAttr"] == 0
    assert "SimplifiedLayerNormalization" not in [n.op_type for n in fused.graph.node]
    assert any("last axis" in f.reason for f in result.report.failures)


def test_reshape_dim_of_an_intermediate_is_read_from_the_graph_input_with_its_name():
    """TorchScript SDPA's attn.view(B, -1, S, H): S comes from Shape(q) (an intermediate the attention rule
    must be able to replace), so it is re-read from the graph input that names the same dim."""
    g = _G()
    q = g.op("Transpose", g.op("Reshape", "x", g.const([0, 0, N, HD])), perm=[0, 2, 1, 3])  # [batch,N,sequence,HD]
    attn = g.op("Relu", "attn")
    target = g.op("Concat", g.dim(attn, 0), g.const([-1]), g.dim(q, 2), g.const([HD]), axis=0)
    out = _total(g, g.op("Mul", g.op("Reshape", attn, target), g.op("ReduceSum", q, keepdims=0)))
    inputs = [_x(), helper.make_tensor_value_info("attn", F32, ["u", N, "v", HD])]
    model = g.model(inputs, [helper.make_tensor_value_info(out, F32, [])])
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 1
    shapes = [n for n in fused.graph.node if n.op_type == "Shape"]
    assert [(n.input[0], _attrs(n)) for n in shapes] == [("x", {"start": 1, "end": 2})]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 3, H)).astype(np.float32),
             "attn": rng.standard_normal((2, N, 3, HD)).astype(np.float32)}
    np.testing.assert_allclose(_run(model, feeds)[0], _run(fused, feeds)[0], rtol=1e-6)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _kv_reshape_model(output_before: bool) -> onnx.ModelProto:
    """present = Concat(past, new) [batch,2,total,HD] ("total" known from the exporter's shapes only), k_rep =
    Relu(present), then Reshape(k_rep, [-1, T, H]) with T, H read from Shape(k_rep), as torchlib's last-two-dims
    transpose does. ``output_before``: present is a graph output (computed before the Reshape); else the only
    graph value naming "total" is computed from the Reshape's result (reading it would be a cycle)."""
    g = _G()
    present = g.op("Concat", "past", "new", axis=2)
    k_rep = g.op("Relu", present)
    outputs = []
    if output_before:
        outputs.append(helper.make_tensor_value_info(present, F32, ["batch", 2, "total", HD]))
    t = g.op("Slice", g.op("Shape", k_rep), g.const([-2]), g.const([-1]))
    h = g.op("Slice", g.op("Shape", k_rep), g.const([-1]), g.const([2 ** 62]))
    out = g.op("Reshape", k_rep, g.op("Concat", g.const([-1]), t, h, axis=0))
    if not output_before:
        outputs.append(helper.make_tensor_value_info(g.op("Identity", out), F32, ["rows", "total", HD]))
    outputs.append(helper.make_tensor_value_info(_total(g, out), F32, []))
    inputs = [helper.make_tensor_value_info(n, F32, ["batch", 2, d, HD]) for n, d in (("past", "p"), ("new", "s"))]
    model = g.model(inputs, outputs)
    for name in (present, k_rep):
        model.graph.value_info.append(helper.make_tensor_value_info(name, F32, ["batch", 2, "total", HD]))
    return model


def _feeds_kv() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"past": rng.standard_normal((2, 2, 3, HD)).astype(np.float32),
            "new": rng.standard_normal((2, 2, 1, HD)).astype(np.float32)}


def test_reshape_dim_is_read_from_a_graph_output_computed_before_it():
    model = _kv_reshape_model(output_before=True)
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 1
    assert [n.input[0] for n in fused.graph.node if n.op_type == "Shape"] == [fused.graph.output[0].name]
    for a, b in zip(_run(model, _feeds_kv()), _run(fused, _feeds_kv())):
        np.testing.assert_array_equal(a, b)


def test_a_graph_output_computed_after_the_reshape_is_not_read():
    model = _kv_reshape_model(output_before=False)
    result, fused = _cleanup(model)
    assert result.report.counts["ShapePlumbingToConstant"] == 0
    assert fused.graph.output[0].name not in {n.input[0] for n in fused.graph.node if n.op_type == "Shape"}
    for a, b in zip(_run(model, _feeds_kv()), _run(fused, _feeds_kv())):
        np.testing.assert_array_equal(a, b)
