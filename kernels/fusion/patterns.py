"""onnxscript pattern pieces shared by the in-partition fusions (``kernels/fusion``) and the offline rewriter
(``rewriter/``): one spelling of each op chain, so a family is matched in one idiom whichever side rewrites it.

Each function takes the pattern builder ``op`` and the pattern variables, and names the intermediate values a check
reads (``_outputs``), as onnxscript's ``RewriteRuleClassBase.pattern`` methods do.
"""

from __future__ import annotations

from typing import Any


def rotate_half(op: Any, x: Any) -> Any:
    """Hugging Face's ``rotate_half(x)``: ``Concat(Neg(x[..., h/2:]), x[..., :h/2])``; binds ``hi``, ``lo`` (the two
    Slices' outputs) and ``rotated`` (the Concat's)."""
    hi = op.Slice(x, _allow_other_inputs=True, _outputs=["hi"])
    lo = op.Slice(x, _allow_other_inputs=True, _outputs=["lo"])
    return op.Concat(op.Neg(hi, _outputs=["neg"]), lo, _outputs=["rotated"])


def rotary(op: Any, x: Any, cos: Any, sin: Any, rotated: Any) -> Any:
    """The rotary embedding as exporters write it: ``x * cos + rotated * sin``; binds ``x_cos`` and ``rot_sin``."""
    return op.Add(op.Mul(x, cos, _outputs=["x_cos"]), op.Mul(rotated, sin, _outputs=["rot_sin"]))


def rms_root(op: Any, x: Any, two: Any, eps: Any) -> Any:
    """``Sqrt(ReduceMean(Pow(x, 2)) + eps)``, an RMS norm's denominator; binds ``mean`` and ``root``."""
    mean = op.ReduceMean(op.Pow(x, two), _allow_other_inputs=True, _outputs=["mean"])
    return op.Sqrt(op.Add(mean, eps), _outputs=["root"])
