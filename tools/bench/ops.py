"""Op-by-op speed table: every (op, dtype) the target lists and every fused group, NpuEP against ORT's CPU EP.

    python -m npu_ep.tools.bench.ops [--ops Erf,Conv] [--sizes small,medium] [--json OUT] [--check] [--quick]

The performance twin of the correctness tests (issue 40 item 1). The case list is generated from the target's op
list (``tools/bench/op_cases.py``), so a new op of the target gets its rows by itself; an op without a builder is a
row saying so. Each case is a one-node (or one-group) model at three sizes from real models (small: per-call cost;
medium: 56x56 maps, 128-token sequences; large: 1500-frame audio, LLM widths), run in this process on a NpuEP
session and a CPU EP session, both with default options (NpuEP's on-disk cache off: it changes session creation
only), timed after warm-up (``tools/bench/timing.py``): in alternating blocks, or for the small rows (a few
microseconds a call) taking turns call by call, so both EPs see the host's slow phases alike.

Each row says whether NpuEP ran the case (ORT's graph assignment; a declined node gives the capability's reason)
and which steps of the compiled program ran as Python kernels instead of bound native steps, with the reason: no
native binding for the op, a binding that refused these inputs (with its debug message when it raised), or an op
never bound (control flow). ``--check`` exits 1 when a row is above the targets (medium and large: NpuEP / CPU EP
<= 1.5; small: at most 3 us slower), the median ratio is above 1.0, a Python step has no stated reason, or a case
failed to build or run; rows without a builder and declined cases (an Identity alone, by design) are counted in the
summary, not failed.

A medium or large row's ratio is the median of its rounds' ratios (each round: one block of each EP, back to back),
so one block in a slow phase of the host moves one round, not the row. Defaults keep a full run (about 1250 rows)
near 15 minutes on a 2-core host: three rounds, each block at most ``--block-s`` of calls, and a 0.1 s settle before
each block (ORT's spinning workers stop within 50 ms; the 0.25 s of ``timing.SETTLE_S`` would add 13 minutes over
the table); a small row takes 0.02 s of calls taken in turns, without settles (it starts no parallel section).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import onnxruntime as ort

from ...kernels.target import Target
from .op_cases import SIZES, Case, cases
from .timing import alternating_blocks, block_ratios, interleaved_calls, medians

SMALL_SLACK_US = 3.0
RATIO_TARGET = 1.5
MEDIAN_TARGET = 1.0


@dataclasses.dataclass
class Row:
    op: str
    dtype: str
    size: str
    status: str                       # "ok", "gap", "declined", "partial", "error"
    note: str = ""                    # the gap, the decline reason or the error
    npu_us: float | None = None
    cpu_us: float | None = None
    nodes: str = ""                   # "k/n" nodes of the optimized graph on NpuEP
    python_steps: list[dict[str, str]] = dataclasses.field(default_factory=list)  # {"op", "node", "reason"}
    steps: list[str] = dataclasses.field(default_factory=list)  # the compiled programs' step ops, in order
    calls: int = 0                    # timed calls per EP
    round_ratios: list[float] = dataclasses.field(default_factory=list)  # per round of blocks (medium, large)

    @property
    def ratio(self) -> float | None:
        """The median round's ratio where rounds of blocks were timed (one block in a slow phase of the host moves
        one round), else the ratio of the median calls."""
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return self.npu_us / self.cpu_us if self.npu_us and self.cpu_us else None

    @property
    def delta_us(self) -> float | None:
        return self.npu_us - self.cpu_us if self.npu_us is not None and self.cpu_us is not None else None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio, "delta_us": self.delta_us}


@dataclasses.dataclass
class Timing:
    rounds: int = 3           # medium and large rows: the ratio is the median round's
    block_s: float = 0.05     # a block runs at most this long (at least 2 calls)
    max_calls: int = 100      # calls per block at most
    settle_s: float = 0.1
    small_calls: int = 1000   # small rows: calls per EP, taking turns call by call


# -- sessions -------------------------------------------------------------------------------------------------------

def npu_session(case: Case) -> ort.InferenceSession:
    """NpuEP first with default options (on-disk cache off), the CPU EP behind it for what NpuEP declines."""

    from ...ep.sessions import tag_session_options

    so = ort.SessionOptions()
    tag_session_options(so)
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return ort.InferenceSession(case.model.SerializeToString(), so, enable_fallback=0,
                                providers=[(get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"])


def cpu_session(case: Case) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ep_session(sess: ort.InferenceSession):
    from ...ep.sessions import session_of

    return session_of(sess)


def placement(sess: ort.InferenceSession) -> tuple[int, int, str]:
    """(nodes on NpuEP, nodes in the optimized graph, the first decline reason NpuEP gave or "")."""

    on = total = 0
    for sg in sess.get_provider_graph_assignment_info():
        n = len(sg.get_nodes())
        total += n
        on += n if sg.ep_name == get_ep_name() else 0
    reasons = [d.reason for _, cap in _ep_session(sess).capabilities for d in cap.declined if d.reason]
    return on, total, reasons[0] if reasons else ""


# -- Python steps -----------------------------------------------------------------------------------------------

def step_reason(op: str, kernel: Any) -> str:
    """Why a step has no bound native step (it ran its Python kernel). A binding that raised is logged at debug
    level by the program ("no native step for ..."; NpuEP option log_level=debug shows it)."""
    from ...ep import step_binding

    if op in step_binding.NEVER:
        return "never bound: control flow or a random op"
    if kernel.bind is None and op not in step_binding.VIEWS and op not in step_binding.SHAPE_ONLY:
        return "no native binding for this op (its kernel has no bind)"
    return "binding refused these inputs (bind returned None or raised)"


def python_steps(sess: ort.InferenceSession) -> list[dict[str, str]]:
    """The steps that ran their Python kernel in the signatures the session's programs bound."""
    out = []
    for program in _ep_session(sess).programs.values():
        # no step bound: the program keeps no signature's bindings and every step runs its kernel
        for natives in list(program._bindings.values()) or [[None] * len(program.steps)]:
            for step, native in zip(program.steps, natives):
                if native is None:
                    out.append({"op": step.op, "node": step.node_name,
                                "reason": step_reason(step.op, step.kernel)})
    return out


