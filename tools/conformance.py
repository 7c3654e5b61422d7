"""``python -m npu_ep.tools.conformance [--filter REGEX] [--json OUT]``: ONNX's backend conformance suite on NpuEP.

Every case of the installed onnx's backend suite (generated node cases, the ``simple`` and ``pytorch-*`` folders;
``conformance_cases``) runs once on the CPU EP alone and once with NpuEP first (``enable_fallback=0``, ORT's graph
assignment recorded) and is classed (``conformance_run``): NpuEP claimed nothing / claimed and right / claimed and
wrong / errors where the CPU EP runs / both fail, with cases the CPU EP cannot load and cases without data counted
apart. Cases run in a pool of spawned worker processes with a per-case timeout: a case that hangs or kills its
worker is classed with that reason and the pool goes on with a fresh worker. Exit status 1 if any case is wrong or
errors where the CPU EP runs. ``--constant-inputs`` runs every case with its inputs as initializers instead
(``conformance_cases.with_constant_inputs``): the constant-operand paths of NpuEP's kernels.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import wait

from .conformance_cases import EXTRA_SUITES, SUITES, Case, load_cases, with_constant_inputs
from .conformance_run import FAILING_KINDS, KINDS, Outcome, classify, run_cpu

DEFAULT_TIMEOUT_S = 120.0


def run_case(case: Case, report_cpu: Callable[[dict], None] = lambda _: None) -> Outcome:
    """Class one case in this process; ``report_cpu`` hears the CPU EP's result before NpuEP is tried, so a worker
    that dies afterwards is blamed on NpuEP."""
    start = time.perf_counter()
    if case.load_error or not case.data_sets:
        outcome = Outcome(case.key, "no_data", case.load_error or "the case has no test data set")
    else:
        load_error, cpu_outputs, cpu_error = run_cpu(case)
        if load_error is not None:
            outcome = Outcome(case.key, "cpu_cannot_load", load_error)
        else:
            report_cpu({"cpu_ran": cpu_outputs is not None, "cpu_error": cpu_error})
            outcome = classify(case, cpu_outputs, cpu_error)
    outcome.seconds = round(time.perf_counter() - start, 3)
    return outcome


def _serve(conn) -> None:
    """A worker: classes the cases it receives until it receives None."""
    from ..ep.registration import register

    register()  # once per worker process (a no-op where the package's import already did it)

    while (case := conn.recv()) is not None:
        outcome = run_case(case, lambda cpu: conn.send(("cpu", cpu)))
        conn.send(("done", outcome))


class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.case: Case | None = None
        self.started = 0.0
        self.cpu: dict | None = None

    def give(self, case: Case) -> None:
        self.case, self.started, self.cpu = case, time.monotonic(), None
        self.conn.send(case)

    def stop(self, grace_s: float = 0.0) -> None:
        """End the worker: after ``grace_s`` to finish on its own (it was told to), killed."""
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


def run_pool(cases: Sequence[Case], jobs: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S,
             progress: Callable[[Outcome, int, int], None] = lambda *_: None) -> list[Outcome]:
    """Class ``cases`` in ``jobs`` worker processes, ``timeout_s`` per case (from the moment it is handed over)."""
    ctx = multiprocessing.get_context("spawn")
    pending, outcomes = deque(cases), []
    workers = [_Worker(ctx) for _ in range(max(1, min(jobs, len(cases))))]
    try:
        while pending or any(w.case for w in workers):
            for w in workers:
                if w.case is None and pending:
                    w.give(pending.popleft())
            wait([w.conn for w in workers if w.case] + [w.process.sentinel for w in workers if w.case], timeout=0.5)
            for i, w in enumerate(workers):
                done = _collect(w, timeout_s)
                if done is None:
                    continue
                outcomes.append(done)
                progress(done, len(outcomes), len(cases))
                if not w.process.is_alive() or done.extra.get("worker") == "killed":
                    w.stop()
                    workers[i] = _Worker(ctx)
                else:
                    w.case = None
    finally:
        for w in workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.stop(grace_s=2.0)
    return sorted(outcomes, key=lambda o: o.key)


def _collect(w: _Worker, timeout_s: float) -> Outcome | None:
    """The worker's finished outcome, or one made for its case if it died or overran; None while it is working."""
    if w.case is None:
        return None
    try:
        while w.conn.poll():
            tag, payload = w.conn.recv()
            if tag == "cpu":
                w.cpu = payload
            else:
                return payload
    except (EOFError, OSError):
        pass
    if w.process.is_alive() and time.monotonic() - w.started < timeout_s:
        return None
    if w.process.is_alive():
        w.process.kill()
        reason = f"timed out after {timeout_s:g} s"
    else:
        reason = f"worker died (exit code {w.process.exitcode})"
    return _lost(w.case, w.cpu, reason, time.monotonic() - w.started)


