"""Input dims that a model's attention nodes fix: KV heads and head sizes of the past inputs, and which symbolic dims
are the past, new and total sequence lengths.

onnxruntime-genai's models declare their KV cache as ``[batch_size, Nkv, past_sequence_length, kv_cache_dim]``: a
generic size (1) for ``kv_cache_dim`` makes GroupQueryAttention refuse the inputs ("past_key dimension 3 should
match the packed KV head dimension"). The sizes come from the graph itself: the attention node's head-count
attributes and the width of its query (the N of the MatMulNBits or the columns of the MatMul weight producing it).
Nothing here guesses from names; ``run.resolve_dims`` falls back to names only where the structure says nothing.
"""

from __future__ import annotations

import dataclasses

import onnx

Axis = tuple[str, int]  # (graph input name, axis)


@dataclasses.dataclass(frozen=True)
class _AttentionOp:
    past: tuple[int, int]  # input indices of past key / past value
    heads_attr: str  # attribute with the number of query heads
    kv_heads_attr: str | None  # attribute with the number of KV heads (None: as many as query heads)
    value: int  # input index of the separate value (its width gives the value head size)


# (domain, op type) -> where its past inputs are and how it counts heads
_OPS = {
    ("com.microsoft", "GroupQueryAttention"): _AttentionOp((3, 4), "num_heads", "kv_num_heads", 2),
    ("com.microsoft", "MultiHeadAttention"): _AttentionOp((6, 7), "num_heads", None, 2),
    ("", "Attention"): _AttentionOp((4, 5), "q_num_heads", "kv_num_heads", 2),
}
# ops whose output keeps the last dim of their first input
_WIDTH_PRESERVING = {"Cast", "Identity", "Relu", "Sigmoid", "Tanh", "Gelu", "FastGelu", "BiasGelu", "Erf", "Neg",
                     "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                     "SkipSimplifiedLayerNormalization", "RMSNormalization", "RotaryEmbedding", "Dropout"}
_MAX_DEPTH = 16


@dataclasses.dataclass
class AttentionDims:
    sizes: dict[Axis, tuple[int, str]]  # (input, axis) -> (size, which node needs it)
    past: list[Axis]  # axes that are a past sequence length


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.inputs = {i.name: i for i in g.input if i.name not in self.inits}
        self.infos = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
        self.producers = {o: n for n in g.node for o in n.output if o}
        self.nodes = list(g.node)

    def width(self, name: str, depth: int = 0) -> int | None:
        """The static last dim of tensor ``name``, from declarations or the nodes producing it; None if unknown."""
        if not name or depth > _MAX_DEPTH:
            return None
        if name in self.inits:
            dims = self.inits[name].dims
            return int(dims[-1]) if dims else None
        info = self.infos.get(name)
        if info is not None and info.type.tensor_type.HasField("shape"):
            dims = info.type.tensor_type.shape.dim
            if dims and dims[-1].HasField("dim_value") and dims[-1].dim_value > 0:
                return int(dims[-1].dim_value)
        node = self.producers.get(name)
        if node is None:
            return None
        ins = list(node.input)
        if node.op_type == "MatMulNBits":
            return _attr(node, "N")
        if node.op_type in ("MatMul", "FusedMatMul", "MatMulInteger") and len(ins) > 1 and ins[1] in self.inits:
            return self.width(ins[1], depth + 1)
        if node.op_type == "Gemm" and len(ins) > 1 and ins[1] in self.inits:
            dims = self.inits[ins[1]].dims
            return int(dims[0] if _attr(node, "transB") else dims[-1]) if len(dims) == 2 else None
        if node.op_type in ("Add", "Sub", "Mul", "Div"):
            return next((w for w in (self.width(i, depth + 1) for i in ins[:2]) if w and w > 1), None)
        if node.op_type in _WIDTH_PRESERVING and ins:
            return self.width(ins[0], depth + 1)
        if node.op_type == "Reshape" and len(ins) > 1 and ins[1] in self.inits:
            shape = onnx.numpy_helper.to_array(self.inits[ins[1]]).reshape(-1)
            return int(shape[-1]) if shape.size and shape[-1] > 0 else None
        return None


def _attr(node: onnx.NodeProto, name: str) -> int | None:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return None


def _declared(inp: onnx.ValueInfoProto) -> list:
    return list(inp.type.tensor_type.shape.dim)


def attention_dims(model: onnx.ModelProto) -> AttentionDims:
    """Per past graph input of a GroupQueryAttention / MultiHeadAttention / Attention node: the KV heads (axis 1)
    and head size (axis 3) that node needs, and its past length axis (2)."""
    g = _Graph(model)
    out = AttentionDims({}, [])
    for node in g.nodes:
        op = _OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if op is None:
            continue
        ins = list(node.input)
        pasts = [ins[i] if i < len(ins) and ins[i] in g.inputs else "" for i in op.past]
        if not any(pasts) or _attr(node, op.heads_attr) is None:
            continue
        heads = _attr(node, op.heads_attr)
        kv_heads = _attr(node, op.kv_heads_attr) if op.kv_heads_attr else heads
        kv_heads = kv_heads or heads
        query = g.width(ins[0]) if ins else None
        packed = op.past == (3, 4) and all(not ins[i] for i in (1, 2) if i < len(ins))
        head = query // (heads + 2 * kv_heads) if query and packed else query // heads if query else None
        value_width = g.width(ins[op.value]) if not packed and op.value < len(ins) else None
        value_head = value_width // kv_heads if value_width else head
        why = f"{node.op_type} '{node.name}' needs"
        for past, size in zip(pasts, (head, value_head)):
            if not past or len(_declared(g.inputs[past])) != 4:
                continue
            out.sizes[(past, 1)] = (kv_heads, f"{why} {kv_heads} KV heads")
            if size:
                out.sizes[(past, 3)] = (size, f"{why} head size {size}")
            out.past.append((past, 2))
    return out
