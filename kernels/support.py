"""Why a target does not take a node: the generic rules from the target description, then the kernel's own check.

Every decline is a sentence naming the rule, so ``npu-report`` and the EP log can show it verbatim.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import type_name
from ..log import escape
from .node import NodeInfo, UnreadableAttribute, ValueInfo
from .registry import kernel_for
from .target import OpRule, Target


def dtype_name(v: ValueInfo) -> str | None:
    """The value's element type name: numpy's name where NodeInfo has a dtype, else ONNX's (``int4``, ``bfloat16``,
    ``float8e4m3fn``, ``string``...) so that target rules can list it and declines name it; None only when nobody
    knows the type."""
    if v.dtype is not None:
        return v.dtype.name
    if v.onnx_type:
        return type_name(v.onnx_type)
    if v.value is not None:
        name = np.asarray(v.value).dtype.name
        return name if name in ("int4", "uint4") else None
    return None


DEFAULT_MAX_RANK = OpRule.__dataclass_fields__["max_rank"].default


def _unknown_rank_reason(node: NodeInfo, v: ValueInfo, rank_free: bool, rule: OpRule, target: Target,
                         static_required: bool) -> str | None:
    """Why an input of unknown rank (ORT's shape inference lost it, e.g. after a Reshape to a computed shape) keeps
    ``node`` off the NPU, or None. A rank-free kernel reads the rank from the runtime array, so only a target that
    compiles static shapes or limits this op's rank below the default must know it."""
    op = node.describe()
    if not rank_free:
        return (f"{op}: {escape(v.name)} has unknown rank (the {escape(node.op_type)} kernel plans by rank at "
                "compile time)")
    if static_required:
        return f"{op}: {escape(v.name)} has unknown rank; target {target.name} requires static shapes"
    if rule.max_rank < DEFAULT_MAX_RANK:
        return f"{op}: {escape(v.name)} has unknown rank; target {target.name} limits this op to rank {rule.max_rank}"
    return None


def _unreadable_attribute(node: NodeInfo) -> str | None:
    for name, value in node.attrs.items():
        if isinstance(value, UnreadableAttribute):
            if value.elem_type < 0:
                return f"attribute '{escape(name)}' has a type the plugin API does not hand over"
            return f"attribute '{escape(name)}' is a {type_name(value.elem_type)} tensor, which the NPU cannot carry"
    return None


def why_not(node: NodeInfo, target: Target) -> str | None:
    """None if ``target`` runs ``node``, else the reason it declines (which rule of the target)."""
    op = node.describe()
    rule = target.rule(node.domain, node.op_type)
    kernel = kernel_for(node.domain, node.op_type)
    if rule is None:
        return f"{op}: op not listed in [ops] of target {target.name}"
    if kernel is None:
        return f"{op}: no NPU kernel for this op"
    unreadable = _unreadable_attribute(node)
    if unreadable is not None:
        return f"{op}: {unreadable}"
    data = node.input(0)
    if data is not None and rule.dtypes:
        name = dtype_name(data)
        if name is None or name not in rule.dtypes:
            return (f"{op}: input dtype {name or 'unknown'} not supported by target {target.name} "
                    f"(allowed: {', '.join(sorted(rule.dtypes))})")
    static_required = target.static_shapes if rule.static_shapes is None else rule.static_shapes
    n_inputs = len(node.inputs)
    for i, v in enumerate((*node.inputs, *node.outputs)):
        if v.missing:
            continue
        if v.shape is None:
            if i >= n_inputs:  # an output: the kernel computes it; shape inference may simply not know the op
                continue
            if i < len(kernel.spec_ranks) and kernel.spec_ranks[i] is not None:
                continue
            reason = _unknown_rank_reason(node, v, kernel.rank_free, rule, target, static_required)
            if reason is not None:
                return reason
            continue
        if len(v.shape) > rule.max_rank:
            return f"{op}: {v.describe()} has rank {len(v.shape)} > max_rank {rule.max_rank} of target {target.name}"
        if static_required and not v.static:
            return f"{op}: {v.describe()} has symbolic/dynamic shape; target {target.name} requires static shapes"
        if rule.max_dim is not None and any(isinstance(d, int) and d > rule.max_dim for d in v.shape):
            return f"{op}: {v.describe()} exceeds max_dim {rule.max_dim} of target {target.name}"
    return kernel.check(node, target)
