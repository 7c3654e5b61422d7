"""QDQ node units, the way ORT reads QDQ graphs: ``DQ -> op -> Q`` with single-consumer DQs and one Q per output.

Two things happen here, in this order:

1. **Integer units.** A Conv or MatMul whose activation arrives through a per-tensor DequantizeLinear, whose weight
   is a DequantizeLinear of a constant (per tensor, or per output channel: Conv axis 0, MatMul axis 1), and whose output
   is read only by one per-tensor QuantizeLinear becomes one synthetic node that runs on integers: 8-bit activations as
   ``QLinearConv``/``QLinearMatMul`` (the int8 matrix kernels, int32 accumulation, MLAS requantization), 16-bit
   activations as ``npu::QdqMatMul`` (kernels/ops/qdq_matmul.py, accumulator width from
   ``matrix.a16_accumulator_bits``). A Conv bias must be the int32 DequantizeLinear that ``quantize_static`` writes
   (zero point 0, scale ``x_scale * w_scale``), else the unit stays as float steps.
2. **Weight DequantizeLinear folding.** Every other DequantizeLinear of a constant read by exactly one node becomes
   a constant float input of that node, dequantized at compile time exactly as ORT's kernel does, so the unit runs
   as float ``DQ -> op -> Q`` steps (ORT's unoptimized semantics) whatever op it is. Capability makes the same
   decision (``constant_view``), which is why a Conv behind a weight DQ is claimed at all.

Numerics of the integer units vs ORT with optimizations disabled (which runs the float steps literally): the
exact integer sum replaces a float32 sum of dequantized products, so outputs agree within one quantum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult

from ..node import NodeInfo, ValueInfo
from ..support import dtype_name, why_not
from ..target import Target
from . import patterns
from ._graph import consumers_of
from ._rules import FusionMiss, FusionRule, RuleRun, failed, passed, producer_info

Q_OPS = frozenset({("", "QuantizeLinear"), ("com.microsoft", "QuantizeLinear")})
DQ_OPS = frozenset({("", "DequantizeLinear"), ("com.microsoft", "DequantizeLinear")})
SIXTEEN_BIT = ("int16", "uint16")
EIGHT_BIT = ("int8", "uint8")
FUSED_DOMAIN, FUSED_MATMUL = "npu", "QdqMatMul"


def _const_param(nd: NodeInfo, i: int) -> bool:
    v = nd.input(i)
    return v is None or v.value is not None


def is_weight_dq(nd: NodeInfo) -> bool:
    """A DequantizeLinear of a constant with constant scale and zero point: a weight, foldable at compile time."""
    x, s = nd.input(0), nd.input(1)
    return (nd.key in DQ_OPS and x is not None and x.value is not None and s is not None and s.value is not None
            and _const_param(nd, 2))


def dequantized(dq: NodeInfo) -> np.ndarray:
    """The float value of a weight DequantizeLinear, computed by the DequantizeLinear kernel itself."""
    from ..ops import quantize

    p = quantize.prepare(dq)
    return quantize.run_dq(p, [None] * len(dq.inputs))[0]


def _const_value(like: ValueInfo, name: str, value: np.ndarray) -> ValueInfo:
    return dataclasses.replace(like, name=name, dtype=value.dtype, shape=tuple(value.shape), value=value,
                               is_constant=True, is_graph_input=False, is_graph_output=False, onnx_type=0)


def foldable_weights(nodes: Iterable[NodeInfo]) -> dict[str, NodeInfo]:
    """Output name -> weight DQ, for weight DQs read by exactly one node of ``nodes`` and not graph outputs."""
    nodes = list(nodes)
    users = consumers_of(nodes)
    out = {}
    for nd in nodes:
        if is_weight_dq(nd):
            y = nd.outputs[0]
            if not y.is_graph_output and len(users.get(y.name, [])) == 1:
                out[y.name] = nd
    return out


def constant_view(node: NodeInfo, weights: Mapping[str, NodeInfo], *,
                  placeholder_above: int | None = 4096) -> NodeInfo:
    """``node`` as its kernel check should see it: inputs from foldable weight DQs become float constants.

    Capability only needs shapes and small values (checks never read a large weight), so weights above
    ``placeholder_above`` elements are a zero-strided placeholder of the right shape and dtype, not dequantized
    (``None``: always dequantize, as the compiler does).
    """
    if not any(v.name in weights for v in node.inputs):
        return node
    inputs = []
    for v in node.inputs:
        dq = weights.get(v.name)
        if dq is None:
            inputs.append(v)
            continue
        x = np.asarray(dq.input(0).value)
        if placeholder_above is None or x.size <= placeholder_above:
            value = dequantized(dq)
        else:
            value = np.broadcast_to(np.zeros((), np.asarray(dq.input(1).value).dtype), x.shape)
        inputs.append(_const_value(v, v.name, value))
    return dataclasses.replace(node, inputs=tuple(inputs))


# --- integer units -------------------------------------------------------------------------------------------------
def _per_tensor(nd: NodeInfo) -> bool:
    s, z = nd.input(1), nd.input(2)
    return (s is not None and s.value is not None and np.size(s.value) == 1 and _const_param(nd, 2)
            and (z is None or np.size(z.value) == 1) and not int(nd.attr("block_size", 0)))


def _weight_ok(dq: NodeInfo, out_axis: int) -> bool:
    """Weights per tensor, or per channel along the output-channel axis ``out_axis`` (no blocks)."""
    if int(dq.attr("block_size", 0)):
        return False
    s = np.asarray(dq.input(1).value)
    if s.size == 1:
        return True
    x = np.asarray(dq.input(0).value)
    axis = int(dq.attr("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return s.ndim == 1 and axis == out_axis and s.size == x.shape[out_axis]


def _zp(nd: NodeInfo, dtype: str) -> np.ndarray:
    z = nd.input(2)
    if z is not None:
        return np.asarray(z.value)
    return np.zeros((), dtype)


def _qvalue(like: ValueInfo, name: str, value) -> ValueInfo:
    value = np.asarray(value)
    return _const_value(like, name, value)


@dataclasses.dataclass(frozen=True)
class _Unit:
    """The nodes of a matched ``DQ -> Conv | MatMul -> Q`` unit."""

    op: NodeInfo
    adq: NodeInfo
    wdq: NodeInfo
    q: NodeInfo
    bdq: NodeInfo | None
    q_alone: bool  # the op's output is read by the Q alone (and not outside the partition)

    @classmethod
    def of(cls, y: ir.Value, dbias: ir.Value | None = None, **bound: Any) -> _Unit:
        a, w = (bound["dx"], bound["dw"]) if bound.get("dx") is not None else (bound["da"], bound["db"])
        out = y.producer().inputs[0]
        return cls(producer_info(out), producer_info(a), producer_info(w), producer_info(y),
                   producer_info(dbias) if dbias is not None else None,
                   len(out.uses()) == 1 and not out.is_graph_output())

    @property
    def conv(self) -> bool:
        return self.op.op_type == "Conv"

    def bias_reason(self) -> str | None:
        """Why the Conv bias is not the int32 DequantizeLinear ``quantize_static`` writes, or None."""
        bdq = self.bdq
        xs, ws = np.asarray(self.adq.input(1).value, np.float32), np.asarray(self.wdq.input(1).value, np.float32)
        expected = (xs.reshape(()) * ws).reshape(-1)
        if (not is_weight_dq(bdq) or dtype_name(bdq.input(0)) != "int32" or int(bdq.attr("block_size", 0))
                or np.any(np.asarray(_zp(bdq, "int32"))) or not np.array_equal(
                    np.broadcast_to(np.asarray(bdq.input(1).value, np.float32).reshape(-1), expected.shape),
                    expected)):
            return (f"the bias {bdq.describe()} is not the int32 DequantizeLinear quantize_static writes (zero "
                    "point 0, scale x_scale * w_scale)")
        return None

    def reason(self) -> str | None:
        """Why the unit does not become one integer node, or None."""
        op, adq, wdq, q = self.op, self.adq, self.wdq, self.q
        y = op.outputs[0]
        if len(op.outputs) != 1 or y.is_graph_output or q.inputs[0].name != y.name or not self.q_alone:
            return f"{op.describe()}: its output is read outside the unit"
        if not _per_tensor(q):
            return f"{q.describe()} is not per tensor with constant parameters"
        if not _per_tensor(adq) or adq.input(0).value is not None:
            return f"{adq.describe()} (the activation's) is not per tensor of a runtime value"
        if not is_weight_dq(wdq):
            return f"{wdq.describe()} (the weight's) is not of a constant with constant parameters"
        w = np.asarray(wdq.input(0).value)
        if not _weight_ok(wdq, 0 if self.conv else w.ndim - 1) or (not self.conv and w.ndim != 2):
            return f"{wdq.describe()}: weights are not per tensor or per output channel, or not 2-D for MatMul"
        at, wt, yt = dtype_name(adq.input(0)), dtype_name(wdq.input(0)), dtype_name(q.outputs[0])
        if wt not in ("int8", "uint8", "int4", "uint4"):
            return f"{wdq.describe()}: {wt} weights, not 8 or 4 bits"
        if self.bdq is not None and (bias := self.bias_reason()) is not None:
            return bias
        if not ((at in EIGHT_BIT and yt in EIGHT_BIT and wt in EIGHT_BIT) or (
                not self.conv and at in (*EIGHT_BIT, *SIXTEEN_BIT) and yt in (*EIGHT_BIT, *SIXTEEN_BIT))):
            return (f"{op.describe()}: {at} activations, {wt} weights and {yt} outputs form no integer unit (8-bit: "
                    "QLinearConv / QLinearMatMul; 16-bit activations: MatMul only)")
        return None

    def synthetic(self, members: list[NodeInfo]) -> NodeInfo:
        """The integer node replacing the unit (QLinearConv, QLinearMatMul or npu::QdqMatMul)."""
        op, adq, wdq, q = self.op, self.adq, self.wdq, self.q
        w = np.asarray(wdq.input(0).value)
        at, wt, yt = dtype_name(adq.input(0)), dtype_name(wdq.input(0)), dtype_name(q.outputs[0])
        xs, ws = np.asarray(adq.input(1).value, np.float32), np.asarray(wdq.input(1).value, np.float32)
        bias = np.asarray(self.bdq.input(0).value, np.int32) if self.bdq is not None else None
        wi = w.astype(np.int8) if wt == "int4" else w.astype(np.uint8) if wt == "uint4" else w
        wzp = _zp(wdq, wi.dtype.name).astype(wi.dtype)
        x, y = adq.input(0), q.outputs[0]
        xzp, yzp = _zp(adq, at).reshape(()), _zp(q, yt or "uint8").reshape(())
        ys = np.asarray(q.input(1).value, np.float32).reshape(())
        name = f"{op.name}/qdq"

        def c(suffix: str, v) -> ValueInfo:
            return _qvalue(op.inputs[1], f"{name}/{suffix}", v)

        inputs = [x, c("xs", xs.reshape(())), c("xzp", xzp), c("w", wi), c("ws", ws), c("wzp", wzp),
                  c("ys", ys), c("yzp", yzp)]
        fused = [n.name for n in members]
        if at in EIGHT_BIT and yt in EIGHT_BIT and wt in EIGHT_BIT and self.conv:
            inputs += [c("bias", bias)] if bias is not None else []
            return dataclasses.replace(op, name=name, op_type="QLinearConv", inputs=tuple(inputs), outputs=(y,),
                                       attrs={**op.attrs, "fused_nodes": fused})
        if at in EIGHT_BIT and yt in EIGHT_BIT and wt in EIGHT_BIT:
            return dataclasses.replace(op, name=name, op_type="QLinearMatMul", inputs=tuple(inputs), outputs=(y,),
                                       attrs={"fused_nodes": fused})
        return dataclasses.replace(op, name=name, domain=FUSED_DOMAIN, op_type=FUSED_MATMUL, inputs=tuple(inputs),
                                   outputs=(y,), attrs={"fused_nodes": fused})


class QdqUnitRule(FusionRule):
    """``Q(Conv | MatMul(DQ(x), DQ(w)[, DQ(bias)]))`` -> one integer node. A DQ may feed other units too (ORT's
    EnsureUniqueDQForNodeUnit duplicates it), so only the op's output must be read by the unit's Q alone."""

    name = "qdq"
    produces = None  # QLinearConv, QLinearMatMul or npu::QdqMatMul, as the types go
    only_readers = False

    def variants(self) -> list[Callable[..., Any]]:
        def conv(with_bias: bool) -> Callable[..., Any]:
            return lambda op, x, sx, w, sw, sy, bq, sb: patterns.qdq_conv(op, x, sx, w, sw, sy, bq, sb,
                                                                          with_bias=with_bias)

        return [patterns.qdq_matmul, conv(False), conv(True)]

    def check(self, context, y: ir.Value, **bound: Any) -> MatchResult:
        reason = _Unit.of(y, **bound).reason()
        return passed() if reason is None else failed(reason, y)

    def fuse(self, members: list[NodeInfo], y: ir.Value, **bound: Any) -> NodeInfo:
        return _Unit.of(y, **bound).synthetic(members)


RULES = (QdqUnitRule(),)


def integer_units(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None
                  ) -> dict[int, tuple[NodeInfo, set[int]]]:
    """Position of each unit's op in ``nodes`` -> (its synthetic integer node, positions of all its members).

    A DQ may feed several units (each unit reads its own copy, as after ORT's EnsureUniqueDQForNodeUnit); it is a
    member, and so removed, only when every reader of its output is a unit's op. Declined candidates go to
    ``misses``."""
    nodes = list(nodes)
    run = RuleRun(nodes, target, RULES)
    found: dict[int, tuple[NodeInfo, set[int]]] = {}
    taken: set[int] = set()
    for i in range(len(nodes) if run.active else 0):
        got = run.match(i)
        if got is None:
            continue
        members, synth = got
        op = next(j for j in members if nodes[j].key in (("", "Conv"), ("", "MatMul")))
        own = {j for j in members if nodes[j].key not in DQ_OPS}
        if own & taken:
            run.overlaps(i, synth)
            continue
        found[op] = (synth, set(members))
        taken |= own
    users = consumers_of(nodes)

    def absorbed_by_units(j: int) -> bool:
        out = nodes[j].outputs[0]
        return not out.is_graph_output and all(r in found for r in users.get(out.name, []))

    units = {i: (synth, {j for j in members if nodes[j].key not in DQ_OPS or absorbed_by_units(j)})
             for i, (synth, members) in found.items()}
    absorbed = {j for _, members in units.values() for j in members}
    run.report(misses, lambda i: i not in absorbed)
    return units


@dataclasses.dataclass(frozen=True)
class QdqView:
    """A graph's QDQ structure as capability asks it, in one call (``of``): the weight DQs that fold into their one
    reader (output name -> DQ), the integer units (``integer_units``), and each node's check with its folded
    weights as float constants (``why_not``)."""

    target: Target
    weights: Mapping[str, NodeInfo]
    units: Mapping[int, tuple[NodeInfo, set[int]]]

    @classmethod
    def of(cls, nodes: Sequence[NodeInfo], target: Target) -> QdqView:
        return cls(target, foldable_weights(nodes), integer_units(list(nodes), target))

    def why_not(self, node: NodeInfo) -> str | None:
        """``support.why_not`` of ``node`` as its kernel sees it after the weight DQs fold (``constant_view``)."""
        return why_not(constant_view(node, self.weights), self.target)

    def folded_weight(self, node: NodeInfo) -> bool:
        """``node`` is a weight DQ that folds into its one reader."""
        return node.key in DQ_OPS and node.outputs[0].name in self.weights


def fuse_qdq(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Integer units first, then fold every remaining single-reader weight DQ into its reader (module docstring)."""
    units = integer_units(list(nodes), target, misses)
    absorbed = {j for i, (_, members) in units.items() for j in members if j != i}
    out = [units[i][0] if i in units else nd for i, nd in enumerate(nodes) if i not in absorbed]
    weights = foldable_weights(out)
    if weights:
        out = [constant_view(nd, weights, placeholder_above=None) for nd in out]
        out = [nd for nd in out if not (nd.key in DQ_OPS and nd.outputs[0].name in weights)]
    read = consumers_of(out)  # a shared activation DQ whose readers all became units is dead now
    return [nd for nd in out if not (nd.key in DQ_OPS and not nd.outputs[0].is_graph_output
                                     and nd.outputs[0].name not in read)]
