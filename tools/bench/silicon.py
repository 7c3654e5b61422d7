"""Calibration benchmark: NpuEP's projected latency on real-NPU targets against latencies measured on devices.

    python -m npu_ep.tools.bench.silicon [--data DIR] [--cache DIR] [--targets T,...] [--models M,...] [--fit]
                                         [--json OUT]

The measurements are ``shared/reference/npu-measured/cnn_calibration.csv`` (Qualcomm AI Hub profile jobs; its
README gives the source commit). Row rule, stated once: a row counts when it ran wholly on the NPU
(``layers_cpu == 0`` and ``primary_compute_unit == NPU``) at precision ``float`` (fp16 on the NPU) or ``w8a8``;
w8a16 rows are left out because NpuEP's compiler forms 16-bit-activation units for MatMul only, not Conv, so it
would project those nets as float convs. One device latency per (model, precision, chipset): the median over the
runtimes that qualify (TFLite, QNN, ORT's QNN EP measure the same silicon; a latency row is one precision, so the
runtimes' spread is noise around it, not a bias between precisions).

Speedup rule, stated once: the measured w8a8/fp16 speedup compares like with like, the fp16 over the w8a8 latency
on the same device with the same runtime (QNN against QNN, TFLite against TFLite, ORT's QNN EP against itself),
both rows wholly on the NPU; a model's measured speedup on a target is the median of those per-runtime ratios. A
ratio of two runtimes' latencies would mix the runtimes' own speed into the precision's (ViT on 8 Elite: w8a8 by
TFLite only, 3.365 ms, fp16 median by QNN, 5.300 ms: 1.58x; TFLite against TFLite 1.17x). A model with no runtime
measuring both precisions on a device has no speedup row, and the benchmark says so. Each speedup row also prints
the ratio of the two latency rows the fit sees (``rows``): where the runtimes behind them differ, a projection that
met both latency rows exactly would be off the speedup by the ratio of the two (ViT: rows 1.58x on 8 Elite and 1.63x
on 8 Gen 3, TFLite's own 1.17x and 1.25x, so +35% and +30% at best).

Each architecture is rebuilt with random weights at the measured input shape (``silicon_models.py``; torch,
torchvision and transformers are optional, and the benchmark says which is missing), compiled by NpuEP's own
compiler for each target and costed by its cost model, the same path as ``npu-report`` (``kernels/projection.py``).
It prints every row with its error, then per target and precision the median and max |error| and the Spearman rank
correlation across models, and the w8a8/fp16 speedup projected vs measured; ``--fit`` refits each target's
``[projection]`` terms (bounded least squares on relative error, every efficiency in (0, 1], this data only) and
prints the TOML section together with the leave-one-model-out error (each model projected by a fit that never saw
it).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ...kernels.projection import INT_MODES, Terms, Work, project_seconds, terms, timeline_work
from ...kernels.target import Target
from .silicon_llm import scenario_work

CHIPSET_TARGETS = {"qualcomm-snapdragon-8gen3": "snapdragon-8gen3",
                   "qualcomm-snapdragon-8-elite-for-galaxy": "snapdragon-8elite",
                   "qualcomm-snapdragon-8-elite": "snapdragon-8elite",  # the QRD of the LLM rows: the same SoC
                   "qualcomm-snapdragon-x-elite": "snapdragon-xelite"}
LLM_PRECISION = "w4a16"  # the LLM rows' precision whose weights NpuEP's int4 MatMulNBits stores alike
PRECISIONS = ("float", "w8a8")
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "reference" / "npu-measured"


Runs = dict[tuple[str, str, str], dict[tuple[str, str], float]]


def measured_runs(data: Path) -> Runs:
    """(model, precision, target) -> {(device, runtime): measured ms}: the rows wholly on the NPU, by the row rule
    of the module docstring."""
    path = data / "cnn_calibration.csv"
    if not path.is_file():
        raise SystemExit(f"error: no calibration data at {path} (pass --data DIR holding cnn_calibration.csv)")
    runs: Runs = defaultdict(dict)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            target = CHIPSET_TARGETS.get(r["chipset"])
            if (target and r["precision"] in PRECISIONS and r["layers_cpu"] == "0"
                    and r["primary_compute_unit"] == "NPU"):
                runs[(r["model"], r["precision"], target)][(r["device"], r["runtime"])] = float(r["inference_time_ms"])
    return dict(sorted(runs.items()))


def measured_rows(data: Path) -> dict[tuple[str, str, str], float]:
    """(model, precision, target) -> measured ms: the median over the qualifying runtimes (module docstring)."""
    return {k: statistics.median(v.values()) for k, v in measured_runs(data).items()}


def measured_speedups(runs: Runs) -> dict[tuple[str, str], dict]:
    """(model, target) -> the measured w8a8/fp16 speedup by the speedup rule of the module docstring: ``speedup``
    the median of the per-runtime ratios (None when no device and runtime measured both precisions) and
    ``runtimes`` each (device, runtime) pair's own ratio."""
    out = {}
    for m, t in sorted({(k[0], k[2]) for k in runs}):
        fp16, w8a8 = runs.get((m, "float", t), {}), runs.get((m, "w8a8", t), {})
        if not fp16 or not w8a8:
            continue
        per_runtime = {dr: fp16[dr] / w8a8[dr] for dr in sorted(fp16.keys() & w8a8.keys())}
        out[(m, t)] = {"speedup": statistics.median(per_runtime.values()) if per_runtime else None,
                       "runtimes": per_runtime}
    return out


