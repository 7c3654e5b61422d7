"""npu_ep.rewriter: offline graph rewrites into the NPU-friendly canonical form (Q/DQ fusion, RoPE/GQA
normalization, INT4 MatMulNBits packing), emitting only ops ORT's CPU EP can run.

``rewrite(model, options=None, **overrides) -> RewriteResult`` is the Python API; ``npu-rewrite`` the CLI.

May import: ``ep`` (its ONNX graph reading), ``kernels`` (a target's op list), ``quantization`` and ``_atomic``;
never ``tools``.
"""

from ._core import RewriteError, RewriteResult, load_model, rewrite, save_model
from .options import ALL_PASSES, RewriteOptions, RewriteReport, RuleFailure
from .progress import progress_hook
from .rule_set import apply_rule_set

__all__ = [
    "ALL_PASSES", "RewriteError", "RewriteOptions", "RewriteReport", "RewriteResult", "RuleFailure",
    "apply_rule_set", "load_model", "progress_hook", "rewrite", "save_model",
]
