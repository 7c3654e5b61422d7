"""``npu::MatMulEpilogue``: a matmul-family op with bias / relu / quantize folded into its tile loop.

Built by ``kernels.fusion.epilogue``; delegates to the base kernel's prepare with the epilogue spec, so the epilogue
is applied in place on the accumulator (no intermediate arrays) and the cost model charges it as overlapped
vector work instead of separate ops with DRAM round trips.
"""

from __future__ import annotations

from ..fusion.epilogue import base_node, epilogue_consts
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, kernel_for, register
from ..target import Target
from . import matmul, matmul_int, matmul_nbits

_PREPARE = {("", "MatMul"): matmul.prepare_float, ("", "Gemm"): matmul.prepare_float,
            ("com.microsoft", "MatMulNBits"): matmul_nbits.prepare_nbits,
            ("com.microsoft", "MatMulIntegerToFloat"): matmul_int.prepare_int}


def _key(p: Prepared) -> tuple[str, str]:
    return p.attrs["fused_base"]


def _check(node: NodeInfo, target: Target) -> str | None:
    base = base_node(node)
    if base.key not in _PREPARE:
        return f"{node.describe()}: no fused epilogue for base op {base.op_type}"
    return kernel_for(*base.key).check(base, target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    base = base_node(node)
    p = _PREPARE[base.key](base, target, dict(node.attrs["epilogue"]), epilogue_consts(node))
    p.attrs["fused_base"] = list(base.key)
    p.attrs["fused_nodes"] = list(node.attrs["fused_nodes"])
    return p


def _run(p: Prepared, inputs):
    return kernel_for(*p.attrs["fused_base"]).run(p, inputs)


def _cost(p: Prepared, shapes) -> OpCost:
    return kernel_for(*p.attrs["fused_base"]).cost(p, shapes)


def _bind(p: Prepared, inputs, outs):
    """The base kernel's native step, which applies the epilogue: the float matmul's, MatMulNBits' for a
    constant bias (``bind_nbits`` declines other epilogues), MatMulIntegerToFloat's for a bias and ReLU (it declines
    a fused QuantizeLinear)."""
    key = tuple(_key(p))
    if key in (("", "MatMul"), ("", "Gemm")):
        return matmul.bind_float(p, inputs, outs)
    if key == ("com.microsoft", "MatMulNBits"):
        return matmul_nbits.bind_nbits(p, inputs, outs)
    if key == ("com.microsoft", "MatMulIntegerToFloat"):
        return matmul_int.bind_int(p, inputs, outs)
    return None


register(KernelDef("npu", "MatMulEpilogue", _prepare, _run, _cost, _check, bind=_bind))