def llm_rows(data: Path) -> dict[tuple[str, str, str], float]:
    """(model, "decode" | "ttft", target) -> measured seconds: a decode step is 1 / tokens_per_second, TTFT the
    shortest prompt's (one prompt-processor window); w4a16 rows of the chipsets above only."""
    path = data / "llm_calibration.csv"
    out: dict[tuple[str, str, str], float] = {}
    if not path.is_file():
        return out
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            target = CHIPSET_TARGETS.get(r["chipset"])
            if target and r["precision"] == LLM_PRECISION:
                out[(r["model"], "decode", target)] = 1.0 / float(r["tokens_per_second"])
                out[(r["model"], "ttft", target)] = float(r["ttft_min_ms"]) * 1e-3
    return out


def model_work(path: Path, target: Target, dims: Mapping[str, int] | None = None) -> Work:
    """The model compiled and costed for ``target`` exactly as ``npu-report`` does (the file's static shapes,
    ``dims`` for symbolic ones), then projected (``timeline_work``). The timeline's ops are remembered beside the
    model per file version, dims and target description (less its fitted terms): a change of the projection needs
    no new compile."""
    memo_path = path.parent / "work.json"
    memo = json.loads(memo_path.read_text()) if memo_path.is_file() else {}
    key = memo_key(path, target, dims)
    if key not in memo:
        memo[key] = _costed_timeline(path, target, dims)
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_path)
    return timeline_work([{"ops": [dict(zip(_OP_FIELDS, op)) for op in ops]} for ops in memo[key]], target)


def memo_key(path: Path, target: Target, dims: Mapping[str, int] | None = None) -> str:
    """The remembered timeline's key: the file's name and version, the dims, and the target's digest less its fitted
    terms (``Target.digest`` is canonical JSON, the op table it inherits included, so every process computes the
    same key; a repr of the op rules was not, their dtype sets print in string-hash order)."""
    unfitted = Target.from_dict({k: v for k, v in target.raw.items() if k != "projection"}, source=target.name)
    return f"v5:{path.name}:{path.stat().st_mtime_ns}:{sorted((dims or {}).items())}:{unfitted.digest}"


_OP_FIELDS = ("op", "unit", "mode", "cycles", "compute_cycles", "dma_bytes", "weight_bytes", "macs")