# -- one case -----------------------------------------------------------------------------------------------------

def fused(key: str, steps: Sequence[str]) -> bool:
    """Whether a group row's group formed: an ``npu::`` op is among the steps; ``group::A+B`` compiled to A alone
    (B folded into it). Other rows are single ops: True."""
    if key.startswith("npu::"):
        return key in steps
    if key.startswith("group::"):
        return list(steps) == [key.split("::", 1)[1].split("+")[0]]
    return True


def _calls_per_block(fns: dict[str, Callable[[], object]], timing: Timing) -> int:
    """Warm both up; as many calls as fit ``block_s`` for the slower one (2 .. max_calls)."""
    slowest = 0.0
    for fn in fns.values():
        fn()
        t0 = time.perf_counter()
        fn()
        slowest = max(slowest, time.perf_counter() - t0)
    return max(2, min(timing.max_calls, int(timing.block_s / max(slowest, 1e-7))))


def measure(case: Case, timing: Timing) -> Row:
    """Time one case on both EPs (alternating) and record where it ran and its Python steps."""
    row = Row(case.op, case.dtype, case.size, "gap", case.gap)
    if case.gap:
        return row
    try:
        npu = npu_session(case)
        cpu = cpu_session(case)
        fns = {"npu": lambda: npu.run(None, case.feeds),  # noqa: F821 - ruff reads the del below as unbinding
               "cpu": lambda: cpu.run(None, case.feeds)}  # noqa: F821 - the same
        per_block = _calls_per_block(fns, timing)
    except Exception as exc:  # noqa: BLE001 - a case that cannot run is a row saying why
        row.status, row.note = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        return row
    on, total, reason = placement(npu)
    row.nodes = f"{on}/{total}"
    if on == 0:  # nothing of NpuEP's to time
        row.status, row.note = "declined", f"declined: {reason or 'no node on NpuEP (reason not recorded)'}"
        return row
    if on < total:
        row.status, row.note = "partial", f"declined in part: {reason}"
    else:
        row.status = "ok"
    row.python_steps = python_steps(npu)
    row.steps = [st.op for p in _ep_session(npu).programs.values() for st in p.steps]
    if not fused(case.op, row.steps):  # the group the row is for did not form
        row.note = f"not fused: compiled as {' + '.join(row.steps)}" + (f"; {row.note}" if row.note else "")
    if case.size == "small":  # a few microseconds a call: the host's phases would decide blocks
        blocks, row.calls = interleaved_calls(fns, timing.small_calls), timing.small_calls
    else:
        blocks = alternating_blocks(fns, per_block * timing.rounds, timing.rounds, timing.settle_s, warmup=False)
        row.calls, row.round_ratios = per_block * timing.rounds, block_ratios(blocks, "npu", "cpu")
    med = medians(blocks)
    row.npu_us, row.cpu_us = med["npu"] * 1e6, med["cpu"] * 1e6
    del npu, cpu, fns
    gc.collect()
    return row


