"""bench.step_profile: every step is timed once per op kind, numpy-only ops have no native time, the native entry
points are restored afterwards, and profiling leaves the program's results unchanged."""

from __future__ import annotations

import numpy as np

from npu_ep.kernels.runtime import native_module
from npu_ep.tools.bench.step_profile import fast_quarter_us, profile_call
from tests.ep.test_program_call import FEEDS, compiled, div_exp_model


def test_profile_counts_steps_per_op_and_restores_the_native_entry_points():
    program = compiled(div_exp_model())
    before = program(FEEDS["a"], FEEDS["b"])[0]
    mod = native_module()
    entry = {n: getattr(mod, n) for n in dir(mod) if not n.startswith("_")} if mod is not None else {}
    prof = profile_call(program, [FEEDS["a"], FEEDS["b"]], repeats=8)
    assert sorted((o.op, o.steps) for o in prof.ops) == [("Div", 1), ("Exp", 1)]
    assert all(o.native_us == 0 and o.total_us > 0 and o.python_us == o.total_us for o in prof.ops)
    assert prof.call_us > 0 and prof.steps_us > 0
    assert all(getattr(mod, n) is fn for n, fn in entry.items())
    np.testing.assert_array_equal(program(FEEDS["a"], FEEDS["b"])[0], before)
    assert program.calls == 1 + 20 + 8 + 1  # profiling's own program calls are counted like any others


def test_fast_quarter_is_the_mean_of_the_fastest_quarter():
    assert fast_quarter_us([4000, 1000, 3000, 2000, 9000, 8000, 7000, 6000]) == 1.5
    assert fast_quarter_us([5000]) == 5.0
