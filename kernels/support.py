"""Why a target does not take a node: the generic rules from the target description, then the kernel's own check.

Every decline is a sentence naming the rule, so ``npu-report`` and the EP log can show it verbatim.
"""

from __future__ import annotations

from .node import NodeInfo
from .registry import kernel_for
from .target import Target


def why_not(node: NodeInfo, target: Target) -> str | None:
    """None if ``target`` runs ``node``, else the reason it declines (which rule of the target)."""
    op = node.describe()
    rule = target.rule(node.domain, node.op_type)
    kernel = kernel_for(node.domain, node.op_type)
    if rule is None:
        return f"{op}: op not supported by target {target.name}"
    if kernel is None:
        return f"{op}: no NPU kernel for this op"
    data = node.input(0)
    if data is not None and rule.dtypes:
        if data.dtype is None or data.dtype.name not in rule.dtypes:
            return (f"{op}: input dtype {data.dtype} not supported by target {target.name} "
                    f"(allowed: {', '.join(sorted(rule.dtypes))})")
    static_required = target.static_shapes if rule.static_shapes is None else rule.static_shapes
    for v in (*node.inputs, *node.outputs):
        if v.missing:
            continue
        if v.shape is None:
            return f"{op}: {v.name} has unknown rank"
        if len(v.shape) > rule.max_rank:
            return f"{op}: {v.describe()} has rank {len(v.shape)} > max_rank {rule.max_rank} of target {target.name}"
        if static_required and not v.static:
            return f"{op}: {v.describe()} has symbolic/dynamic shape; target {target.name} requires static shapes"
        if rule.max_dim is not None and any(isinstance(d, int) and d > rule.max_dim for d in v.shape):
            return f"{op}: {v.describe()} exceeds max_dim {rule.max_dim} of target {target.name}"
    return kernel.check(node, target)
