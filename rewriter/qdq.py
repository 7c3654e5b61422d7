"""Q/DQ rules: drop lossless pairs and fuse QDQ node units into ORT's integer ops.

A QDQ node unit (how ORT reads QDQ graphs) is ``DQ -> op -> Q``: every DQ feeds only that op, the op's output
feeds only one Q, scales and zero points are constants, and no intermediate value is a graph output. Rules:

- ``DropLosslessDqQ``: ``Q(DQ(x, s, z), s, z) -> x`` (identical constant params: exact).
- ``DropQdqRoundTrip``: ``DQ(Q(x, s, z), s, z) -> x`` only with ``drop_qdq_roundtrips`` (it is lossy).
- ``QLinearMatMul`` / ``QLinearConv`` / ``QLinearAdd`` / ``QLinearMul``: ``DQ... -> op -> Q`` units.
- ``MatMulIntegerToFloat``: ``DQ(a), DQ(b) -> MatMul`` with a float output (com.microsoft).
- ``QdqPassThrough<op>``: ``DQ -> Reshape/Transpose/Squeeze/Unsqueeze/Gather/Slice -> Q`` with identical
  per-tensor params becomes the op on the integer tensor (exact: it only moves data).

Every op a rule emits must be one the target NPU runs (``options.target``, ``target_ops.why_not_emitted``): NpuEP
runs DQ -> op -> Q units as they are, so fusing into an op the target declines would only lose coverage.
The units' patterns are ``kernels.fusion.patterns``' (``dq``, ``q``, ``qdq_matmul``, ``qdq_conv``, ``qdq_moved``),
which the compiler's in-partition QDQ units (``kernels/fusion/qdq.py``, ``qdq_bytes.py``) match too.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import IdentityEliminationPass
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from ..kernels.fusion import patterns
from ..kernels.target import Target
from .options import RewriteOptions, RewriteReport
from .qdq_params import QParams, axis, first_failure, int8, per_tensor, qparams, single_use, unit_params
from .rule_set import apply_rule_set
from .target_ops import load_target, why_not_emitted

DATA_MOVEMENT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice")


class _QdqRule(RewriteRuleClassBase):
    """A Q/DQ rule: ``check`` returns the first failed unit condition (``MatchResult.fail`` with the reason).
    Fusions emit an op only where ``target`` runs it (``emittable``)."""

    def __init__(self, name: str, options: RewriteOptions, target: Target) -> None:
        super().__init__(name)
        self.options = options
        self.target = target

    def emittable(self, domain: str, op_type: str, p: QParams, where: ir.Node) -> MatchResult:
        """Success if the target runs ``domain::op_type`` on the unit's quantized type, else why the unit stays."""
        reason = why_not_emitted(self.target, domain, op_type, p.qtype)
        return MatchResult().fail(reason, where) if reason else MatchResult()

    @staticmethod
    def zp_input(op, p: QParams) -> ir.Value:
        """The zero point value, or an explicit zero of the quantized type where the integer op needs one."""
        if p.zero_point is not None:
            return p.zero_point
        return op.Constant(value=ir.tensor(np.zeros(p.scale_np.shape, dtype=p.qtype.numpy())))


_dq, _q = patterns.dq, patterns.q  # the spellings the compiler's in-partition QDQ units use too


