"""Options and result records shared by every rewrite family (qdq, rope, gqa, int4, cleanup).

Every family module exposes ``apply(model: onnx_ir.Model, options: RewriteOptions, report: RewriteReport) -> None``:
it rewrites ``model`` in place, adds ``{rule_name: count}`` to ``report.counts`` and, for candidate matches whose
check failed, a ``RuleFailure`` (shown by ``npu-rewrite --verbose``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

ALL_PASSES: tuple[str, ...] = ("cleanup", "qdq", "rope", "gqa", "int4")


@dataclasses.dataclass(frozen=True)
class RewriteOptions:
    passes: tuple[str, ...] = ALL_PASSES
    # int4 MatMulNBits packing (RTN, same semantics as onnxruntime's MatMulNBitsQuantizer)
    int4_block_size: int = 32
    int4_symmetric: bool = True
    int4_accuracy_level: int = 0
    exclude: str | None = None          # regex on node names never quantized (e.g. "lm_head")
    int4_min_elements: int = 0          # weights with fewer elements stay float
    # Q/DQ: Q->DQ round trips are lossy; only dropped when the user opts in
    drop_qdq_roundtrips: bool = False
    # the NPU target the model is prepared for (built-in name or TOML path): fusions emit only ops it runs
    target: str = "npu-ref"
    # gqa: fold the q/k RotaryEmbeddings into GroupQueryAttention (do_rotary=1, exact via its position_ids input)
    fold_rotary: bool = True
    verbose: bool = False


@dataclasses.dataclass(frozen=True)
class RuleFailure:
    rule: str
    node: str
    reason: str


@dataclasses.dataclass
class RewriteReport:
    counts: Counter = dataclasses.field(default_factory=Counter)
    failures: list[RuleFailure] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. passes run because a requested one needs them

    def add(self, rule: str, n: int = 1) -> None:
        if n:
            self.counts[rule] += n
