"""Where one call of a compiled program spends its host time: per op kind, the kernels' total and the part inside
the native kernels (the extension's entry points, timed by wrapping them), the rest being the kernels' Python and
numpy; plus the program's own per-call cost (the call minus its steps).

Used by ``python -m npu_ep.tools.bench.llm --profile``. Timing replays the program's steps on recorded inputs
(the hot path's loop, no observation); each figure is the mean of the fastest quarter of the repeats, which keeps
a shared machine's preemptions out of it. ``loop_profile`` instead times the steps inside real calls (the C++
loop with its bound native steps, on ORT's threads), as means over the calls.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...ep.program import Program
from ...kernels.runtime import native_module


@dataclasses.dataclass
class OpTime:
    op: str
    steps: int
    total_us: float
    native_us: float

    @property
    def python_us(self) -> float:
        return self.total_us - self.native_us


@dataclasses.dataclass
class CallProfile:
    call_us: float            # program(*inputs), hot path
    steps_us: float           # its steps timed one by one, summed per call (same statistic as call_us)
    ops: list[OpTime]         # by total time, largest first


def fast_quarter_us(samples_ns: Sequence[int]) -> float:
    """Mean of the fastest quarter, in microseconds."""
    s = sorted(samples_ns)
    return float(np.mean(s[: max(1, len(s) // 4)])) / 1e3


@contextlib.contextmanager
def _native_timer(acc: list[int]) -> Iterator[None]:
    """Adds the time spent in the native kernels' entry points to ``acc[0]`` while active."""
    mod = native_module()
    names = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))] if mod is not None else []
    real = {n: getattr(mod, n) for n in names}

    def timed(fn: Callable) -> Callable:
        def call(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                acc[0] += time.perf_counter_ns() - t0
        return call

    for n, fn in real.items():
        setattr(mod, n, timed(fn))
    try:
        yield
    finally:
        for n, fn in real.items():
            setattr(mod, n, fn)


def _timed_steps(program: Program, inputs: Sequence[np.ndarray], acc: list[int]) -> list[tuple[int, int]]:
    env: list = [None] * (program.n_slots + 1)
    env[: len(inputs)] = inputs
    times = []
    with np.errstate(all="ignore"):
        for st in program.steps:
            args = tuple(env[s] for s in st.in_slots)
            acc[0] = 0
            t0 = time.perf_counter_ns()
            outs = st.kernel.run(st.prepared, args)
            times.append((time.perf_counter_ns() - t0, acc[0]))
            for i, slot in enumerate(st.out_slots):
                if slot >= 0:
                    env[slot] = outs[i]
            for slot in st.release:
                env[slot] = None
    return times


def profile_call(program: Program, inputs: Sequence[np.ndarray], repeats: int = 200) -> CallProfile:
    """Profile one call of ``program`` on ``inputs`` (in the program's order, of a signature it has seen, so calls
    take the hot path, which takes ORT's order)."""
    ort_order = list(inputs)
    for j, i in enumerate(program._input_perm or ()):
        ort_order[i] = inputs[j]
    for _ in range(20):
        program(*ort_order)
    calls = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        program(*ort_order)
        calls.append(time.perf_counter_ns() - t0)
    acc = [0]
    with _native_timer(acc):
        for _ in range(10):
            _timed_steps(program, inputs, acc)
        runs = [_timed_steps(program, inputs, acc) for _ in range(repeats)]
    per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for step, samples in zip(program.steps, zip(*runs)):
        row = per_op[step.op]
        row[0] += 1
        row[1] += fast_quarter_us([t for t, _ in samples])
        row[2] += fast_quarter_us([n for _, n in samples])
    ops = [OpTime(op, int(n), total, native) for op, (n, total, native) in per_op.items()]
    steps = fast_quarter_us([sum(t for t, _ in run) for run in runs])
    return CallProfile(fast_quarter_us(calls), steps, sorted(ops, key=lambda o: -o.total_us))


@dataclasses.dataclass
class LoopTime:
    op: str
    kind: str                 # the bound native step's type (MemoStep, ViewStep, CallStep, ...) or "Python kernel"
    steps: int
    us_per_call: float


def loop_profile(program: Program, call: Callable[[], Any], repeats: int = 200) -> list[LoopTime]:
    """Mean time per call of ``program``'s steps, by op and kind of step, over ``repeats`` calls of ``call`` (which
    must reach the program through its hot path with one input-shape signature, e.g. ``session.run``)."""
    loops = dict(program._bound)
    for loop in loops.values():
        loop.set_profile(True)
    try:
        for _ in range(repeats):
            call()
        sums = {sig: list(loop.step_ns) for sig, loop in loops.items()}
    finally:
        for loop in loops.values():
            loop.set_profile(False)
    ran = [(sig, ns) for sig, ns in sums.items() if any(ns)]
    if len(ran) != 1:
        raise RuntimeError(f"loop_profile: {len(ran)} bound signatures ran, expected one")
    sig, ns = ran[0]
    rows: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0])
    for step, native, t in zip(program.steps, program._bindings[sig], ns):
        row = rows[(step.op, type(native).__name__ if native is not None else "Python kernel")]
        row[0] += 1
        row[1] += t
    times = [LoopTime(op, kind, n, t / repeats / 1e3) for (op, kind), (n, t) in rows.items()]
    return sorted(times, key=lambda r: -r.us_per_call)
