"""Q/DQ rules: drop lossless pairs and fuse QDQ node units into ORT's integer ops.

A QDQ node unit (how ORT reads QDQ graphs) is ``DQ -> op -> Q``: every DQ feeds only that op, the op's output
feeds only one Q, scales and zero points are constants, and no intermediate value is a graph output. Rules:

- ``DropLosslessDqQ``: ``Q(DQ(x, s, z), s, z) -> x`` (identical constant params: exact).
- ``DropQdqRoundTrip``: ``DQ(Q(x, s, z), s, z) -> x`` only with ``drop_qdq_roundtrips`` (it is lossy).
- ``QLinearMatMul`` / ``QLinearConv`` / ``QLinearAdd`` / ``QLinearMul``: ``DQ... -> op -> Q`` units.
- ``MatMulIntegerToFloat``: ``DQ(a), DQ(b) -> MatMul`` with a float output (com.microsoft).
- ``QdqPassThrough<op>``: ``DQ -> Reshape/Transpose/Squeeze/Unsqueeze/Gather/Slice -> Q`` with identical
  per-tensor params becomes the op on the integer tensor (exact: it only moves data).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import IdentityEliminationPass
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from .options import RewriteOptions, RewriteReport
from .rule_set import apply_rule_set

INT8_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)
DATA_MOVEMENT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice")


class QdqFail(Exception):
    """Raised inside checks with a reason; turned into ``MatchResult().fail``."""

    def __init__(self, reason: str, where: ir.Value | ir.Node | None = None) -> None:
        super().__init__(reason)
        self.where = where


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
                and (self.per_tensor or _axis(self.node) == _axis(other.node)))


def _axis(node: ir.Node) -> int:
    return node.attributes.get_int("axis", 1)


def _const(value: ir.Value | None, what: str, node: ir.Node) -> np.ndarray:
    if value is None or value.const_value is None or value.is_graph_input():
        raise QdqFail(f"{what} of {node.op_type} {node.name!r} is not a constant", value or node)
    return value.const_value.numpy()


def qparams(value: ir.Value) -> QParams:
    """Params of the Q/DQ node producing ``value`` (a DQ's float output or a Q's integer output)."""
    node = value.producer()
    if node.attributes.get_int("block_size", 0):
        raise QdqFail(f"{node.op_type} {node.name!r} is blocked; only per-tensor/per-channel units fuse", node)
    scale_np = _const(node.inputs[1], "scale", node)
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None:
        qtype = zp.dtype
    elif node.op_type == "DequantizeLinear":
        qtype = node.inputs[0].dtype
    else:
        qtype = ir.DataType(node.attributes.get_int("output_dtype", 0) or ir.DataType.UINT8)
    if zp is not None:
        zp_np = _const(zp, "zero point", node)
    else:
        zp_np = np.zeros(scale_np.shape, dtype=np.int64)
    return QParams(node, node.inputs[1], zp, scale_np, zp_np.astype(np.int64), qtype)


def _single_use(value: ir.Value, what: str) -> None:
    if value.is_graph_output():
        raise QdqFail(f"{what} {value.name!r} is a graph output", value)
    if len(value.uses()) != 1:
        raise QdqFail(f"{what} {value.name!r} has {len(value.uses())} consumers, a QDQ unit needs 1", value)


def _int8(p: QParams, what: str) -> None:
    if p.qtype not in INT8_TYPES:
        raise QdqFail(f"{what} is {p.qtype}; the integer op takes int8/uint8", p.node)


def _scalar(p: QParams, what: str) -> None:
    if not p.per_tensor:
        raise QdqFail(f"{what} has per-channel scale of shape {list(p.scale_np.shape)}; needs per-tensor", p.node)


class _QdqRule(RewriteRuleClassBase):
    """Checks raise ``QdqFail``; this turns them into MatchResult failures with the reason."""

    def __init__(self, name: str, options: RewriteOptions) -> None:
        super().__init__(name)
        self.options = options

    def check(self, context, **bindings) -> MatchResult:
        result = MatchResult()
        try:
            self.check_unit(**bindings)
        except QdqFail as e:
            return result.fail(str(e), e.where)
        return result

    def check_unit(self, **bindings) -> None:
        raise NotImplementedError

    @staticmethod
    def zp_input(op, p: QParams) -> ir.Value:
        """The zero point value, or an explicit zero of the quantized type where the integer op needs one."""
        if p.zero_point is not None:
            return p.zero_point
        return op.Constant(value=ir.tensor(np.zeros(p.scale_np.shape, dtype=p.qtype.numpy())))


def _dq(op, x, s, name):
    return op.DequantizeLinear(x, s, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=[name])


def _q(op, v, s, name):
    return op.QuantizeLinear(v, s, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=[name])


class DropLosslessDqQ(_QdqRule):
    """``Q(DQ(x, s, z), s, z) == x`` exactly: drop both."""

    def pattern(self, op, x, s1, s2):
        return _q(op, _dq(op, x, s1, "deq"), s2, "q_out")

    def check_unit(self, x, deq, q_out, **_) -> None:
        _single_use(deq, "DequantizeLinear output")
        if q_out.is_graph_output():
            raise QdqFail(f"QuantizeLinear output {q_out.name!r} is a graph output", q_out)
        if not qparams(deq).same_as(qparams(q_out)):
            raise QdqFail("DequantizeLinear and QuantizeLinear params differ (a requantization, not lossless)",
                          q_out.producer())

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class DropQdqRoundTrip(_QdqRule):
    """``DQ(Q(x, s, z), s, z) -> x``: removes the quantization error, so only on request."""

    def pattern(self, op, x, s1, s2):
        return _dq(op, _q(op, x, s1, "quant"), s2, "dq_out")

    def check_unit(self, x, quant, dq_out, **_) -> None:
        if not self.options.drop_qdq_roundtrips:
            raise QdqFail("Q->DQ round trip kept: it is lossy (opt in with --drop-qdq-roundtrips)", quant.producer())
        _single_use(quant, "QuantizeLinear output")
        if dq_out.is_graph_output():
            raise QdqFail(f"DequantizeLinear output {dq_out.name!r} is a graph output", dq_out)
        if not qparams(quant).same_as(qparams(dq_out)):
            raise QdqFail("QuantizeLinear and DequantizeLinear params differ", dq_out.producer())

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class QLinearMatMulFusion(_QdqRule):
    """``Q(MatMul(DQ(a), DQ(b))) -> QLinearMatMul`` (per-tensor a/y, per-tensor or per-column b)."""

    def pattern(self, op, a, sa, b, sb, sy):
        return _q(op, op.MatMul(_dq(op, a, sa, "da"), _dq(op, b, sb, "db"), _outputs=["mm"]), sy, "y")

    def check_unit(self, da, db, mm, y, **_) -> None:
        for v, what in ((da, "DequantizeLinear(A) output"), (db, "DequantizeLinear(B) output"), (mm, "MatMul output")):
            _single_use(v, what)
        pa, pb, py = qparams(da), qparams(db), qparams(y)
        _int8(pa, "A"), _int8(pb, "B"), _int8(py, "output")
        _scalar(pa, "A"), _scalar(py, "output"), _scalar(pb, "B")

    def rewrite(self, op, a, b, da, db, y, **_):
        pa, pb, py = qparams(da), qparams(db), qparams(y)
        return op.QLinearMatMul(a, pa.scale, self.zp_input(op, pa), b, pb.scale, self.zp_input(op, pb),
                                py.scale, self.zp_input(op, py))


class MatMulIntegerToFloatFusion(_QdqRule):
    """``MatMul(DQ(a), DQ(b))`` with float output -> com.microsoft MatMulIntegerToFloat."""

    def pattern(self, op, a, sa, b, sb):
        return op.MatMul(_dq(op, a, sa, "da"), _dq(op, b, sb, "db"), _outputs=["mm"])

    def check_unit(self, da, db, mm, **_) -> None:
        _single_use(da, "DequantizeLinear(A) output")
        _single_use(db, "DequantizeLinear(B) output")
        pa, pb = qparams(da), qparams(db)
        _int8(pa, "A"), _int8(pb, "B")
        _scalar(pa, "A")
        if not pb.per_tensor:
            shape = db.producer().inputs[0].shape
            if _axis(pb.node) not in (-1, len(shape) - 1 if shape is not None else -1) or pb.scale_np.ndim != 1:
                raise QdqFail("B's per-channel scale must run along its last axis (N)", pb.node)
        if mm.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            raise QdqFail(f"MatMul output is {mm.dtype}; MatMulIntegerToFloat produces float/float16", mm)
        if pa.scale_np.dtype != pb.scale_np.dtype:
            raise QdqFail("A and B scales have different dtypes", pb.node)

    def rewrite(self, op, a, b, da, db, **_):
        pa, pb = qparams(da), qparams(db)
        return op.MatMulIntegerToFloat(a, b, pa.scale, pb.scale, self.zp_input(op, pa), self.zp_input(op, pb),
                                       _domain="com.microsoft")


class QLinearConvFusion(_QdqRule):
    """``Q(Conv(DQ(x), DQ(w)[, DQ(bias int32)])) -> QLinearConv`` (per-tensor x/y, per-tensor or per-M w)."""

    def __init__(self, name: str, options: RewriteOptions, with_bias: bool) -> None:
        super().__init__(name, options)
        self.with_bias = with_bias

    def pattern(self, op, x, sx, w, sw, sy, bq, sb):
        inputs = [_dq(op, x, sx, "dx"), _dq(op, w, sw, "dw")]
        if self.with_bias:
            inputs.append(_dq(op, bq, sb, "dbias"))
        return _q(op, op.Conv(*inputs, _allow_other_attributes=True, _outputs=["conv"]), sy, "y")

    def check_unit(self, dx, dw, conv, y, dbias=None, **_) -> None:
        for v, what in ((dx, "DequantizeLinear(X) output"), (dw, "DequantizeLinear(W) output"),
                        (conv, "Conv output")):
            _single_use(v, what)
        px, pw, py = qparams(dx), qparams(dw), qparams(y)
        _int8(px, "X"), _int8(pw, "W"), _int8(py, "output")
        _scalar(px, "X"), _scalar(py, "output")
        if px.qtype != py.qtype:
            raise QdqFail(f"X is {px.qtype} but output is {py.qtype}; QLinearConv needs the same type", py.node)
        if px.qtype == ir.DataType.INT8 and pw.qtype != ir.DataType.INT8:
            raise QdqFail("int8 X needs int8 W in ORT's QLinearConv", pw.node)
        if not pw.per_tensor and (_axis(pw.node) != 0 or pw.scale_np.ndim != 1):
            raise QdqFail("W's per-channel scale must be along axis 0 (output channels)", pw.node)
        if dbias is not None:
            _single_use(dbias, "DequantizeLinear(bias) output")
            pb = qparams(dbias)
            if pb.qtype != ir.DataType.INT32 or np.any(pb.zp_np):
                raise QdqFail("bias must be int32 with zero point 0", pb.node)
            want = (px.scale_np.astype(np.float64) * pw.scale_np.astype(np.float64)).reshape(-1)
            have = np.broadcast_to(pb.scale_np.astype(np.float64).reshape(-1), want.shape) if pb.scale_np.size in (
                1, want.size) else None
            if have is None or not np.allclose(have, np.broadcast_to(want, have.shape), rtol=1e-6, atol=0):
                raise QdqFail("bias scale is not x_scale * w_scale", pb.node)

    def rewrite(self, op, x, w, dx, dw, conv, y, dbias=None, bq=None, **_):
        px, pw, py = qparams(dx), qparams(dw), qparams(y)
        attrs = {k: a for k, a in conv.producer().attributes.items()}
        args = [x, px.scale, self.zp_input(op, px), w, pw.scale, self.zp_input(op, pw), py.scale,
                self.zp_input(op, py)]
        if dbias is not None:
            args.append(bq)
        return op.QLinearConv(*args, **attrs)


class QLinearBinaryFusion(_QdqRule):
    """``Q(Add|Mul(DQ(a), DQ(b))) -> com.microsoft QLinearAdd|QLinearMul`` (per-tensor, same int8 type)."""

    def __init__(self, name: str, options: RewriteOptions, op_type: str) -> None:
        super().__init__(name, options)
        self.op_type = op_type

    def pattern(self, op, a, sa, b, sb, sy):
        v = getattr(op, self.op_type)(_dq(op, a, sa, "da"), _dq(op, b, sb, "db"), _outputs=["mid"])
        return _q(op, v, sy, "y")

    def check_unit(self, da, db, mid, y, **_) -> None:
        for v, what in ((da, "DequantizeLinear(A) output"), (db, "DequantizeLinear(B) output"),
                        (mid, f"{self.op_type} output")):
            _single_use(v, what)
        params = [qparams(da), qparams(db), qparams(y)]
        for p, what in zip(params, ("A", "B", "output"), strict=True):
            _int8(p, what)
            _scalar(p, what)
        if len({p.qtype for p in params}) != 1:
            raise QdqFail(f"A, B and output types differ ({', '.join(str(p.qtype) for p in params)})", y.producer())

    def rewrite(self, op, a, b, da, db, y, **_):
        pa, pb, py = qparams(da), qparams(db), qparams(y)
        return op.op(f"QLinear{self.op_type}", a, pa.scale, self.zp_input(op, pa), b, pb.scale,
                     self.zp_input(op, pb), py.scale, self.zp_input(op, py), _domain="com.microsoft")


class QdqPassThrough(_QdqRule):
    """``Q(op(DQ(x), ...)) -> op(x, ...)`` for data-movement ops with identical per-tensor params."""

    def __init__(self, name: str, options: RewriteOptions, op_type: str) -> None:
        super().__init__(name, options)
        self.op_type = op_type

    def pattern(self, op, x, s1, s2):
        v = getattr(op, self.op_type)(_dq(op, x, s1, "deq"), _allow_other_inputs=True,
                                      _allow_other_attributes=True, _outputs=["moved"])
        return _q(op, v, s2, "y")

    def check_unit(self, deq, moved, y, **_) -> None:
        _single_use(deq, "DequantizeLinear output")
        _single_use(moved, f"{self.op_type} output")
        pd, pq = qparams(deq), qparams(y)
        _int8(pd, "the moved tensor")
        _scalar(pd, "DequantizeLinear")
        if not pd.same_as(pq):
            raise QdqFail(f"params around {self.op_type} differ (it would requantize)", y.producer())

    def rewrite(self, op, x, moved, **_):
        node = moved.producer()
        return op.op(self.op_type, x, *node.inputs[1:], **dict(node.attributes.items()))


def rules(options: RewriteOptions) -> RewriteRuleSet:
    """The Q/DQ rules in application order (lossless drops first, then unit fusions, then pass-through)."""
    return RewriteRuleSet([
        DropLosslessDqQ.rule("DropLosslessDqQ", options),
        *(QdqPassThrough.rule(f"QdqPassThrough{t}", options, t) for t in DATA_MOVEMENT_OPS),
        QLinearMatMulFusion.rule("QLinearMatMul", options),
        MatMulIntegerToFloatFusion.rule("MatMulIntegerToFloat", options),
        QLinearConvFusion.rule("QLinearConvBias", options, with_bias=True),
        QLinearConvFusion.rule("QLinearConv", options, with_bias=False),
        QLinearBinaryFusion.rule("QLinearAdd", options, "Add"),
        QLinearBinaryFusion.rule("QLinearMul", options, "Mul"),
        DropQdqRoundTrip.rule("DropQdqRoundTrip", options),
    ])


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Apply the Q/DQ rules in place; the Identity nodes left by the drop rules are then eliminated."""
    if apply_rule_set(model, rules(options), report):
        IdentityEliminationPass()(model)