class DropLosslessDqQ(_QdqRule):
    """``Q(DQ(x, s, z), s, z) == x`` exactly: drop both."""

    def pattern(self, op, x, s1, s2):
        return _q(op, _dq(op, x, s1, "deq"), s2, "q_out")

    def check(self, context, x, deq, q_out, **_) -> MatchResult:
        failed = single_use(deq, "DequantizeLinear output")
        if not failed:
            return failed
        if q_out.is_graph_output():
            return MatchResult().fail(f"QuantizeLinear output {q_out.name!r} is a graph output", q_out)
        params = unit_params(deq, q_out)
        if isinstance(params, MatchResult):
            return params
        if not params[0].same_as(params[1]):
            return MatchResult().fail("DequantizeLinear and QuantizeLinear params differ (a requantization, not "
                                      "lossless)", q_out.producer())
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class DropQdqRoundTrip(_QdqRule):
    """``DQ(Q(x, s, z), s, z) -> x``: removes the quantization error, so only on request."""

    def pattern(self, op, x, s1, s2):
        return _dq(op, _q(op, x, s1, "quant"), s2, "dq_out")

    def check(self, context, x, quant, dq_out, **_) -> MatchResult:
        if not self.options.drop_qdq_roundtrips:
            return MatchResult().fail("Q->DQ round trip kept: it is lossy (opt in with --drop-qdq-roundtrips)",
                                      quant.producer())
        failed = single_use(quant, "QuantizeLinear output")
        if not failed:
            return failed
        if dq_out.is_graph_output():
            return MatchResult().fail(f"DequantizeLinear output {dq_out.name!r} is a graph output", dq_out)
        params = unit_params(quant, dq_out)
        if isinstance(params, MatchResult):
            return params
        if not params[0].same_as(params[1]):
            return MatchResult().fail("QuantizeLinear and DequantizeLinear params differ", dq_out.producer())
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class QLinearMatMulFusion(_QdqRule):
    """``Q(MatMul(DQ(a), DQ(b))) -> QLinearMatMul`` (per-tensor a/y, per-tensor or per-column b)."""

    def pattern(self, op, a, sa, b, sb, sy):
        return patterns.qdq_matmul(op, a, sa, b, sb, sy)

    def check(self, context, da, db, mm, y, **_) -> MatchResult:
        failed = first_failure(single_use(da, "DequantizeLinear(A) output"),
                                single_use(db, "DequantizeLinear(B) output"), single_use(mm, "MatMul output"))
        if not failed:
            return failed
        params = unit_params(da, db, y)
        if isinstance(params, MatchResult):
            return params
        pa, pb, py = params
        return first_failure(int8(pa, "A"), int8(pb, "B"), int8(py, "output"),
                              per_tensor(pa, "A"), per_tensor(py, "output"), per_tensor(pb, "B"),
                              self.emittable("", "QLinearMatMul", pa, mm.producer()))

    def rewrite(self, op, a, b, da, db, y, **_):
        pa, pb, py = unit_params(da, db, y)
        return op.QLinearMatMul(a, pa.scale, self.zp_input(op, pa), b, pb.scale, self.zp_input(op, pb),
                                py.scale, self.zp_input(op, py))


class MatMulIntegerToFloatFusion(_QdqRule):
    """``MatMul(DQ(a), DQ(b))`` with float output -> com.microsoft MatMulIntegerToFloat."""

    def pattern(self, op, a, sa, b, sb):
        return op.MatMul(_dq(op, a, sa, "da"), _dq(op, b, sb, "db"), _outputs=["mm"])

    def check(self, context, da, db, mm, **_) -> MatchResult:
        failed = first_failure(single_use(da, "DequantizeLinear(A) output"),
                                single_use(db, "DequantizeLinear(B) output"))
        if not failed:
            return failed
        params = unit_params(da, db)
        if isinstance(params, MatchResult):
            return params
        pa, pb = params
        failed = first_failure(int8(pa, "A"), int8(pb, "B"), per_tensor(pa, "A"))
        if not failed:
            return failed
        if not pb.per_tensor:
            shape = db.producer().inputs[0].shape
            if axis(pb.node) not in (-1, len(shape) - 1 if shape is not None else -1) or pb.scale_np.ndim != 1:
                return MatchResult().fail("B's per-channel scale must run along its last axis (N)", pb.node)
        if mm.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return MatchResult().fail(f"MatMul output is {mm.dtype}; MatMulIntegerToFloat produces float/float16",
                                      mm)
        if pa.scale_np.dtype != pb.scale_np.dtype:
            return MatchResult().fail("A and B scales have different dtypes", pb.node)
        return self.emittable("com.microsoft", "MatMulIntegerToFloat", pa, mm.producer())

    def rewrite(self, op, a, b, da, db, **_):
        pa, pb = unit_params(da, db)
        return op.MatMulIntegerToFloat(a, b, pa.scale, pb.scale, self.zp_input(op, pa), self.zp_input(op, pb),
                                       _domain="com.microsoft")


