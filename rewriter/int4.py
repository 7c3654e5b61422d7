"""INT4 weight packing: MatMul with a constant weight -> com.microsoft MatMulNBits (bits=4).

Two rules:
- ``MatMulToNBits``: ``MatMul(A[..., K], W[K, N])`` with W a constant float32/float16 initializer is quantized
  RTN in blocks along K, bit-identical to ``MatMulNBitsQuantizer`` (see ``npu_ep.quantization.blockwise``).
- ``DqInt4MatMulToNBits``: ``MatMul(A, DequantizeLinear(Q int4/uint4 [K, N], scale [K/bs, N], zp?, axis=0,
  block_size=bs))`` is repacked losslessly into MatMulNBits layout (no requantization).

Weights are processed one at a time: each weight is read (memory-mapped for external data), packed, and its
mapping released before the next, so a >2 GB model is never held twice in RAM.
"""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from ..quantization import MatMulNBitsWeights, quantize_matmul_nbits, repack_blocked_int4
from ..quantization.blockwise import k_blocks
from .options import RewriteOptions, RewriteReport
from .progress import report_progress
from .rule_set import apply_rule_set

FLOAT_TYPES = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}
INT4_TYPES = {ir.DataType.INT4: True, ir.DataType.UINT4: False}  # dtype -> signed


def _dims(value: ir.Value) -> tuple[int, ...] | None:
    tensor = value.const_value
    if tensor is None:
        return None
    return tuple(int(d) for d in tensor.shape)


class _Int4RuleBase(RewriteRuleClassBase):
    """Shared state: options, a unique-name allocator for the graph, and progress counting."""

    def __init__(self, name: str, options: RewriteOptions, progress_total: int) -> None:
        super().__init__(name)
        self.options = options
        self._exclude = re.compile(options.exclude) if options.exclude else None
        self._graph: ir.Graph | None = None
        self._names: set[str] = set()
        self._cache: dict[ir.Value, tuple[tuple[ir.Value, ...], dict]] = {}
        self._progress_total = progress_total
        self._done = 0

    def setup(self) -> None:
        self._cache = {}

    def _check_matmul(self, context, result: MatchResult, a: ir.Value, out: ir.Value) -> MatchResult:
        node = out.producer()
        self._graph = context.graph_or_function
        if self._exclude is not None and node is not None and node.name and self._exclude.search(node.name):
            return result.fail(f"node name matches --exclude {self.options.exclude!r}", node)
        if a.dtype is not None and a.dtype not in FLOAT_TYPES:
            return result.fail(f"A has dtype {a.dtype}, MatMulNBits needs float32/float16", a)
        if a.shape is not None and len(a.shape) < 2:
            return result.fail(f"A has rank {len(a.shape)}, MatMulNBits needs rank >= 2", a)
        return result

    def _unique(self, base: str) -> str:
        taken = self._graph.initializers if self._graph is not None else {}
        name, i = base, 1
        while name in taken or name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    def _emit(self, op, a: ir.Value, key: ir.Value, base: str, packed: MatMulNBitsWeights | None, node_name: str):
        """Create (or reuse for a shared weight) the initializers and the MatMulNBits node."""
        if key in self._cache:
            inputs, attrs = self._cache[key]
        else:
            b = op.initializer(ir.tensor(packed.B), name=self._unique(f"{base}_Q4"))
            s = op.initializer(ir.tensor(packed.scales), name=self._unique(f"{base}_scales"))
            inputs = (b, s)
            if packed.zero_points is not None:
                inputs += (op.initializer(ir.tensor(packed.zero_points), name=self._unique(f"{base}_zero_points")),)
            attrs = dict(K=packed.K, N=packed.N, bits=4, block_size=packed.block_size)
            if self.options.int4_accuracy_level:  # omitted when 0, like ORT's quantizer
                attrs["accuracy_level"] = self.options.int4_accuracy_level
            self._cache[key] = (inputs, attrs)
        self._done += 1
        report_progress("int4", self._done, self._progress_total)
        return op.MatMulNBits(a, *inputs, _domain="com.microsoft", _name=self._unique_node(node_name), **attrs)

    def _unique_node(self, name: str) -> str | None:
        return f"{name}_Q4" if name else None


class MatMulToNBits(_Int4RuleBase):
    """MatMul(A, W const float [K, N]) -> MatMulNBits(A, B, scales[, zero_points]) (RTN, ORT-identical)."""

    def pattern(self, op, a, w):
        return op.MatMul(a, w, _outputs=["out"])

    def check(self, context, a: ir.Value, w: ir.Value, out: ir.Value, **_) -> MatchResult:
        result = self._check_matmul(context, MatchResult(), a, out)
        if not result:
            return result
        if w.const_value is None:
            return result.fail("weight is not a constant initializer", w)
        if w.is_graph_input():
            return result.fail("weight initializer is also a graph input (overridable at run time)", w)
        if w.dtype not in FLOAT_TYPES:
            return result.fail(f"weight dtype {w.dtype} is not float32/float16", w)
        if a.dtype is not None and a.dtype != w.dtype:
            return result.fail(f"A dtype {a.dtype} differs from weight dtype {w.dtype}", a)
        dims = _dims(w)
        if len(dims) != 2:
            return result.fail(f"weight has shape {list(dims)}; only 2-D [K, N] weights are packed", w)
        if dims[0] * dims[1] < self.options.int4_min_elements:
            return result.fail(f"weight has {dims[0] * dims[1]} elements < --min-elements "
                               f"{self.options.int4_min_elements}", w)
        return result

    def rewrite(self, op, a: ir.Value, w: ir.Value, out: ir.Value, **_):
        packed = None
        if w not in self._cache:
            tensor = w.const_value
            weight = np.asarray(tensor.numpy())
            packed = quantize_matmul_nbits(weight, self.options.int4_block_size, self.options.int4_symmetric)
            del weight
            if isinstance(tensor, ir.ExternalTensor):
                tensor.release()  # drop the mapping: one weight resident at a time
        node = out.producer()
        return self._emit(op, a, w, w.name or "weight", packed, node.name if node is not None else "")