# -- targets ----------------------------------------------------------------------------------------------------

def above_target(row: Row) -> str:
    """Why ``row`` misses its target, or ""."""
    if row.status == "error":
        return row.note or row.status
    if row.ratio is None:  # a gap or a declined case: listed, not timed
        return ""
    if row.size == "small":
        return f"+{row.delta_us:.1f} us > +{SMALL_SLACK_US:g} us" if row.delta_us > SMALL_SLACK_US else ""
    return f"{row.ratio:.2f}x > {RATIO_TARGET:g}x" if row.ratio > RATIO_TARGET else ""


def median_ratio(rows: Iterable[Row]) -> float | None:
    """Over the rows NpuEP ran (a declined row has no NpuEP time)."""
    ratios = [r.ratio for r in rows if r.ratio is not None and r.status in ("ok", "partial")]
    return statistics.median(ratios) if ratios else None


def check(rows: Sequence[Row]) -> list[str]:
    """Every failure of the table's targets, one line each (empty: it passes)."""
    out = [f"{r.op} {r.dtype} {r.size}: {why}" for r in rows if (why := above_target(r))]
    out += [f"{r.op} {r.dtype} {r.size}: Python step {s['op']} ({s['node']}) without a reason"
            for r in rows for s in r.python_steps if not s.get("reason")]
    med = median_ratio(rows)
    if med is not None and med > MEDIAN_TARGET:
        out.append(f"median ratio {med:.2f}x > {MEDIAN_TARGET:g}x")
    return out


# -- output -----------------------------------------------------------------------------------------------------

HEADER = f"{'op':<44} {'dtype':<8} {'size':<6} {'NpuEP us':>10} {'CPU EP us':>10} {'ratio':>7} {'+us':>9}  python steps"


def format_row(row: Row) -> str:
    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    if row.status in ("gap", "declined", "error"):
        tail = row.note
    else:
        tail = "; ".join(f"{s['op']}: {s['reason']}" for s in row.python_steps) or "none"
        if row.note:
            where = f"{row.nodes} on NpuEP: " if row.status == "partial" else ""
            tail = f"[{where}{row.note}] {tail}"
    return (f"{row.op:<44} {row.dtype:<8} {row.size:<6} {num(row.npu_us, '10.1f')} {num(row.cpu_us, '10.1f')} "
            f"{num(row.ratio, '7.2f')} {num(row.delta_us, '+9.1f')}  {tail}")