def _costed_timeline(path: Path, target: Target, dims: Mapping[str, int] | None) -> list[list[list]]:
    """Each partition's ops (program order) with the fields the projection reads."""
    from ..report.build import build_report

    doc = build_report(str(path), target=target.name, dims=dims, check=False)
    claimed, total = doc["file_coverage"]["claimed"], doc["file_coverage"]["total"]
    if claimed != total:
        print(f"  note: {path.name} on {target.name}: {claimed}/{total} nodes on the NPU; the projection covers "
              "those only", file=sys.stderr)
    return [[[op.get(f) for f in _OP_FIELDS] for op in partition["ops"]] for partition in doc["timeline"]]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):
            tie = x == v
            r[tie] = r[tie].mean()
        return r
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |a c - y| over c >= 0, exactly: the optimum is the unconstrained least squares on some subset of the
    columns with the others at 0, so every subset is tried (7 columns: 127 subsets)."""
    best, best_res = np.zeros(a.shape[1]), np.inf
    for k in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), k):
            c_sub, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if np.any(c_sub < 0):
                continue
            c = np.zeros(a.shape[1])
            c[list(subset)] = c_sub
            res = float(np.sum((a @ c - y) ** 2))
            if res < best_res:
                best, best_res = c, res
    return best


def _features(work: Work, dram_bound: bool) -> np.ndarray:
    """The projection's terms for ``work`` on the side it is bound by (``kernels/projection.py``)."""
    f = np.zeros(7)  # Terms' order: graph, op, float matrix, int matrix, vector, dram, unpack
    f[0] = 1.0
    if dram_bound:
        f[5] = sum(n * op.dram_s for op, n in work.ops)
    else:
        f[1] = work.count
        for i, k in ((2, "float_matrix_s"), (3, "int_matrix_s"), (4, "vector_s"), (6, "unpack_s")):
            f[i] = sum(n * getattr(op, k) for op, n in work.ops)
    return f


# Lower bounds of the fitted terms in Terms' order: overheads >= 0; every efficiency in (0, 1], i.e. at least one
# second per second of peak work (a unit never beats its datasheet rate).
LOWER_BOUNDS = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])


def fit(works: Sequence[Work], measured_s: Sequence[float], rounds: int = 50) -> Terms:
    """The terms minimising the squared relative error, each at or above its ``LOWER_BOUNDS`` (a term the data
    does not call for stays at its bound: that unit at its peak). The max() of compute and DRAM makes the
    projection piecewise linear: each round puts every model on the side the current terms say it is bound by and
    solves the bounded least squares of that linear model, until no model changes side. Starts: every unit at its
    peak (the sides as on paper), the compute terms fitted to every model, and those with DRAM priced by the rows
    compute alone leaves furthest below their measurement; the one ending with the smallest error is kept."""
    m = np.asarray(measured_s)
    y = np.ones(len(works))

    def solve(sides: Sequence[bool]) -> Terms:
        a = np.array([_features(w, b) for w, b in zip(works, sides)]) / m[:, None]
        return Terms(*(LOWER_BOUNDS + _nnls(a, y - a @ LOWER_BOUNDS)))

    def refine(t: Terms) -> Terms:
        for _ in range(rounds):
            sides = [t.dram_bound(w) for w in works]
            t = solve(sides)
            if sides == [t.dram_bound(w) for w in works]:
                break
        return t

    def residual(t: Terms) -> float:
        return float(sum((project_seconds(w, t) / ms - 1) ** 2 for w, ms in zip(works, m)))

    compute_only = solve([False] * len(works))
    at_peak = [Terms().dram_s(w) for w in works]
    shortfall = [(ms - compute_only.graph_s) / d for w, ms, d in zip(works, m, at_peak)
                 if d > 0 and project_seconds(w, compute_only) < ms / 2]
    starts = [Terms(), compute_only]
    if shortfall:
        starts.append(dataclasses.replace(compute_only, dram=max(1.0, float(np.median(shortfall)))))
    return min((refine(t) for t in starts), key=residual)


def terms_of(t: Terms, target: Target) -> dict:
    """Fitted terms as the target's [projection] section."""
    eff = {m: 1.0 / (t.int_matrix if m in INT_MODES else t.float_matrix) for m in target.matrix["macs_per_cycle"]}
    return {"graph_overhead_us": t.graph_s * 1e6, "op_overhead_us": t.op_s * 1e6, "matrix_efficiency": eff,
            "vector_efficiency": 1.0 / t.vector, "dram_efficiency": 1.0 / t.dram,
            "int4_unpack_efficiency": 1.0 / t.unpack}


def summarize(rows: Sequence[Mapping]) -> list[dict]:
    """Per (target, precision): rows, median and max |error|, Spearman rank correlation across models."""
    out = []
    for (t, p), grp in itertools.groupby(sorted(rows, key=lambda r: (r["target"], r["precision"])),
                                         key=lambda r: (r["target"], r["precision"])):
        g = list(grp)
        errs = [abs(r["error"]) for r in g]
        out.append({"target": t, "precision": p, "rows": len(g), "median_abs_error": statistics.median(errs),
                    "max_abs_error": max(errs),
                    "spearman": spearman([r["measured_ms"] for r in g], [r["projected_ms"] for r in g])})
    return out


