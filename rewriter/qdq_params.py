"""Reading a QDQ node unit's quantization parameters, and the unit conditions every Q/DQ rule checks.

Each condition returns a ``MatchResult``: a success, or a failure naming the value or node and the reason, so a
rule's ``check`` returns the first failure as it is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

INT8_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)


@dataclasses.dataclass
class QParams:
    """Quantization parameters of one Q or DQ node (constants only)."""

    node: ir.Node
    scale: ir.Value
    zero_point: ir.Value | None
    scale_np: np.ndarray
    zp_np: np.ndarray  # the zero point, materialized (ONNX default 0) in the quantized dtype
    qtype: ir.DataType  # the integer type on the quantized side

    @property
    def per_tensor(self) -> bool:
        return self.scale_np.size == 1

    def same_as(self, other: QParams) -> bool:
        return (self.qtype == other.qtype and self.scale_np.dtype == other.scale_np.dtype
                and self.scale_np.shape == other.scale_np.shape and np.array_equal(self.scale_np, other.scale_np)
                and np.array_equal(self.zp_np.reshape(self.scale_np.shape), other.zp_np.reshape(other.scale_np.shape))
                and (self.per_tensor or axis(self.node) == axis(other.node)))


def axis(node: ir.Node) -> int:
    return node.attributes.get_int("axis", 1)


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    return value.const_value.numpy()


def qparams(value: ir.Value) -> QParams | MatchResult:
    """Params of the Q/DQ node producing ``value`` (a DQ's float output or a Q's integer output), or the failed
    ``MatchResult`` saying why they are not usable (blocked, or a scale / zero point that is not a constant)."""
    node = value.producer()
    if node.attributes.get_int("block_size", 0):
        return MatchResult().fail(f"{node.op_type} {node.name!r} is blocked; only per-tensor/per-channel units "
                                  "fuse", node)
    scale_np = _const(node.inputs[1])
    if scale_np is None:
        return MatchResult().fail(f"scale of {node.op_type} {node.name!r} is not a constant", node.inputs[1] or node)
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None:
        qtype = zp.dtype
    elif node.op_type == "DequantizeLinear":
        qtype = node.inputs[0].dtype
    else:
        qtype = ir.DataType(node.attributes.get_int("output_dtype", 0) or ir.DataType.UINT8)
    if zp is not None:
        zp_np = _const(zp)
        if zp_np is None:
            return MatchResult().fail(f"zero point of {node.op_type} {node.name!r} is not a constant", zp)
    else:
        zp_np = np.zeros(scale_np.shape, dtype=np.int64)
    return QParams(node, node.inputs[1], zp, scale_np, zp_np.astype(np.int64), qtype)


def unit_params(*values: ir.Value) -> list[QParams] | MatchResult:
    """``qparams`` of each value, or the first failure."""
    params = []
    for v in values:
        p = qparams(v)
        if isinstance(p, MatchResult):
            return p
        params.append(p)
    return params


def first_failure(*results: MatchResult) -> MatchResult:
    """The first failed result, else a success (the checks are cheap and side-effect free)."""
    return next((r for r in results if not r), MatchResult())


def single_use(value: ir.Value, what: str) -> MatchResult:
    if value.is_graph_output():
        return MatchResult().fail(f"{what} {value.name!r} is a graph output", value)
    if len(value.uses()) != 1:
        return MatchResult().fail(f"{what} {value.name!r} has {len(value.uses())} consumers, a QDQ unit needs 1",
                                  value)
    return MatchResult()


def int8(p: QParams, what: str) -> MatchResult:
    if p.qtype not in INT8_TYPES:
        return MatchResult().fail(f"{what} is {p.qtype}; the integer op takes int8/uint8", p.node)
    return MatchResult()


def per_tensor(p: QParams, what: str) -> MatchResult:
    if not p.per_tensor:
        return MatchResult().fail(f"{what} has per-channel scale of shape {list(p.scale_np.shape)}; needs "
                                  "per-tensor", p.node)
    return MatchResult()
