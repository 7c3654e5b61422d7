"""Test helper: one ONNX node run on ORT's CPU EP and through our kernel (support check, prepare, run, cost).

Inputs are ``(name, array, constant)``; constants become initializers, so the kernel sees them at prepare time
exactly as the EP compiler would. Output types and shapes are taken from ORT's run (then the kernel gets a fully
static NodeInfo, as on a static-shape target).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.support import why_not
from npu_ep.kernels.target import Target

OPSETS = {"": 21, "com.microsoft": 1}


def _tensor(name: str, arr: np.ndarray, elem: int | None) -> onnx.TensorProto:
    if elem in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return helper.make_tensor(name, elem, arr.shape, arr.reshape(-1).astype(np.int64).tolist())
    return numpy_helper.from_array(arr, name)


def model(op: str, inputs, n_out: int = 1, domain: str = "", out_types=None, **attrs) -> onnx.ModelProto:
    """inputs: list of (name, array | None, constant[, onnx elem type override e.g. INT4])."""
    inits, gin, names = [], [], []
    for spec in inputs:
        name, arr, const = spec[:3]
        elem = spec[3] if len(spec) > 3 else None
        names.append(name if arr is not None else "")
        if arr is None:
            continue
        if const:
            inits.append(_tensor(name, arr, elem))
        else:
            gin.append(helper.make_tensor_value_info(name, elem or helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                     arr.shape))
    outs = [helper.make_tensor_value_info(f"y{i}", out_types[i], None) if out_types and i in out_types
            else helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)]
    node = helper.make_node(op, names, [o.name for o in outs], domain=domain, **attrs)
    ops = [helper.make_opsetid("", OPSETS[""])] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph([node], "g", gin, outs, inits), opset_imports=ops, ir_version=10)


def run_ort(m: onnx.ModelProto, inputs) -> list[np.ndarray]:
    feeds = {s[0]: s[1] for s in inputs if s[1] is not None and not s[2]}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _with_output_types(m: onnx.ModelProto, outs: list[np.ndarray]) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for o, arr in zip(m.graph.output, outs):
        o.CopyFrom(helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    return m


def run_npu(m: onnx.ModelProto, inputs, target: str | Target = "npu-ref", ref_outs=None, fuse: bool = False):
    """(outputs, prepared, cost) of our kernel on the single node; asserts the target accepts it."""
    t = Target.load(target) if isinstance(target, str) else target
    if ref_outs is not None:
        m = _with_output_types(m, ref_outs)
    (node,) = nodes_from_model(m)
    reason = why_not(node, t)
    assert reason is None, reason
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, t)
    feeds = {s[0]: s[1] for s in inputs if s[1] is not None and not s[2]}
    args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    for a in args:
        if a is not None:
            a.setflags(write=False)
    outs = k.run(p, args)
    shapes = [None if v.missing else (tuple(v.value.shape) if v.value is not None else tuple(feeds[v.name].shape))
              for v in node.inputs]
    return list(outs), p, k.cost(p, shapes)


def both(op: str, inputs, target: str | Target = "npu-ref", domain: str = "", **attrs):
    """Run one node on ORT CPU and on our kernel; returns (ours, reference, prepared, cost)."""
    m = model(op, inputs, domain=domain, **attrs)
    ref = run_ort(m, inputs)
    ours, p, cost = run_npu(m, inputs, target, ref)
    return ours, ref, p, cost


def declined(op: str, inputs, target: str | Target, domain: str = "", **attrs) -> str | None:
    """The decline reason of ``target`` for this node (None if accepted)."""
    t = Target.load(target) if isinstance(target, str) else target
    m = model(op, inputs, domain=domain, **attrs)
    ref = run_ort(m, inputs)
    (node,) = nodes_from_model(_with_output_types(m, ref))
    return why_not(node, t)


def run_nodes(nodes, feeds: dict, target: Target, kernels: str = "native") -> dict:
    """Run a list of (fused or plain) NodeInfos in order through their kernels on ``kernels`` (two host threads);
    returns every value by name, feeds included."""
    from npu_ep.kernels import runtime

    env = dict(feeds)
    for nd in nodes:
        k = kernel_for(nd.domain, nd.op_type)
        p = k.prepare(nd, target)
        p.target = target
        runtime.configure([p], kernels, 2)
        outs = k.run(p, [None if v.missing or v.is_constant else env[v.name] for v in nd.inputs])
        env.update({o.name: a for o, a in zip(nd.outputs, outs)})
    return env