def summary(rows: Sequence[Row], worst: int = 15) -> dict[str, Any]:
    timed = [r for r in rows if r.ratio is not None]
    failing = [r for r in rows if above_target(r)]

    def badness(r: Row) -> float:
        return r.delta_us / SMALL_SLACK_US if r.size == "small" else r.ratio / RATIO_TARGET

    return {"rows": len(rows), "timed": len(timed), "above_target": len(failing),
            "gaps": sum(r.status == "gap" for r in rows), "declined": sum(r.status == "declined" for r in rows),
            "partial": sum(r.status == "partial" for r in rows), "errors": sum(r.status == "error" for r in rows),
            "with_python_steps": sum(bool(r.python_steps) for r in timed),
            "median_ratio": median_ratio(rows),
            "worst": [f"{r.op} {r.dtype} {r.size}" for r in sorted(timed, key=badness, reverse=True)[:worst]]}


def write_json(path: str, rows: Sequence[Row], target: str, timing: Timing) -> None:
    doc = {"target": target, "timing": dataclasses.asdict(timing), "targets": {
        "small_slack_us": SMALL_SLACK_US, "ratio": RATIO_TARGET, "median_ratio": MEDIAN_TARGET},
        "summary": summary(rows), "rows": [r.to_json() for r in rows]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def run_table(target: Target, sizes: Sequence[str], ops: set[str] | None, timing: Timing,
              on_row: Callable[[Row], None] = lambda r: None) -> list[Row]:
    rows = []
    for make in cases(target, tuple(sizes), ops):
        row = measure(make(), timing)
        rows.append(row)
        on_row(row)
    return rows


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.ops", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="npu-ref")
    ap.add_argument("--ops", default="", help="comma-separated op names or keys (Erf,com.microsoft::Gelu)")
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma-separated among small,medium,large")
    ap.add_argument("--json", default="", help="write the rows and the summary here (rewritten every 25 rows)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a row or the median misses its target")
    ap.add_argument("--quick", action="store_true",
                    help="fewer calls: 20 per block at most, 20 ms blocks, 100 per small row")
    ap.add_argument("--rounds", type=int, default=Timing.rounds, help="rounds of blocks of a medium or large row")
    ap.add_argument("--settle", type=float, default=Timing.settle_s, help="seconds of pause before each block")
    ap.add_argument("--block-s", type=float, default=Timing.block_s, help="seconds of calls per block at most")
    args = ap.parse_args(argv)
    bad = set(args.sizes.split(",")) - set(SIZES)
    if bad:
        ap.error(f"--sizes: unknown {sorted(bad)} (choose among {','.join(SIZES)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    target = Target.load(args.target)
    timing = Timing(rounds=args.rounds, block_s=args.block_s, settle_s=args.settle)
    if args.quick:
        timing.block_s, timing.max_calls, timing.small_calls = 0.02, 20, 100
    ops = {o.strip() for o in args.ops.split(",") if o.strip()} or None
    rows: list[Row] = []
    print(HEADER, flush=True)

    def on_row(row: Row) -> None:
        rows.append(row)
        print(format_row(row), flush=True)
        if args.json and len(rows) % 25 == 0:
            write_json(args.json, rows, target.name, timing)

    run_table(target, args.sizes.split(","), ops, timing, on_row)
    if args.json:
        write_json(args.json, rows, target.name, timing)
    s = summary(rows)
    med = s["median_ratio"]
    print(f"\n{s['rows']} rows: {s['timed']} timed, {s['above_target']} above target, {s['gaps']} without a builder, "
          f"{s['declined']} declined, {s['partial']} partly declined, {s['errors']} errors; "
          f"{s['with_python_steps']} timed rows with Python steps; median ratio "
          f"{'-' if med is None else f'{med:.2f}x'}")
    if not args.check:
        return 0
    failures = check(rows)
    for line in failures:
        print("above target:", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
