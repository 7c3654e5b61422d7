"""The rewrite pipeline: load a model, run the requested rule families in a fixed order, report, save.

Each family (``cleanup``, ``qdq``, ``rope``, ``gqa``, ``int4``) is a module exposing
``apply(model, options, report)``; here each one is wrapped in an ``onnx_ir`` ``InPlacePass`` and the passes run
in ``ALL_PASSES`` order whatever order the user listed them in. ``apply_rule_set`` is the shared way to run
onnxscript rules so that every family reports ``{rule: count}`` and why candidate matches were declined.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import onnx
import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRule, RewriteRuleSet

from .model_io import EXTERNAL_DATA_THRESHOLD, RewriteError, load_model, save_model, tensor_bytes  # noqa: F401
from .options import ALL_PASSES, RewriteOptions, RewriteReport, RuleFailure

MAX_FAILURES_PER_RULE = 200

ProgressHook = Callable[[str, int, int], None]  # (stage, done, total)
_progress: contextvars.ContextVar[ProgressHook | None] = contextvars.ContextVar("npu_rewrite_progress",
                                                                                  default=None)


@dataclasses.dataclass
class RewriteResult:
    """The rewritten model (an ``onnx_ir.Model``) and what changed."""

    model: ir.Model
    report: RewriteReport

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Save to ``path``; tensor data goes to ``<name>.data`` beside it when the model exceeds ~1.8 GB."""
        return save_model(self.model, path)


# ----------------------------------------------------------------------------------------------------------------
# progress reporting (the CLI installs a rich progress bar; library callers get nothing by default)


@contextlib.contextmanager
def progress_hook(hook: ProgressHook | None) -> Iterator[None]:
    """Install ``hook(stage, done, total)`` for the rewrites run inside this context."""
    token = _progress.set(hook)
    try:
        yield
    finally:
        _progress.reset(token)


def report_progress(stage: str, done: int, total: int) -> None:
    """Called by long-running families (int4) after each unit of work."""
    hook = _progress.get()
    if hook is not None:
        hook(stage, done, total)


# ----------------------------------------------------------------------------------------------------------------
# running onnxscript rules with counts and failure reasons


_OTHER_USES = "Matched nodes have other uses preventing replacement."


