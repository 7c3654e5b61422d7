"""``npu-rewrite IN.onnx -o OUT.onnx``: rewrite a model into the NPU-friendly form and say what changed.

Exit codes: 0 ok, 1 ``--check`` failed, 2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..rewriter import ALL_PASSES, RewriteError, RewriteOptions, RewriteResult, progress_hook, rewrite

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message by default)
        raise _BadInput(message)


class _BadInput(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="npu-rewrite", description="Rewrite an ONNX model for the NPU (Q/DQ fusion, RoPE/GQA, INT4).")
    p.add_argument("input", help="input .onnx (external data beside it is fine)")
    p.add_argument("-o", "--output", required=True, help="output .onnx (data goes to OUT.onnx.data above ~1.8 GB)")
    p.add_argument("--passes", default=",".join(ALL_PASSES),
                   help=f"comma-separated subset of {','.join(ALL_PASSES)} (always run in that order)")
    p.add_argument("--int4-block-size", type=int, default=RewriteOptions.int4_block_size)
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--int4-symmetric", dest="int4_symmetric", action="store_true", default=True)
    sym.add_argument("--int4-asymmetric", dest="int4_symmetric", action="store_false")
    p.add_argument("--int4-accuracy-level", type=int, default=0)
    p.add_argument("--exclude", default=None, help="regex on node names never quantized (e.g. lm_head)")
    p.add_argument("--min-elements", type=int, default=0, help="weights with fewer elements stay float")
    p.add_argument("--drop-qdq-roundtrips", action="store_true", help="also drop lossy Q->DQ pairs")
    p.add_argument("--no-fold-rotary", action="store_true",
                   help="keep RotaryEmbedding nodes separate instead of folding them into GroupQueryAttention")
    p.add_argument("--check", action="store_true", help="compare input and output on ORT's CPU EP")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout instead of tables")
    p.add_argument("--verbose", action="store_true", help="show why candidate matches were declined")
    return p


def _options(args: argparse.Namespace) -> RewriteOptions:
    passes = tuple(p.strip() for p in args.passes.split(",") if p.strip())
    unknown = [p for p in passes if p not in ALL_PASSES]
    if unknown or not passes:
        raise _BadInput(f"--passes: unknown pass {unknown[0]!r}" if unknown else "--passes: empty")
    return RewriteOptions(passes=passes, int4_block_size=args.int4_block_size, int4_symmetric=args.int4_symmetric,
                          int4_accuracy_level=args.int4_accuracy_level, exclude=args.exclude,
                          int4_min_elements=args.min_elements, drop_qdq_roundtrips=args.drop_qdq_roundtrips,
                          fold_rotary=not args.no_fold_rotary,
                          verbose=args.verbose)


def _run_with_progress(path: str, options: RewriteOptions, console: Console, show: bool) -> RewriteResult:
    if not show:
        return rewrite(path, options)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def hook(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage}", total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        with progress_hook(hook):
            return rewrite(path, options)


def _print_tables(result: RewriteResult, console: Console, verbose: bool) -> None:
    table = Table(title="rewrites per rule")
    table.add_column("rule")
    table.add_column("count", justify="right")
    for rule, n in sorted(result.report.counts.items()):
        table.add_row(rule, str(n))
    if not result.report.counts:
        table.add_row("(none)", "0")
    console.print(table)
    if verbose and result.report.failures:
        why = Table(title="declined candidates")
        for col in ("rule", "node", "reason"):
            why.add_column(col)
        for f in result.report.failures:
            why.add_row(f.rule, f.node, f.reason)
        console.print(why)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``npu-rewrite``; returns the exit code."""
    err = Console(stderr=True)
    out = Console()
    try:
        args = build_parser().parse_args(argv)
        options = _options(args)
        t0 = time.perf_counter()
        result = _run_with_progress(args.input, options, err, show=not args.json)
        saved = result.save(args.output)
        seconds = time.perf_counter() - t0
    except (_BadInput, RewriteError, OSError, ValueError) as e:
        print(f"npu-rewrite: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT

    summary = {
        "input": args.input, "output": str(saved), "seconds": round(seconds, 3),
        "counts": dict(sorted(result.report.counts.items())),
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
        out.print(f"wrote {saved} in {seconds:.2f} s")
        if args.check:
            c = summary["check"]
            status = "[green]passed[/green]" if c["passed"] else f"[red]FAILED[/red]: {c['reason']}"
            out.print(f"check {status}: output {c['output_name']!r} max abs diff {c['max_abs_diff']:.3g}, "
                      f"top-1 agreement {c['top1_agreement']:.3f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