def _lost(case: Case, cpu: dict | None, reason: str, seconds: float) -> Outcome:
    """The class of a case whose worker hung or died: before the CPU EP's verdict it is the CPU EP's."""
    if cpu is None:
        kind, message = "cpu_cannot_load", f"{reason} in the CPU EP's session"
    elif cpu["cpu_ran"]:
        kind, message = "npu_error", f"{reason} in NpuEP's session (the CPU EP ran it)"
    else:
        kind, message = "both_fail", f"{reason} in NpuEP's session | CPU EP: {cpu['cpu_error']}"
    return Outcome(case.key, kind, message, seconds=round(seconds, 3), extra={"worker": "killed"})


def summary(outcomes: Iterable[Outcome]) -> dict:
    outcomes = list(outcomes)
    counts = Counter(o.kind for o in outcomes)
    return {"total": len(outcomes), "counts": {k: counts.get(k, 0) for k in KINDS},
            "failing": [o.key for o in outcomes if o.kind in FAILING_KINDS],
            "right_as_the_cpu_ep_not_as_expected": [o.key for o in outcomes
                                                    if o.kind == "right" and o.cpu_matches_expected is False]}


def render(outcomes: Sequence[Outcome]) -> str:
    """The summary, every wrong / erroring case with its message, and the names of the cases counted apart."""
    s = summary(outcomes)
    lines = [f"{s['total']} cases: " + ", ".join(f"{k} {n}" for k, n in s["counts"].items())]
    for kind, title in (("wrong", "claimed and WRONG"), ("npu_error", "NpuEP errors where the CPU EP runs")):
        hits = [o for o in outcomes if o.kind == kind]
        lines.append(f"\n{title}: {len(hits)}")
        lines += [f"  {o.key} [{o.npu_nodes}/{o.nodes} on NpuEP]: {o.message}" for o in hits]
    differ = s["right_as_the_cpu_ep_not_as_expected"]
    lines.append(f"\nclaimed, matching the CPU EP where it differs from ONNX's expected outputs: {len(differ)}")
    lines += [f"  {key}" for key in differ]
    for kind, title in (("both_fail", "both fail"), ("cpu_cannot_load", "the CPU EP cannot load"),
                        ("no_data", "no test data")):
        hits = [o for o in outcomes if o.kind == kind]
        lines.append(f"\n{title}: {len(hits)}")
        lines += [f"  {o.key}: {o.message[:200]}" for o in hits]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_ep.tools.conformance", description=__doc__.split("\n")[0])
    parser.add_argument("--filter", help="regular expression searched in 'suite/name' (e.g. 'node/test_softmax')")
    parser.add_argument("--suites", default=",".join(SUITES),
                        help=f"comma-separated, of {', '.join(SUITES + EXTRA_SUITES)} (default: all but "
                             f"{', '.join(EXTRA_SUITES)})")
    parser.add_argument("--json", help="write every case's outcome and the summary to this file")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--constant-inputs", action="store_true",
                        help="run each case with its tensor inputs as initializers instead (names end in [const])")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress on stderr")
    args = parser.parse_args(argv)
    suites = tuple(s for s in args.suites.split(",") if s)
    unknown = set(suites) - set(SUITES + EXTRA_SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; known: {', '.join(SUITES + EXTRA_SUITES)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the workers inherit it: the machine's cores are shared
    cases = load_cases(suites, args.filter)
    if args.constant_inputs:
        cases = [with_constant_inputs(c) for c in cases]
    start = time.monotonic()

    def progress(outcome: Outcome, done: int, total: int) -> None:
        if not args.quiet:
            print(f"[{done}/{total}] {outcome.kind:15s} {outcome.key} ({outcome.seconds:.1f} s)", file=sys.stderr,
                  flush=True)

    outcomes = run_pool(cases, args.jobs, args.timeout, progress)
    print(render(outcomes))
    print(f"\n{len(outcomes)} cases in {time.monotonic() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary(outcomes), "cases": [o.as_dict() for o in outcomes]}, f, indent=1)
    return 1 if summary(outcomes)["failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