class DqInt4MatMulToNBits(_Int4RuleBase):
    """MatMul(A, DequantizeLinear(Q int4/uint4 [K, N] blocked on axis 0)) -> MatMulNBits (exact repack)."""

    def pattern(self, op, a, q, scale):
        w = op.DequantizeLinear(q, scale, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["w"])
        return op.MatMul(a, w, _outputs=["out"])

    def check(self, context, a: ir.Value, q: ir.Value, scale: ir.Value, w: ir.Value, out: ir.Value,
              **_) -> MatchResult:
        result = self._check_matmul(context, MatchResult(), a, out)
        if not result:
            return result
        dq = w.producer()
        if q.dtype not in INT4_TYPES:
            return result.fail(f"DequantizeLinear input is {q.dtype}, not int4/uint4", q)
        if q.const_value is None or q.is_graph_input():
            return result.fail("quantized weight is not a constant initializer", q)
        if scale.const_value is None or scale.is_graph_input():
            return result.fail("scale is not a constant initializer", scale)
        if a.dtype is not None and scale.dtype != a.dtype:
            return result.fail(f"scale dtype {scale.dtype} differs from A dtype {a.dtype}", scale)
        dims = _dims(q)
        if len(dims) != 2:
            return result.fail(f"quantized weight has shape {list(dims)}; only 2-D [K, N] is repacked", q)
        K, N = dims
        axis = dq.attributes.get_int("axis", 1)
        if axis not in (0, -2):
            return result.fail(f"DequantizeLinear axis is {axis}; MatMulNBits blocks run along K (axis 0)", dq)
        bs = dq.attributes.get_int("block_size", 0)
        if bs < 16 or bs > 256 or bs & (bs - 1):
            return result.fail(f"block_size {bs} is not a power of two in [16, 256]", dq)
        if _dims(scale) != (k_blocks(K, bs), N):
            return result.fail(f"scale shape {_dims(scale)} is not [ceil(K/{bs}), N] = [{k_blocks(K, bs)}, {N}]",
                               scale)
        zp = dq.inputs[2] if len(dq.inputs) > 2 else None
        if zp is not None:
            if zp.const_value is None or zp.is_graph_input():
                return result.fail("zero point is not a constant initializer", zp)
            if zp.dtype != q.dtype or _dims(zp) != _dims(scale):
                return result.fail(f"zero point {zp.dtype}{list(_dims(zp) or ())} does not match "
                                   f"{q.dtype}{list(_dims(scale))}", zp)
        if len(w.uses()) != 1 or w.is_graph_output():
            return result.fail("dequantized weight has other consumers", w)
        if K * N < self.options.int4_min_elements:
            return result.fail(f"weight has {K * N} elements < --min-elements {self.options.int4_min_elements}",
                               q)
        return result

    def rewrite(self, op, a: ir.Value, q: ir.Value, scale: ir.Value, w: ir.Value, out: ir.Value, **_):
        dq = w.producer()
        zp = dq.inputs[2] if len(dq.inputs) > 2 else None
        signed = INT4_TYPES[q.dtype]
        codes = np.asarray(q.const_value.numpy()).astype(np.int8 if signed else np.uint8)
        zp_arr = None if zp is None else np.asarray(zp.const_value.numpy()).astype(codes.dtype)
        packed = repack_blocked_int4(codes, scale.const_value.numpy(), zp_arr, signed,
                                     dq.attributes.get_int("block_size", 0))
        node = out.producer()
        return self._emit(op, a, q, q.name or "weight", packed, node.name if node is not None else "")


def _candidate_count(model: ir.Model) -> int:
    return sum(1 for n in model.graph.all_nodes()
               if n.op_type == "MatMul" and n.domain == "" and len(n.inputs) == 2 and n.inputs[1] is not None
               and (n.inputs[1].const_value is not None or
                    (n.inputs[1].producer() is not None and n.inputs[1].producer().op_type == "DequantizeLinear")))


def rules(options: RewriteOptions, progress_total: int = 0) -> RewriteRuleSet:
    """The int4 rule set for ``options`` (the DQ repack first, so ONNX int4 weights are never requantized)."""
    dq_rule = DqInt4MatMulToNBits.rule("DqInt4MatMulToNBits", options, progress_total)
    mm_rule = MatMulToNBits.rule("MatMulToNBits", options, progress_total)
    return RewriteRuleSet([dq_rule, mm_rule])


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Pack every eligible MatMul weight into MatMulNBits (in place); counts per rule into ``report``."""
    rule_set = rules(options, _candidate_count(model))
    n = apply_rule_set(model, rule_set, report)
    if n:
        ir.passes.common.RemoveUnusedNodesPass()(model)