class QLinearConvFusion(_QdqRule):
    """``Q(Conv(DQ(x), DQ(w)[, DQ(bias int32)])) -> QLinearConv`` (per-tensor x/y, per-tensor or per-M w)."""

    def __init__(self, name: str, options: RewriteOptions, target: Target, with_bias: bool) -> None:
        super().__init__(name, options, target)
        self.with_bias = with_bias

    def pattern(self, op, x, sx, w, sw, sy, bq, sb):
        return patterns.qdq_conv(op, x, sx, w, sw, sy, bq, sb, with_bias=self.with_bias)

    def check(self, context, dx, dw, conv, y, dbias=None, **_) -> MatchResult:
        failed = first_failure(single_use(dx, "DequantizeLinear(X) output"),
                                single_use(dw, "DequantizeLinear(W) output"), single_use(conv, "Conv output"))
        if not failed:
            return failed
        params = unit_params(dx, dw, y)
        if isinstance(params, MatchResult):
            return params
        px, pw, py = params
        failed = first_failure(int8(px, "X"), int8(pw, "W"), int8(py, "output"),
                                per_tensor(px, "X"), per_tensor(py, "output"))
        if not failed:
            return failed
        if px.qtype != py.qtype:
            return MatchResult().fail(f"X is {px.qtype} but output is {py.qtype}; QLinearConv needs the same type",
                                      py.node)
        if px.qtype == ir.DataType.INT8 and pw.qtype != ir.DataType.INT8:
            return MatchResult().fail("int8 X needs int8 W in ORT's QLinearConv", pw.node)
        if not pw.per_tensor and (axis(pw.node) != 0 or pw.scale_np.ndim != 1):
            return MatchResult().fail("W's per-channel scale must be along axis 0 (output channels)", pw.node)
        failed = self.emittable("", "QLinearConv", px, conv.producer())
        if not failed or dbias is None:
            return failed
        failed = single_use(dbias, "DequantizeLinear(bias) output")
        if not failed:
            return failed
        pb = qparams(dbias)
        if isinstance(pb, MatchResult):
            return pb
        if pb.qtype != ir.DataType.INT32 or np.any(pb.zp_np):
            return MatchResult().fail("bias must be int32 with zero point 0", pb.node)
        want = (px.scale_np.astype(np.float64) * pw.scale_np.astype(np.float64)).reshape(-1)
        have = np.broadcast_to(pb.scale_np.astype(np.float64).reshape(-1), want.shape) if pb.scale_np.size in (
            1, want.size) else None
        if have is None or not np.allclose(have, np.broadcast_to(want, have.shape), rtol=1e-6, atol=0):
            return MatchResult().fail("bias scale is not x_scale * w_scale", pb.node)
        return MatchResult()

    def rewrite(self, op, x, w, dx, dw, conv, y, dbias=None, bq=None, **_):
        px, pw, py = unit_params(dx, dw, y)
        attrs = {k: a for k, a in conv.producer().attributes.items()}
        args = [x, px.scale, self.zp_input(op, px), w, pw.scale, self.zp_input(op, pw), py.scale,
                self.zp_input(op, py)]
        if dbias is not None:
            args.append(bq)
        return op.QLinearConv(*args, **attrs)


