"""The rewrite pipeline: load a model, run the requested rule families in a fixed order, report, save.

Each family (passes ``cleanup``, ``qdq``, ``rope`` (module ``rotary``), ``gqa``, ``int4``) is a module exposing
``apply(model, options, report)``, listed in the static table ``FAMILIES``; here each one is wrapped in an
``onnx_ir`` ``InPlacePass`` and the passes run in ``ALL_PASSES`` order whatever order the user listed them in.
Families run their onnxscript rules through ``rule_set.apply_rule_set``, so every family reports
``{rule: count}`` and why candidate matches were declined.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import onnx
import onnx_ir as ir

from . import cleanup, gqa, int4, qdq, rotary
from .model_io import EXTERNAL_DATA_THRESHOLD, RewriteError, load_model, save_model, tensor_bytes  # noqa: F401 - re-exported
from .options import ALL_PASSES, RewriteOptions, RewriteReport
from .target_ops import load_target


@dataclasses.dataclass
class RewriteResult:
    """The rewritten model (an ``onnx_ir.Model``) and what changed."""

    model: ir.Model
    report: RewriteReport

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Save to ``path``; tensor data goes to ``<name>.data`` beside it when the model exceeds ~1.8 GB."""
        return save_model(self.model, path)


# ----------------------------------------------------------------------------------------------------------------
# the pipeline


# pass name -> family module (each exposes ``apply(model, options, report)``); a static table, so every family is
# imported with the package and a typo is an import error, not a run-time surprise
FAMILIES: dict[str, ModuleType] = {"cleanup": cleanup, "qdq": qdq, "rope": rotary, "gqa": gqa, "int4": int4}


# pass -> passes it cannot work without, run first whether or not they were named: rope and gqa match on static
# ranks, head dims and constant Slice bounds, which only cleanup's constant folding and shape inference provide
# (without it they fuse nothing on exported models)
REQUIRES: dict[str, tuple[str, ...]] = {"rope": ("cleanup",), "gqa": ("cleanup",)}


def with_requirements(passes: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """The requested passes plus every pass they require, in ``ALL_PASSES`` order, and one note per added pass."""
    wanted, notes = set(passes), []
    stack = list(passes)
    while stack:
        for needed in REQUIRES.get(stack.pop(), ()):
            if needed not in wanted:
                wanted.add(needed)
                stack.append(needed)
                needers = [p for p in ALL_PASSES if p in wanted and needed in REQUIRES.get(p, ())]
                notes.append(f"pass {needed!r} added: {', '.join(needers)} need(s) it")
    return tuple(p for p in ALL_PASSES if p in wanted), notes


def _family_module(name: str) -> ModuleType:
    """The family module of a pass name; an unknown or unregistered name is a ``RewriteError``."""
    if name not in ALL_PASSES:
        raise RewriteError(f"unknown pass {name!r}; expected a subset of {','.join(ALL_PASSES)}")
    if name not in FAMILIES:
        raise RewriteError(f"pass {name!r} is not available: no family module is registered for it")
    return FAMILIES[name]


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
    """The requested families and those they require (``REQUIRES``, noted in ``report.notes``) as a
    ``Sequential`` of passes, always in ``ALL_PASSES`` order."""
    unknown = [p for p in options.passes if p not in ALL_PASSES]
    if unknown:
        raise RewriteError(f"unknown pass {unknown[0]!r}; expected a subset of {','.join(ALL_PASSES)}")
    if not options.passes:
        raise RewriteError("no passes requested")
    names, notes = with_requirements(options.passes)
    report.notes.extend(notes)
    passes = [FamilyPass(name, options, report) for name in names]
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
    load_target(options.target)
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
    """Names, dtypes and declared shapes unchanged; a value that declared no shape may gain an inferred one, and
    an unknown dim (``None``) an inferred size or symbol."""
    def same_shape(b: tuple | None, a: tuple | None) -> bool:
        return b is None or (a is not None and len(b) == len(a)
                             and all(bd == ad or bd == "None" for bd, ad in zip(b, a)))

    def same(b: tuple, a: tuple) -> bool:
        return len(b) == len(a) and all(
            bn == an and bt == at and same_shape(bs, as_) for (bn, bt, bs), (an, at, as_) in zip(b, a))

    return same(before[0], after[0]) and same(before[1], after[1])
