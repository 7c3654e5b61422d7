"""``npu-report MODEL.onnx [--target T] [--json OUT] [--html OUT] [--run] [--dim name=value ...] [--compare]
[--float-model FLOAT.onnx] [--no-check]``.

Exit codes: 0 report produced; 2 bad input (missing/unreadable/invalid model, a model ONNX Runtime refuses, unknown
target, bad --dim), printed as one line on stderr naming the file and the reason, without a traceback; 1 NpuEP
failed on a model the CPU EP runs (one line), or the report itself failed (a bug: traceback shown).

The report's ORT sessions log only fatal messages: an ORT error reaches the user once, as that one line.
"""

from __future__ import annotations

import argparse
import sys

from ..kernels.target import TargetError


def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--dim expects name=value, got {text!r}")
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--dim {name}: {value!r} is not an integer") from None
    if size < 0:
        raise argparse.ArgumentTypeError(f"--dim {name}: size must be >= 0, got {size}")
    return name, size


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's default prints usage too)
        print(f"npu-report: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="npu-report", description="NpuEP coverage, partitions, CPU<->NPU boundaries and their cost.")
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--target", default="npu-ref", help="built-in target name or path to a target .toml")
    p.add_argument("--json", metavar="OUT.json", help="write the versioned JSON document")
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained HTML file with plots")
    p.add_argument("--run", action="store_true", help="run on NpuEP and the CPU EP and measure boundaries")
    p.add_argument("--runs", type=int, default=20, help="timed runs per EP with --run (default 20)")
    p.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=VALUE",
                   help="size of a symbolic input dim (repeatable)")
    p.add_argument("--layers", type=int, help="number of decoder layers when node names do not show them")
    p.add_argument("--policy", choices=("max_coverage", "cost_aware"), default="max_coverage")
    p.add_argument("--compare", action="store_true", help="per-node numerics: NpuEP vs CPU EP golden tensors")
    p.add_argument("--float-model", metavar="FLOAT.onnx",
                   help="float original of a quantized model: three-way numerics float / quantized / NpuEP "
                        "(implies --compare)")
    p.add_argument("--prefill-tokens", type=int, default=16,
                   help="new tokens of the prefill-shaped run of a KV-cache model with --run (default 16)")
    p.add_argument("--no-check", action="store_true",
                   help="skip onnx.checker (structural checks still run) for models ORT runs but the checker rejects")
    p.add_argument("--quiet", action="store_true", help="no terminal summary")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.runs < 1 or args.prefill_tokens < 1:
        parser().error("--runs and --prefill-tokens must be >= 1")
    from .report import NpuEPFailure, ReportInputError, build_report, write_json
    from .report_html import write_html
    from .report_render import render

    try:
        doc = build_report(args.model, target=args.target, dims=dict(args.dim), run=args.run, runs=args.runs,
                           layers=args.layers, compare=args.compare or bool(args.float_model),
                           provider_options={"partition_policy": args.policy}, float_model=args.float_model,
                           check=not args.no_check, prefill_tokens=args.prefill_tokens)
    except (ReportInputError, TargetError) as exc:
        print(f"npu-report: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except NpuEPFailure as exc:
        print(f"npu-report: {_one_line(exc)}", file=sys.stderr)
        return 1
    if not args.quiet:
        render(doc)
    try:
        if args.json:
            write_json(doc, args.json)
        if args.html:
            write_html(doc, args.html)
    except OSError as exc:
        print(f"npu-report: error: cannot write output: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
