"""Which ops a rewrite may emit: those the target NPU lists in the ops table of its description, for the data
type, so that a rewrite never turns nodes the NPU takes into an op it declines. When a target starts listing an
op, the rules emitting it start firing without a change here. (Reasons avoid square brackets: the CLI prints them
through rich, which would read ``[ops]`` as markup.)
"""

from __future__ import annotations

import onnx_ir as ir

from ..kernels.node import canonical_domain
from ..kernels.target import Target, TargetError
from .model_io import RewriteError


def load_target(name_or_path: str) -> Target:
    """The target a rewrite prepares for (built-in name or TOML path); a bad one is a ``RewriteError``."""
    try:
        return Target.load(name_or_path)
    except TargetError as e:
        raise RewriteError(f"rewrite target: {e}") from None


def why_not_emitted(target: Target, domain: str, op_type: str, data_type: ir.DataType | None) -> str | None:
    """None if ``target`` runs ``domain::op_type`` with first input of ``data_type``, else the reason."""
    domain = canonical_domain(domain)
    key = f"{domain}::{op_type}" if domain else op_type
    rule = target.rule(domain, op_type)
    if rule is None:
        return f"{key} is not in the ops table of target {target.name}, so the unit is kept as it is"
    dtype = data_type.numpy().name if data_type is not None else None
    if rule.dtypes and dtype not in rule.dtypes:
        return (f"{key} takes {', '.join(sorted(rule.dtypes))} on target {target.name}, not {dtype}, so the unit "
                "is kept as it is")
    return None
