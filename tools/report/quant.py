"""Three-way numerics for quantized models (``npu-report --compare --float-model FLOAT.onnx``).

Why three ways: NpuEP's output differs from the float model for two unrelated reasons, quantization (the int4/int8
weights, a property of the model) and the compiler/kernels (tiling, accumulation order, requantization: a property
of NpuEP). Comparing NpuEP with the float model mixes them; comparing NpuEP with the quantized model on the CPU EP
hides the first. So three runs on the same feeds:

- **float reference**: the quantized model with its quantized weights replaced by the original float ones from the
  user's float model (same graph otherwise, so every intermediate tensor name matches), on the CPU EP;
- **quantized reference**: the quantized model on the CPU EP (same scales as NpuEP uses);
- **NpuEP**: the quantized model on NpuEP.

Weight substitution: a ``com.microsoft::MatMulNBits`` node becomes ``MatMul(A, W)`` (+ ``Add`` of its bias) where
``W`` [K, N] is the float initializer the float model's ``MatMul`` producing the same output tensor multiplies by
(the int4 pass keeps output names); a ``DequantizeLinear`` of a constant becomes the float initializer that the
float model's node of the same name reads at the same input position. Activation Q/DQ pairs stay (they are not
weights). When some quantized weight has no float counterpart, the float model itself is the float reference
(``float_source: "float model"``): per-output numbers stay exact, per-node rows only where tensor names match.

Per tensor: ``quant_error`` = float ref vs quantized ref, ``kernel_error`` = quantized ref vs NpuEP (max abs and
max relative = max|d| / max|ref|); ``dominant`` names the larger max abs ("quantization" or "compiler/kernel";
``None`` when both are exactly 0). The document's ``dominant`` is that of the first graph output (the logits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

QUANT_OPS = {"MatMulNBits", "DequantizeLinear", "QuantizeLinear", "QLinearMatMul", "QLinearConv", "MatMulInteger",
             "MatMulIntegerToFloat", "DynamicQuantizeLinear", "QLinearAdd", "QLinearMul"}


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QUANT_OPS for n in model.graph.node)


def _float_init(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for t in model.graph.initializer:
        if t.name == name:
            arr = numpy_helper.to_array(t)
            return arr if np.issubdtype(arr.dtype, np.floating) else None
    return None


def _unique(taken: set[str], base: str) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def float_reference(quant: onnx.ModelProto, float_model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """(the quantized graph with float weights, {"substituted": [...], "unmatched": [...]}) (module docstring)."""
    producer = {o: n for n in float_model.graph.node for o in n.output}
    by_name = {n.name: n for n in float_model.graph.node if n.name}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in quant.graph.node:
        for i, name in enumerate(n.input):
            consumers.setdefault(name, []).append((n, i))
    quant_inits = {t.name for t in quant.graph.initializer}
    taken = {t.name for t in quant.graph.initializer} | {o for n in quant.graph.node for o in n.output}
    nodes, inits, substituted, unmatched = [], [], [], []
    for n in quant.graph.node:
        if n.op_type == "MatMulNBits" and n.domain == "com.microsoft":
            f = producer.get(n.output[0]) or by_name.get(n.name.removesuffix("_Q4"))
            w = _float_init(float_model, f.input[1]) if f is not None and f.op_type == "MatMul" else None
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if w is None or w.shape != (attrs.get("K"), attrs.get("N")):
                unmatched.append(n.name)
                nodes.append(n)
                continue
            wname = _unique(taken, f"{n.name}_float_W")
            inits.append(numpy_helper.from_array(w, wname))
            bias = n.input[5] if len(n.input) > 5 and n.input[5] else None
            mm_out = _unique(taken, f"{n.output[0]}_float_mm") if bias else n.output[0]
            nodes.append(helper.make_node("MatMul", [n.input[0], wname], [mm_out], name=n.name))
            if bias:
                nodes.append(helper.make_node("Add", [mm_out, bias], [n.output[0]], name=f"{n.name}_bias"))
            substituted.append(n.name)
        elif n.op_type == "DequantizeLinear" and n.input[0] in quant_inits:
            w = None
            for reader, pos in consumers.get(n.output[0], []):
                f = by_name.get(reader.name)
                if f is not None and pos < len(f.input):
                    w = _float_init(float_model, f.input[pos])
                    if w is not None:
                        break
            x = next(t for t in quant.graph.initializer if t.name == n.input[0])
            if w is None or w.shape != tuple(x.dims):
                unmatched.append(n.name)
                nodes.append(n)
                continue
            scale = next((t for t in quant.graph.initializer if t.name == n.input[1]), None)
            if scale is not None:  # DequantizeLinear's output has the scale's dtype
                w = w.astype(helper.tensor_dtype_to_np_dtype(scale.data_type))
            inits.append(numpy_helper.from_array(w, n.output[0]))
            substituted.append(n.name)
        else:
            nodes.append(n)
    m = onnx.ModelProto()
    m.CopyFrom(quant)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend(inits)
    return m, {"substituted": substituted, "unmatched": unmatched}


def diff(ref: np.ndarray, got: np.ndarray) -> dict[str, float | None]:
    """max abs and max relative (max|d| / max|ref|) difference; ``None`` on a shape mismatch."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return {"max_abs": None, "max_rel": None}
    r, g = ref.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):  # equal infinities (masks: -inf on both sides) agree
        d = np.where((g == r) | (np.isnan(g) & np.isnan(r)), 0.0, np.abs(g - r))
    max_abs = float(np.max(d)) if d.size else 0.0
    finite = np.abs(r[np.isfinite(r)])
    scale = float(np.max(finite)) if finite.size else 0.0
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale else max_abs}


def dominant(quant_abs: float | None, kernel_abs: float | None) -> str | None:
    """Which error is larger: "quantization" (float vs quantized reference) or "compiler/kernel"."""
    if quant_abs is None or kernel_abs is None or quant_abs == kernel_abs == 0:
        return None
    return "quantization" if quant_abs >= kernel_abs else "compiler/kernel"


def _row(tensor: str, node: str | None, f: np.ndarray, q: np.ndarray, npu: np.ndarray) -> dict[str, Any]:
    qe, ke = diff(f, q), diff(q, npu)
    return {"tensor": tensor, "node": node, "shape": list(np.shape(q)),
            "quant_max_abs": qe["max_abs"], "quant_max_rel": qe["max_rel"],
            "kernel_max_abs": ke["max_abs"], "kernel_max_rel": ke["max_rel"],
            "dominant": dominant(qe["max_abs"], ke["max_abs"])}


def three_way(float_ref: Mapping[str, np.ndarray], quant_ref: Mapping[str, np.ndarray],
              npu_outputs: Mapping[str, np.ndarray], npu_nodes: Sequence[tuple[str, str, np.ndarray]],
              output_names: Sequence[str], info: Mapping[str, Any]) -> dict[str, Any]:
    """Per graph output and per NpuEP-recorded tensor ``(node, tensor, value)`` present in all three runs."""
    outputs = [_row(o, None, float_ref[o], quant_ref[o], npu_outputs[o]) for o in output_names
               if o in float_ref and o in quant_ref and o in npu_outputs]
    nodes = [_row(t, node, float_ref[t], quant_ref[t], v) for node, t, v in npu_nodes
             if t in float_ref and t in quant_ref]
    main = outputs[0] if outputs else None
    return {"float_source": info["float_source"], "substituted": len(info["substituted"]),
            "unmatched_weights": list(info["unmatched"]), "outputs": outputs, "nodes": nodes,
            "dominant": main["dominant"] if main else None}