class QLinearBinaryFusion(_QdqRule):
    """``Q(Add|Mul(DQ(a), DQ(b))) -> com.microsoft QLinearAdd|QLinearMul`` (per-tensor, same int8 type)."""

    def __init__(self, name: str, options: RewriteOptions, target: Target, op_type: str) -> None:
        super().__init__(name, options, target)
        self.op_type = op_type

    def pattern(self, op, a, sa, b, sb, sy):
        v = getattr(op, self.op_type)(_dq(op, a, sa, "da"), _dq(op, b, sb, "db"), _outputs=["mid"])
        return _q(op, v, sy, "y")

    def check(self, context, da, db, mid, y, **_) -> MatchResult:
        failed = first_failure(single_use(da, "DequantizeLinear(A) output"),
                                single_use(db, "DequantizeLinear(B) output"),
                                single_use(mid, f"{self.op_type} output"))
        if not failed:
            return failed
        params = unit_params(da, db, y)
        if isinstance(params, MatchResult):
            return params
        for p, what in zip(params, ("A", "B", "output"), strict=True):
            failed = first_failure(int8(p, what), per_tensor(p, what))
            if not failed:
                return failed
        if len({p.qtype for p in params}) != 1:
            return MatchResult().fail(f"A, B and output types differ ({', '.join(str(p.qtype) for p in params)})",
                                      y.producer())
        return self.emittable("com.microsoft", f"QLinear{self.op_type}", params[0], mid.producer())

    def rewrite(self, op, a, b, da, db, y, **_):
        pa, pb, py = unit_params(da, db, y)
        return op.op(f"QLinear{self.op_type}", a, pa.scale, self.zp_input(op, pa), b, pb.scale,
                     self.zp_input(op, pb), py.scale, self.zp_input(op, py), _domain="com.microsoft")


class QdqPassThrough(_QdqRule):
    """``Q(op(DQ(x), ...)) -> op(x, ...)`` for data-movement ops with identical per-tensor params."""

    def __init__(self, name: str, options: RewriteOptions, target: Target, op_type: str) -> None:
        super().__init__(name, options, target)
        self.op_type = op_type

    def pattern(self, op, x, s1, s2):
        return patterns.qdq_moved(op, self.op_type, x, s1, s2)

    def check(self, context, deq, moved, y, **_) -> MatchResult:
        failed = first_failure(single_use(deq, "DequantizeLinear output"),
                                single_use(moved, f"{self.op_type} output"))
        if not failed:
            return failed
        params = unit_params(deq, y)
        if isinstance(params, MatchResult):
            return params
        pd, pq = params
        failed = first_failure(int8(pd, "the moved tensor"), per_tensor(pd, "DequantizeLinear"))
        if not failed:
            return failed
        if not pd.same_as(pq):
            return MatchResult().fail(f"params around {self.op_type} differ (it would requantize)", y.producer())
        return self.emittable("", self.op_type, pd, moved.producer())

    def rewrite(self, op, x, moved, **_):
        node = moved.producer()
        return op.op(self.op_type, x, *node.inputs[1:], **dict(node.attributes.items()))


def rules(options: RewriteOptions) -> RewriteRuleSet:
    """The Q/DQ rules in application order (lossless drops first, then unit fusions, then pass-through); fusions
    emit only ops that ``options.target`` runs."""
    target = load_target(options.target)
    return RewriteRuleSet([
        DropLosslessDqQ.rule("DropLosslessDqQ", options, target),
        *(QdqPassThrough.rule(f"QdqPassThrough{t}", options, target, t) for t in DATA_MOVEMENT_OPS),
        QLinearMatMulFusion.rule("QLinearMatMul", options, target),
        MatMulIntegerToFloatFusion.rule("MatMulIntegerToFloat", options, target),
        QLinearConvFusion.rule("QLinearConvBias", options, target, with_bias=True),
        QLinearConvFusion.rule("QLinearConv", options, target, with_bias=False),
        QLinearBinaryFusion.rule("QLinearAdd", options, target, "Add"),
        QLinearBinaryFusion.rule("QLinearMul", options, target, "Mul"),
        DropQdqRoundTrip.rule("DropQdqRoundTrip", options, target),
    ])


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Apply the Q/DQ rules in place; the Identity nodes left by the drop rules are then eliminated."""
    if apply_rule_set(model, rules(options), report):
        IdentityEliminationPass()(model)