def speedups(rows: Sequence[Mapping], measured: Mapping[tuple[str, str], Mapping]) -> list[dict]:
    """fp16 over w8a8 latency, projected (from the rows) vs measured (``measured_speedups``), for each model and
    target with both precisions projected; ``measured`` None (and no error) where no runtime measured both, ``rows``
    the ratio of the two measured latency rows (what the fit is given)."""
    by = {(r["model"], r["precision"], r["target"]): r for r in rows}
    out = []
    for (m, t), meas in sorted(measured.items()):
        f, q = by.get((m, "float", t)), by.get((m, "w8a8", t))
        if f is None or q is None:
            continue
        proj, ratio = f["projected_ms"] / q["projected_ms"], meas["speedup"]
        out.append({"model": m, "target": t, "measured": ratio, "projected": proj,
                    "error": None if ratio is None else proj / ratio - 1,
                    "rows": f["measured_ms"] / q["measured_ms"], "runtimes": _runtime_labels(meas["runtimes"])})
    return out


def _runtime_labels(per_run: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """{(device, runtime): ratio} keyed by the runtime alone, or "device/runtime" where a target holds more
    than one device."""
    one_device = len({device for device, _ in per_run}) <= 1
    return {(runtime if one_device else f"{device}/{runtime}"): r for (device, runtime), r in per_run.items()}


def _print_speedups(sp: Sequence[Mapping]) -> None:
    print("\nw8a8 / fp16 speedup, projected vs measured (measured: fp16 over w8a8 on the same device and runtime, the "
          "median over runtimes)")
    for s in sp:
        head = f"  {s['model']:<20}{s['target']:<19}"
        if s["measured"] is None:
            print(f"{head} no row: no runtime measured both precisions on the NPU (projected {s['projected']:.2f}x)")
            continue
        each = ", ".join(f"{rt} {r:.2f}x" for rt, r in s["runtimes"].items())
        print(f"{head} measured {s['measured']:.2f}x  projected {s['projected']:.2f}x  error {s['error']:+.1%}"
              f"  ({each}; latency rows {s['rows']:.2f}x)")


def evaluate(works: Mapping[tuple[str, str, str], Work], measured: Mapping[tuple[str, str, str], float],
             coeffs: Mapping[str, Sequence[float]]) -> list[dict]:
    rows = []
    for (m, p, t), ms in measured.items():
        if (m, p, t) in works:
            proj = project_seconds(works[(m, p, t)], coeffs[t]) * 1e3
            rows.append({"model": m, "precision": p, "target": t, "measured_ms": ms, "projected_ms": proj,
                         "error": proj / ms - 1})
    return rows


def leave_one_model_out(works, measured, targets: Iterable[str]) -> list[dict]:
    """Each model projected by a fit on the other models only (per target): the error to expect on a model the
    fit never saw."""
    rows = []
    for t in targets:
        keys = [k for k in measured if k[2] == t and k in works]
        for model in sorted({k[0] for k in keys}):
            train = [k for k in keys if k[0] != model]
            if not train:  # one model only: nothing to fit it on
                continue
            c = fit([works[k] for k in train], [measured[k] * 1e-3 for k in train])
            rows += evaluate({k: works[k] for k in keys if k[0] == model},
                             {k: measured[k] for k in keys if k[0] == model}, {t: c})
    return rows


def _print_rows(title: str, rows: Sequence[Mapping]) -> None:
    print(f"\n{title}")
    print(f"{'model':<20}{'precision':<10}{'target':<19}{'measured ms':>12}{'projected ms':>14}{'error':>9}")
    for r in sorted(rows, key=lambda r: (r["target"], r["precision"], r["model"])):
        print(f"{r['model']:<20}{r['precision']:<10}{r['target']:<19}{r['measured_ms']:>12.3f}"
              f"{r['projected_ms']:>14.3f}{r['error']:>+9.1%}")


def _print_summary(title: str, rows: Sequence[Mapping]) -> list[dict]:
    summary = summarize(rows)
    print(f"\n{title}")
    for s in summary:
        print(f"  {s['target']:<19}{s['precision']:<7} rows {s['rows']:>2}  median |error| "
              f"{s['median_abs_error']:6.1%}  max {s['max_abs_error']:6.1%}  Spearman {s['spearman']:.2f}")
    return summary


def toml_section(terms: Mapping, summary: Sequence[Mapping]) -> str:
    def value(v):
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{k} = {x:.4g}" for k, x in v.items()) + " }"
        return f"{v:.4g}"
    lines = ["[projection]",
             "# fitted by `python -m npu_ep.tools.bench.silicon --fit` on shared/reference/npu-measured"]
    lines += [f"{k} = {value(v)}" for k, v in terms.items()]
    worst = max(s["max_abs_error"] for s in summary)
    med = statistics.median(s["median_abs_error"] for s in summary)
    rows = sum(s["rows"] for s in summary)
    lines.append(f"calibration = {{ median_error = {med:.3f}, max_error = {worst:.3f}, rows = {rows} }}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.silicon", description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding cnn_calibration.csv")
    ap.add_argument("--cache", type=Path, default=None, help="where the rebuilt models are kept "
                    "(default: the user cache dir's npu_ep_silicon)")
    ap.add_argument("--targets", default=",".join(dict.fromkeys(CHIPSET_TARGETS.values())))
    ap.add_argument("--models", default=None, help="comma-separated subset of the calibration models")
    ap.add_argument("--fit", action="store_true", help="refit each target's [projection] terms and print them")
    ap.add_argument("--no-llm", action="store_true", help="leave out the LLM rows (their 1B/3B-wide decoders take "
                    "a few GB of disk and minutes to build once)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from .silicon_models import INPUT_SHAPES, SiliconModelsUnavailable, model_path

    cache = args.cache or _default_cache()
    targets = [t for t in args.targets.split(",") if t]
    models = args.models.split(",") if args.models else list(INPUT_SHAPES)
    runs = {k: v for k, v in measured_runs(args.data).items() if k[2] in targets and k[0] in models}
    measured = {k: statistics.median(v.values()) for k, v in runs.items()}
    works: dict[tuple[str, str, str], Work] = {}
    try:
        for m, p, t in measured:
            works[(m, p, t)] = model_work(model_path(m, p, cache), Target.load(t))
    except SiliconModelsUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    if not args.no_llm:
        llm = {k: v * 1e3 for k, v in llm_rows(args.data).items() if k[2] in targets}
        for m, t in sorted({(k[0], k[2]) for k in llm}):
            for scenario, w in scenario_work(m, Target.load(t), cache, model_work).items():
                works[(m, scenario, t)] = w
        measured.update(llm)
    if args.fit:
        coeffs = {t: fit([works[k] for k in works if k[2] == t], [measured[k] * 1e-3 for k in works if k[2] == t])
                  for t in targets}
    else:
        coeffs = {t: terms(Target.load(t)) for t in targets}
    rows = evaluate(works, measured, coeffs)
    _print_rows("Projected vs measured (every row)", rows)
    summary = _print_summary("Calibration error (in-sample: the rows the terms were fitted on)", rows)
    loo = leave_one_model_out(works, measured, targets)
    loo_summary = _print_summary("Leave-one-model-out error (each model projected by a fit that never saw it)", loo)
    for r in rows:
        if r["precision"] == "decode":
            print(f"  {r['model']} on {r['target']}: {1e3 / r['measured_ms']:.1f} tokens/s measured, "
                  f"{1e3 / r['projected_ms']:.1f} projected "
                  f"({1e3 / r['projected_ms'] / (1e3 / r['measured_ms']) - 1:+.1%})")
    sp = speedups(rows, measured_speedups(runs))
    _print_speedups(sp)
    if args.fit:
        for t in targets:
            print(f"\n# {t}\n" + toml_section(terms_of(coeffs[t], Target.load(t)),
                                                [s for s in summary if s["target"] == t]))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary, "leave_one_model_out": loo,
                                         "leave_one_model_out_summary": loo_summary, "speedups": sp,
                                         "terms": {t: terms_of(c, Target.load(t)) for t, c in coeffs.items()}},
                                        indent=1))
    return 0


def _default_cache() -> Path:
    """Beside, not inside, the compiled-context cache (whose folder ``npu-cache`` owns)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("npu_ep_silicon", appauthor=False))


if __name__ == "__main__":
    sys.exit(main())
