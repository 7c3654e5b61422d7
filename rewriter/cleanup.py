"""Clean-ups the other families rely on: constant folding of shape plumbing, dead code, RMSNorm normalization.

Reuses onnxscript: its optimizer folds constants (it never folds QuantizeLinear/DequantizeLinear, so Q/DQ
structure survives for the ``qdq`` family), removes dead nodes/initializers and folds Transposes of constant
weights; its ort_fusions turn decomposed RMSNorm (Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul) into
SimplifiedLayerNormalization and Add+RMSNorm into com.microsoft SkipSimplifiedLayerNormalization, both of which
ORT's CPU EP runs.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import optimizer
from onnxscript.rewriter.ort_fusions import rms_normalization, skip_normalization

from ._core import apply_rule_set
from .options import RewriteOptions, RewriteReport


def _node_count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph.all_nodes())


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Fold constants and drop dead code (counted as ``cleanup.removed_nodes``), then fuse RMSNorm/SkipRMSNorm."""
    before = _node_count(model)
    optimizer.optimize(model)
    removed = before - _node_count(model)
    if removed > 0:
        report.add("cleanup.removed_nodes", removed)
    apply_rule_set(model, rms_normalization.rms_normalization_ruleset, report)
    apply_rule_set(model, skip_normalization.skip_rms_normalization_ruleset, report)
    optimizer.remove_unused_nodes(model)
