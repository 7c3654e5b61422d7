"""Clean-ups the other families rely on: constant folding of shape plumbing, dead code, shapes, RMSNorm.

Reuses onnxscript: its optimizer folds constants (it never folds QuantizeLinear/DequantizeLinear, so Q/DQ
structure survives for the ``qdq`` family), removes dead nodes/initializers and folds Transposes of constant
weights; onnx shape inference then gives the rope/gqa checks static ranks and head dims. RMSNorm becomes
SimplifiedLayerNormalization (onnxscript's rule for ``x * Reciprocal(rms)``, ours below for the exporters'
``x * Div(1, rms)`` / ``Div(x, rms)`` spelling), and Add + RMSNorm becomes com.microsoft
SkipSimplifiedLayerNormalization (onnxscript). ORT's CPU EP runs both.

TorchScript exports' shape plumbing is turned into constants first (``shape_plumbing``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript import optimizer
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter.ort_fusions import rms_normalization, skip_normalization

from ..kernels.fusion import patterns
from .options import RewriteOptions, RewriteReport
from .rule_set import apply_rule_set
from .shape_plumbing import normalize_shape_plumbing

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class RmsNormDivFusion(RewriteRuleClassBase):
    """``scale * (x * Div(1, Sqrt(ReduceMean(x^2, [-1]) + eps)))`` (or ``Div(x, rms)``) -> SimplifiedLayerNorm.

    ``axes_attr``: ReduceMean takes its axes as an attribute (opset <= 17, e.g. TorchScript's default opset 17).
    The chain is ``kernels.fusion.patterns.rms_norm``, which the compiler's in-partition rms fusion matches too.
    """

    def __init__(self, name: str, reciprocal: bool, axes_attr: bool = False) -> None:
        super().__init__(name)
        self.reciprocal = reciprocal
        self.axes_attr = axes_attr

    def pattern(self, op, x, two, axes, eps, scale, one):
        return patterns.rms_norm(op, x, two, eps, scale, "div_one" if self.reciprocal else "div", one,
                                 None if self.axes_attr else axes)

    def check(self, context, x, two, eps, scale, mean, axes=None, one=None, **_) -> MatchResult:
        result = MatchResult()
        for value, want in ((two, 2.0), (one, 1.0)) if self.reciprocal else ((two, 2.0),):
            arr = value.const_value.numpy() if value.const_value is not None else None
            if arr is None or arr.size != 1 or float(arr.reshape(-1)[0]) != want:
                return result.fail(f"expected the constant {want}", value)
        if x.dtype not in FLOAT_TYPES or scale.dtype != x.dtype:
            return result.fail(f"x {x.dtype} / scale {scale.dtype}: needs one float type", x)
        if self.axes_attr:
            attr = mean.producer().attributes.get("axes")
            axes_np = np.asarray(attr.value) if attr is not None else None
        else:
            axes_np = axes.const_value.numpy() if axes.const_value is not None else None
        rank = len(x.shape) if x.shape is not None else None
        if axes_np is None or axes_np.size != 1 or int(axes_np.reshape(-1)[0]) not in (-1, (rank or 0) - 1):
            return result.fail("ReduceMean must reduce the last axis only", mean)
        if mean.producer().attributes.get_int("keepdims", 1) != 1:
            return result.fail("ReduceMean keepdims must be 1", mean)
        eps_np = eps.const_value.numpy() if eps.const_value is not None else None
        if eps_np is None or eps_np.size != 1:
            return result.fail("epsilon is not a constant scalar", eps)
        if scale.shape is None or len(scale.shape) != 1:
            return result.fail("scale must be 1-D [hidden]", scale)
        return result

    def rewrite(self, op, x, eps, scale, **_):
        return op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=float(np.asarray(
            eps.const_value.numpy()).reshape(-1)[0]), stash_type=1)


def _rms_div_rules() -> RewriteRuleSet:
    return RewriteRuleSet([RmsNormDivFusion.rule("RmsNormDivFusion", reciprocal=True),
                           RmsNormDivFusion.rule("RmsNormDivFusion2", reciprocal=False),
                           RmsNormDivFusion.rule("RmsNormDivFusionAxesAttr", reciprocal=True, axes_attr=True),
                           RmsNormDivFusion.rule("RmsNormDivFusion2AxesAttr", reciprocal=False, axes_attr=True)],
                          commute=True)


def _node_count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph.all_nodes())


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Fold constants and drop dead code (counted as ``cleanup.removed_nodes``), infer shapes, fuse RMSNorm."""
    before = _node_count(model)
    optimizer.optimize(model)
    removed = before - _node_count(model)
    if removed > 0:
        report.add("cleanup.removed_nodes", removed)
    ShapeInferencePass()(model)
    report.add("ShapePlumbingToConstant", normalize_shape_plumbing(model))
    apply_rule_set(model, rms_normalization.rms_normalization_ruleset, report)
    apply_rule_set(model, _rms_div_rules(), report)
    apply_rule_set(model, skip_normalization.skip_rms_normalization_ruleset, report)
    optimizer.remove_unused_nodes(model)
