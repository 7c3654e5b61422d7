"""bench.bridge: the one-node bridge figures and a native step's loop overhead are measured and printed (no timing
is asserted: the targets are the benchmark's to print)."""

from __future__ import annotations

import math

from npu_ep.tools.bench import bridge


def test_step_overhead_times_a_loop_of_bound_steps():
    r = bridge.step_overhead(steps=4, runs=40)
    assert set(r) == {"loop_overhead_us", "ufunc_step_us"}
    assert all(math.isfinite(v) for v in r.values())


def test_main_prints_the_bridge_and_the_step_overhead(capsys):
    assert bridge.main(["--runs", "20"]) == 0
    out = capsys.readouterr().out
    assert "bridge overhead" in out and "native step loop overhead" in out