class _FailureTracer(MatchingTracer):
    """Collects every candidate match whose check failed, with the rule's reason (not just the best match)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[RuleFailure] = []
        self._seen: set[tuple[str, str, str]] = set()
        self._per_rule: dict[str, int] = {}

    def log(self, rule, container, node, match_result, status) -> None:  # noqa: D102 - MatchingTracer API
        if status == MatchStatus.NO_MATCH and match_result.reason != _OTHER_USES:
            return  # a structural mismatch: not a candidate
        if status == MatchStatus.SUCCESS:
            return
        name = rule.name or str(rule)
        node_name = node.name or f"<{node.op_type}>"
        reason = match_result.reason or ("replacement failed" if status == MatchStatus.REPLACEMENT_FAILED
                                         else "check failed")
        if reason == _OTHER_USES:
            reason = "an intermediate value has other consumers or is a graph output"
        key = (name, node_name, reason)
        if key in self._seen or self._per_rule.get(name, 0) >= MAX_FAILURES_PER_RULE:
            return
        self._seen.add(key)
        self._per_rule[name] = self._per_rule.get(name, 0) + 1
        self.failures.append(RuleFailure(rule=name, node=node_name, reason=reason))


def apply_rule_set(model: ir.Model, rules: RewriteRuleSet | Iterable[RewriteRule], report: RewriteReport,
                   *, collect_failures: bool = True) -> int:
    """Apply ``rules`` in order (each rule over the whole graph), add ``{rule.name: count}`` to ``report``, then
    record why the remaining candidate matches were declined. Returns the number of rewrites."""
    rule_list: list[RewriteRule] = list(rules)
    total = 0
    for rule in rule_list:
        n = RewriteRuleSet([rule]).apply_to_model(model)
        report.add(rule.name or str(rule), n)
        total += n
    if collect_failures and rule_list:
        tracer = _FailureTracer()
        RewriteRuleSet(rule_list).apply_to_model(model, tracer=tracer)  # a tracer makes this a dry run
        report.failures.extend(tracer.failures)
    return total


# ----------------------------------------------------------------------------------------------------------------
# the pipeline


_FAMILY_MODULES = {name: f"{__package__}.{name}" for name in ALL_PASSES}


def _family_module(name: str) -> Any:
    """Import a family module by pass name; rope/gqa may not exist yet, which is only an error when requested."""
    if name not in _FAMILY_MODULES:
        raise RewriteError(f"unknown pass {name!r}; expected a subset of {','.join(ALL_PASSES)}")
    try:
        module = importlib.import_module(_FAMILY_MODULES[name])
    except ModuleNotFoundError as e:
        if e.name == _FAMILY_MODULES[name]:
            raise RewriteError(f"pass {name!r} is not available: module {e.name} is not installed") from None
        raise
    if not callable(getattr(module, "apply", None)):
        raise RewriteError(f"pass {name!r}: module {module.__name__} has no apply(model, options, report)")
    return module


class FamilyPass(ir.passes.InPlacePass):
    """One rule family as an onnx-ir pass; ``modified`` is true when the family counted any rewrite."""

    def __init__(self, name: str, options: RewriteOptions, report: RewriteReport) -> None:
        super().__init__()
        self.name = name
        self.options = options
        self.report = report
        self.module = _family_module(name)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        before = sum(self.report.counts.values())
        self.module.apply(model, self.options, self.report)
        return ir.passes.PassResult(model, modified=sum(self.report.counts.values()) != before)


def build_pipeline(options: RewriteOptions, report: RewriteReport) -> ir.passes.Sequential:
    """The requested families as a ``Sequential`` of passes, always in ``ALL_PASSES`` order."""
    unknown = [p for p in options.passes if p not in ALL_PASSES]
    if unknown:
        raise RewriteError(f"unknown pass {unknown[0]!r}; expected a subset of {','.join(ALL_PASSES)}")
    passes = [FamilyPass(name, options, report) for name in ALL_PASSES if name in options.passes]
    if not passes:
        raise RewriteError("no passes requested")
    # families may strand plumbing (e.g. Shape chains feeding a replaced pattern): drop it so a second run is a no-op
    # and may add Constant nodes, which the cleanup family lifts to initializers: do the same here
    tidy = [ir.passes.common.RemoveUnusedNodesPass(),
            ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)]
    return ir.passes.Sequential(*passes, *tidy)


def rewrite(model: str | os.PathLike | onnx.ModelProto | ir.Model, options: RewriteOptions | None = None,
            **overrides: Any) -> RewriteResult:
    """Rewrite ``model`` into the NPU-friendly canonical form.

    ``model`` is a path (external data is memory-mapped, never loaded twice), a ``ModelProto`` or an
    ``onnx_ir.Model`` (rewritten in place). ``overrides`` replace fields of ``options``
    (e.g. ``passes=("int4",)``, ``int4_block_size=64``). Raises ``RewriteError`` for unreadable or invalid input.
    """
    options = options or RewriteOptions()
    if overrides:
        if "passes" in overrides and isinstance(overrides["passes"], str):
            overrides["passes"] = tuple(p.strip() for p in overrides["passes"].split(",") if p.strip())
        try:
            options = dataclasses.replace(options, **overrides)
        except TypeError as e:
            raise RewriteError(f"bad rewrite option: {e}") from None
    _validate_options(options)
    ir_model = load_model(model)
    report = RewriteReport()
    pipeline = build_pipeline(options, report)
    io_before = _io_signature(ir_model)
    try:
        pipeline(ir_model)
    except ir.passes.PassError as e:  # onnx-ir wraps errors raised inside passes
        cause = e.__cause__ or e
        if isinstance(cause, (RewriteError, ValueError)):
            raise RewriteError(str(cause)) from cause
        raise
    io_after = _io_signature(ir_model)
    if not _same_io(io_before, io_after):
        raise RewriteError(f"internal error: graph inputs/outputs changed from {io_before} to {io_after}")
    return RewriteResult(model=ir_model, report=report)


def _validate_options(options: RewriteOptions) -> None:
    bs = options.int4_block_size
    if bs < 16 or bs > 256 or bs & (bs - 1):
        raise RewriteError(f"int4 block size must be a power of two in [16, 256], got {bs}")
    if options.int4_accuracy_level not in (0, 1, 2, 3, 4):
        raise RewriteError(f"int4 accuracy level must be 0..4, got {options.int4_accuracy_level}")
    if options.int4_min_elements < 0:
        raise RewriteError(f"int4 min elements must be >= 0, got {options.int4_min_elements}")
    if options.exclude is not None:
        import re

        try:
            re.compile(options.exclude)
        except re.error as e:
            raise RewriteError(f"bad --exclude regex {options.exclude!r}: {e}") from None


def _io_signature(model: ir.Model) -> tuple:
    def sig(values: Sequence[ir.Value]) -> tuple:
        return tuple((v.name, v.dtype, None if v.shape is None else tuple(str(d) for d in v.shape)) for v in values)

    return sig(model.graph.inputs), sig(model.graph.outputs)


def _same_io(before: tuple, after: tuple) -> bool:
    """Names, dtypes and declared shapes unchanged; a value that declared no shape may gain an inferred one."""
    def same(b: tuple, a: tuple) -> bool:
        return len(b) == len(a) and all(
            bn == an and bt == at and (bs is None or bs == as_) for (bn, bt, bs), (an, at, as_) in zip(b, a))

    return same(before[0], after[0]) and same(before[1], after[1])
