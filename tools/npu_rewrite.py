"""``npu-rewrite IN.onnx -o OUT.onnx``: rewrite a model into the NPU-friendly form and say what changed.

Exit codes: 0 ok, 1 ``--check`` failed, 2 bad input (one line on stderr, no traceback), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import pathlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ..log import escape as printable
from ._cli import default_target, quiet_interrupt, single_values, target_origin

if TYPE_CHECKING:  # the rewriter and rich are imported inside main (Ctrl-C there exits 130 quietly: _cli)
    from rich.console import Console

    from ..rewriter import RewriteOptions, RewriteResult

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message by default)
        raise _BadInput(message)


class _BadInput(Exception):
    pass


def _static_dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"--static-dim expects NAME=VALUE with VALUE >= 0, got {text!r}")
    return name, int(value)


def build_parser() -> argparse.ArgumentParser:
    from ..rewriter import ALL_PASSES, RewriteOptions

    p = _Parser(prog="npu-rewrite", description="Rewrite an ONNX model for the NPU (Q/DQ fusion, RoPE/GQA, INT4).")
    p.add_argument("input", help="input .onnx (external data beside it is fine)")
    p.add_argument("-o", "--output", required=True,
                   help="output .onnx, written atomically; its tensors go to OUT.onnx.data beside it when the "
                        "input has external data or above ~1.8 GB. Never one of the input's files")
    p.add_argument("--passes", default=",".join(ALL_PASSES),
                   help=f"comma-separated subset of {','.join(ALL_PASSES)} (always run in that order)")
    p.add_argument("--target", default=None, metavar="NAME|PATH",
                   help="NPU target the model is prepared for (built-in name or target .toml): fusions emit only "
                        f"ops it lists (default $NPU_EP_TARGET, else {RewriteOptions.target})")
    p.add_argument("--int4-block-size", type=int, default=RewriteOptions.int4_block_size, metavar="N",
                   help="int4 pass: weights per quantization block along K, a power of two in [16, 256] "
                        f"(default {RewriteOptions.int4_block_size}); smaller is more accurate and larger")
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--int4-symmetric", dest="int4_symmetric", action="store_true", default=True,
                     help="int4 pass: one scale per block, zero point 8 (default; as ORT's quantizer)")
    sym.add_argument("--int4-asymmetric", dest="int4_symmetric", action="store_false",
                     help="int4 pass: a scale and a zero point per block (better for skewed weights)")
    p.add_argument("--int4-accuracy-level", type=int, default=0, choices=range(5), metavar="{0..4}",
                   help="int4 pass: MatMulNBits accuracy_level, the lowest precision of A the kernel may use "
                        "(0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8; default 0)")
    p.add_argument("--exclude", default=None,
                   help="int4 pass: regex on MatMul node names never quantized (e.g. lm_head)")
    p.add_argument("--min-elements", type=int, default=0, metavar="N",
                   help="int4 pass: weights with fewer than N elements stay float (default 0)")
    p.add_argument("--drop-qdq-roundtrips", action="store_true", help="also drop lossy Q->DQ pairs")
    p.add_argument("--no-fold-rotary", action="store_true",
                   help="keep RotaryEmbedding nodes separate instead of folding them into GroupQueryAttention")
    p.add_argument("--static-dim", action="append", default=[], type=_static_dim, metavar="NAME=VALUE",
                   help="fix an input dim (its symbolic name, or INPUT:AXIS) after rewriting and fold the shape "
                        "plumbing that becomes constant: one static model per bucket for static-shape targets such "
                        "as npu-edge; repeatable")
    p.add_argument("--check", action="store_true", help="compare input and output on ORT's CPU EP")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout instead of tables")
    p.add_argument("--verbose", action="store_true", help="show why candidate matches were declined")
    return p


def _options(args: argparse.Namespace) -> RewriteOptions:
    from ..kernels.target import Target, TargetError
    from ..rewriter import ALL_PASSES, RewriteOptions

    target = args.target or default_target(RewriteOptions.target)
    if args.target is None:  # from the environment: say so (the rewriter words --target's own errors)
        try:
            Target.load(target)
        except TargetError as exc:
            raise _BadInput(f"{target_origin(args.target)}: {exc}") from None
    passes = tuple(p.strip() for p in args.passes.split(",") if p.strip())
    unknown = [p for p in passes if p not in ALL_PASSES]
    if unknown or not passes:
        raise _BadInput(f"--passes: unknown pass {unknown[0]!r}" if unknown else "--passes: empty")
    return RewriteOptions(passes=passes, int4_block_size=args.int4_block_size, int4_symmetric=args.int4_symmetric,
                          int4_accuracy_level=args.int4_accuracy_level, exclude=args.exclude,
                          int4_min_elements=args.min_elements, drop_qdq_roundtrips=args.drop_qdq_roundtrips,
                          fold_rotary=not args.no_fold_rotary, target=target,
                          verbose=args.verbose)


def _run_with_progress(model, options: RewriteOptions, console: Console, show: bool) -> RewriteResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..rewriter import progress_hook, rewrite

    if not show:
        return rewrite(model, options)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def hook(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage}", total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        with progress_hook(hook):
            return rewrite(model, options)


def _print_tables(result: RewriteResult, console: Console, verbose: bool) -> None:
    """Names, reasons and notes are escaped: control characters (a model's names can hold ANSI/OSC escapes) by
    ``log.escape``, then rich's markup (it would otherwise eat text in brackets such as "[ops]")."""
    from rich.markup import escape as markup_escape
    from rich.table import Table

    def escape(text: str) -> str:
        return markup_escape(printable(text))

    for note in result.report.notes:
        console.print(f"note: {escape(note)}")
    table = Table(title="rewrites per rule")
    table.add_column("rule")
    table.add_column("count", justify="right")
    for rule, n in sorted(result.report.counts.items()):
        table.add_row(escape(rule), str(n))
    if not result.report.counts:
        table.add_row("(none)", "0")
    console.print(table)
    if verbose and result.report.failures:
        why = Table(title="declined candidates")
        for col in ("rule", "node", "reason"):
            why.add_column(col)
        for f in result.report.failures:
            why.add_row(escape(f.rule), escape(f.node), escape(f.reason))
        console.print(why)


def _refuse_non_regular(path: str) -> None:
    """A FIFO, device or folder is named for what it is (a missing file: ``load_model`` says so)."""
    from .model_file import check_regular_file

    with contextlib.suppress(FileNotFoundError):
        check_regular_file(path)


def _specialized(model, dims: dict[str, int]):
    """Imported here: onnx-graphsurgeon is only needed with --static-dim (CLI start-up time)."""
    import onnx_ir as ir

    from .static_shapes import specialize

    return ir.serde.deserialize_model(specialize(ir.serde.serialize_model(model), dims))


class _OneLineWarnings(logging.Handler):
    """Library warnings (onnx_ir logs a failed shape inference with its traceback) as one line each."""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            lines = [ln for ln in str(record.exc_info[1]).splitlines() if ln.strip()]
            text += f": {type(record.exc_info[1]).__name__}: {lines[0] if lines else ''}"
        print(f"npu-rewrite: warning: {printable(text)}", file=sys.stderr)


@contextlib.contextmanager
def _one_line_library_warnings() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript")]
    handler = _OneLineWarnings(logging.WARNING)
    saved = [(lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        lg.handlers, lg.propagate = [handler], False
    try:
        yield
    finally:
        for lg, (propagate, handlers) in zip(loggers, saved):
            lg.handlers, lg.propagate = handlers, propagate


@quiet_interrupt
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``npu-rewrite``; returns the exit code."""
    with _one_line_library_warnings():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    from rich.console import Console
    from rich.markup import escape as markup_escape

    from ..rewriter import RewriteError, load_model
    from ..rewriter.model_io import files_read_by, refuse_overwriting_inputs

    def escape(text: str) -> str:
        return markup_escape(printable(text))

    err = Console(stderr=True)
    out = Console()
    try:
        args = build_parser().parse_args(argv)
        options = _options(args)
        static_dims = single_values(args.static_dim, "--static-dim")
        t0 = time.perf_counter()
        _refuse_non_regular(args.input)
        model = load_model(args.input)
        # refused before any work: the output (and its data file) must not replace a file the input reads
        target = pathlib.Path(args.output)
        refuse_overwriting_inputs([target, target.with_name(target.name + ".data")], files_read_by(model))
        result = _run_with_progress(model, options, err, show=not args.json)
        if static_dims:
            result.model = _specialized(result.model, static_dims)
        saved = result.save(target)
        seconds = time.perf_counter() - t0
    except MemoryError:
        print(f"npu-rewrite: error: {args.input}: out of memory while rewriting", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (_BadInput, RewriteError, OSError, ValueError) as e:  # StaticShapeError is a ValueError
        print(f"npu-rewrite: error: {printable(str(e).splitlines()[0]) if str(e) else type(e).__name__}",
              file=sys.stderr)
        return EXIT_BAD_INPUT

    summary = {
        "input": args.input, "output": str(saved), "seconds": round(seconds, 3),
        "counts": dict(sorted(result.report.counts.items())), "notes": list(result.report.notes),
        "failures": [{"rule": f.rule, "node": f.node, "reason": f.reason} for f in result.report.failures]
        if args.verbose else len(result.report.failures),
    }
    code = EXIT_OK
    if args.check:
        from .rewrite_check import check_models

        lossy = bool(result.report.counts.get("MatMulToNBits")) or options.drop_qdq_roundtrips
        check = check_models(args.input, saved, lossy=lossy)
        summary["check"] = check.as_dict()
        code = EXIT_OK if check.passed else EXIT_CHECK_FAILED
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print_tables(result, out, args.verbose)
        out.print(f"wrote {escape(str(saved))} in {seconds:.2f} s")
        if args.check:
            c = summary["check"]
            status = "[green]passed[/green]" if c["passed"] else f"[red]FAILED[/red]: {escape(c['reason'])}"
            if c["output_name"]:
                out.print(f"check {status}: output {escape(repr(c['output_name']))} "
                          f"max abs diff {c['max_abs_diff']:.3g}, top-1 agreement {c['top1_agreement']:.3f}")
            else:  # nothing was compared (a model ORT refuses, inputs too large to generate)
                out.print(f"check {status}")
    return code


if __name__ == "__main__":
    sys.exit(main())
