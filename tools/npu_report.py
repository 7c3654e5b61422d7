"""``npu-report MODEL.onnx [--target T] [--json OUT] [--html OUT] [--run] [--dim name=value ...] [--compare]
[--float-model FLOAT.onnx] [--no-check] [--dump-partitions DIR] [--explain-fusions]``;
``npu-report --zoo SRC [SRC ...] [--workers N] [--timeout S] [--max-memory-mib MIB]`` (SRC: a model file, a folder
of them, or ``corpus``): one row per model from a real NpuEP session, each model in its own worker process
(``report/isolated.py``).

Exit codes: 0 report produced; 2 bad input (missing/unreadable/invalid model, a model ONNX Runtime refuses, unknown
target, bad --dim), printed as one line on stderr naming the file and the reason, without a traceback; 1 NpuEP
failed on a model the CPU EP runs (one line), or the report itself failed (a bug: traceback shown); 130 Ctrl-C.
``--json`` and ``--html`` are written as a set: both new files or neither (``_cli.write_outputs``).

The report's ORT sessions log only fatal messages: an ORT error reaches the user once, as that one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ._cli import TARGET_ENV, default_target, quiet_interrupt, single_values, target_origin, write_outputs


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
    """The first line of the error, safe for the terminal (``log.escape``: a model's names can hold escapes)."""
    from ..log import escape

    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return escape(lines[0]) if lines else type(exc).__name__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's default prints usage too)
        print(f"npu-report: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="npu-report", description="NpuEP coverage, partitions, CPU<->NPU boundaries and their cost.")
    p.add_argument("model", nargs="?", help="ONNX model file (not with --zoo)")
    p.add_argument("--target", default=None,
                   help=f"built-in target name or path to a target .toml (default ${TARGET_ENV}, else npu-ref)")
    p.add_argument("--json", metavar="OUT.json", help="write the versioned JSON document")
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained HTML file with plots")
    p.add_argument("--kv-cache-dtype", default=None, metavar="FORMAT",
                   help="the KV cache format attention keeps (NpuEP option kv_cache_dtype: float32, float16, "
                   "int8_per_head, int8_per_token, int4_per_head): the timeline moves K/V at its size")
    p.add_argument("--run", action="store_true", help="run on NpuEP and the CPU EP and measure boundaries")
    p.add_argument("--device-memory", choices=("host", "npu"), default="host",
                   help="with --run: NpuEP's partition inputs/outputs in host memory (default, as providers=['NpuEP']) "
                        "or in NPU memory (ORT copies at the boundaries; the boundaries line counts them)")
    p.add_argument("--runs", type=int, default=None, help="timed runs per EP with --run (default 20; --zoo: 5)")
    p.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=VALUE",
                   help="size of a symbolic input dim, or of an unnamed/-1 one as INPUT:AXIS=VALUE (repeatable); "
                        "the sizes picked for the others are printed")
    p.add_argument("--max-input-mib", type=float, default=None, metavar="MIB",
                   help="refuse --run/--compare when the generated inputs need more (default "
                        "128 MiB)")
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
    p.add_argument("--dump-partitions", metavar="DIR",
                   help="write every NPU partition of the file as a standalone ONNX model into DIR as pNNN.onnx "
                        "(new files only; all or nothing: a failure removes what this run wrote)")
    p.add_argument("--explain-fusions", action="store_true",
                   help="per partition, the in-partition fusions applied and, per candidate node a fusion tried, "
                        "why it did not apply (also under 'fusions' in the JSON)")
    p.add_argument("--zoo", nargs="+", metavar="SRC",
                   help="model zoo: one row per model (a file, a folder of .onnx files, or 'corpus')")
    p.add_argument("--workers", type=int, default=None, help="worker processes for --zoo (default: one per core)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="--zoo: seconds one model may take before its worker is killed and its row says so "
                        "(default 600)")
    p.add_argument("--max-memory-mib", type=int, default=None, metavar="MIB",
                   help="--zoo: address space of one worker; a model needing more is an error row (default: the "
                        "machine's memory shared by the workers, at least 4096)")
    p.add_argument("--quiet", action="store_true", help="no terminal summary")
    return p


def _checked_target(given: str | None) -> str:
    """``--target``, else ``$NPU_EP_TARGET``, else npu-ref; an unknown one is an error naming where it came from."""
    from ..kernels.target import Target, TargetError

    name = given or default_target()
    try:
        Target.load(name)
    except TargetError as exc:
        raise ValueError(f"{target_origin(given)}: {_one_line(exc)}") from None
    return name


@quiet_interrupt
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.dim = single_values(args.dim, "--dim")
        args.target = _checked_target(args.target)
    except ValueError as exc:
        print(f"npu-report: error: {exc}", file=sys.stderr)
        return 2
    if (args.runs is not None and args.runs < 1) or args.prefill_tokens < 1:
        parser().error("--runs and --prefill-tokens must be >= 1")
    if args.max_input_mib is not None and not args.max_input_mib > 0:
        parser().error("--max-input-mib must be > 0")
    if args.zoo:
        return _zoo(args)
    zoo_only = [flag for flag, given in (("--workers", args.workers), ("--timeout", args.timeout),
                                         ("--max-memory-mib", args.max_memory_mib)) if given is not None]
    if zoo_only:
        parser().error(f"{zoo_only[0]} goes with --zoo")
    if args.model is None:
        parser().error("a model file is required (or --zoo SRC ...)")
    from ..kernels.target import TargetError
    from .report.build import NpuEPFailure, ReportInputError, build_report
    from .report.html import render_html
    from .report.partition_dump import DumpError
    from .report.render import render
    from .report.run import DEFAULT_MAX_INPUT_MIB

    outputs = [o for o in (args.json, args.html) if o]
    try:
        refuse_outputs_onto_inputs(outputs, [args.model, args.float_model])
        doc = build_report(args.model, target=args.target, dims=args.dim, run=args.run, runs=args.runs or 20,
                           layers=args.layers, compare=args.compare or bool(args.float_model),
                           provider_options={"partition_policy": args.policy,
                                             **({"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype
                                                else {})}, float_model=args.float_model,
                           check=not args.no_check, prefill_tokens=args.prefill_tokens,
                           max_input_mib=args.max_input_mib or DEFAULT_MAX_INPUT_MIB,
                           dump_partitions=args.dump_partitions, explain_fusions=args.explain_fusions,
                           device_memory=args.device_memory)
    except (ReportInputError, TargetError, DumpError) as exc:
        print(f"npu-report: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"npu-report: error: {args.model}: out of memory (lower sizes with --dim NAME=VALUE)", file=sys.stderr)
        return 2
    except NpuEPFailure as exc:
        print(f"npu-report: {_one_line(exc)}", file=sys.stderr)
        return 1
    picked = {k: v for k, v in doc["dims"].items() if k not in args.dim}
    if picked:  # stderr, so that it shows with --quiet and never mixes into a pipe of the terminal summary
        sizes = ", ".join(f"{k}={v}" for k, v in picked.items())
        print(f"npu-report: input dims not given were sized {sizes} (set them with --dim NAME=VALUE)",
              file=sys.stderr)
    if not args.quiet:
        render(doc)
        if args.explain_fusions:
            from .report.fusions import render_fusions

            print(render_fusions(doc["fusions"]), end="")
    for d in doc.get("partition_dumps", []):
        print(f"npu-report: wrote {d['path']} (partition {d['partition']}, {d['nodes']} nodes)", file=sys.stderr)
    return _write(args, doc, lambda: render_html(doc))


def _write(args: argparse.Namespace, doc: dict, html: Callable[[], str]) -> int:
    """``--json`` and ``--html`` written as a set (``_cli.write_outputs``): both new files or neither."""
    from .report.build import json_bytes

    files = {}
    if args.json:
        files[args.json] = json_bytes(doc)
    if args.html:
        files[args.html] = html().encode("utf-8")
    try:
        write_outputs(files)
    except OSError as exc:
        print(f"npu-report: error: cannot write output: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _zoo(args: argparse.Namespace) -> int:
    """``--zoo``: the sources' models measured in worker processes; JSON/HTML written like the report's."""
    from .report.build import ReportInputError
    from .report.model_zoo import DEFAULT_TIMEOUT_S, model_paths, render_html, render_terminal, zoo

    wrong = [flag for flag, given in (("a model file", args.model), ("--run", args.run), ("--compare", args.compare),
                                      ("--float-model", args.float_model), ("--dump-partitions", args.dump_partitions),
                                      ("--explain-fusions", args.explain_fusions))
             if given]
    if wrong:
        parser().error(f"--zoo does not take {', '.join(wrong)}")
    if args.workers is not None and args.workers < 1:
        parser().error("--workers must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        parser().error("--timeout must be > 0 seconds")
    if args.max_memory_mib is not None and args.max_memory_mib < 1:
        parser().error("--max-memory-mib must be >= 1")
    outputs = [o for o in (args.json, args.html) if o]
    try:
        models = model_paths(args.zoo)
        refuse_outputs_onto_inputs(outputs, [path for _, path in models])
        doc = zoo(args.zoo, target=args.target, dims=args.dim, workers=args.workers, runs=args.runs or 5,
                  timeout_s=args.timeout or DEFAULT_TIMEOUT_S, max_memory_mib=args.max_memory_mib)
    except (ReportInputError, FileNotFoundError) as exc:
        print(f"npu-report: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(render_terminal(doc), end="")
    return _write(args, doc, lambda: render_html(doc))


def refuse_outputs_onto_inputs(outputs: list[str], inputs: list[str | None]) -> None:
    """An output may not replace a file the report reads (the models and their external data files), and
    ``--json`` and ``--html`` may not be the same file."""
    from .report.build import ReportInputError
    from .report.validate import files_read_by

    if not outputs:
        return
    if len(outputs) == 2 and os.path.abspath(outputs[0]) == os.path.abspath(outputs[1]):
        raise ReportInputError(f"{outputs[0]}: --json and --html name the same file")
    read = [f for model in inputs if model for f in files_read_by(model)]
    for out in outputs:
        for f in read:
            if os.path.realpath(out) == os.path.realpath(f) or (
                    os.path.exists(out) and os.path.exists(f) and os.path.samefile(out, f)):
                raise ReportInputError(f"{out}: output would replace {f}, which the report reads; "
                                       "choose another output path")


if __name__ == "__main__":
    sys.exit(main())
