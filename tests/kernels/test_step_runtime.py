"""The seam between a program and its kernels (``kernels.registry.StepRuntime``, ``kernels.runtime``): what the
program tells a step travels in a typed record, not in ``Prepared.kernel_cache`` keys or serialized attributes, and a
bound native step declines once the record's generation moves (the C++ guard reads the counter in place)."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.kernels import runtime
from npu_ep.kernels.registry import Prepared, StepRuntime
from tests.ep.test_subprogram_kernels import _feeds, _session, _sub_steps, loop_with_if_model

FRAMEWORK_KEYS = {"runtime", "partition_outputs", "dma_counts", "subprograms", "derived_consts"}


def test_the_generation_moves_only_when_a_guarded_field_changes():
    rt = StepRuntime()
    seen = [rt.generation]
    rt.kernels, rt.threads = "native", 1  # the defaults again: nothing a bound step depends on changed
    rt.partition_outputs = {0: 1}
    seen.append(rt.generation)
    rt.partition_outputs = {0: 1}  # an equal mapping: the bound steps' ORT indices still hold
    rt.dma_counts = []
    seen.append(rt.generation)
    rt.const_shapes = {1: (4, 4)}  # not guarded: a native step does not depend on it
    rt.kernels = "reference"
    seen.append(rt.generation)
    assert seen == [0, 1, 2, 3]


def test_a_prepared_outside_a_program_runs_native_on_one_thread():
    p = Prepared({})
    assert (p.runtime.kernels, runtime.threads(p), runtime.counting_dma(p)) == ("native", 1, False)
    runtime.configure([p], "reference", 3)
    assert runtime.native(p) is None and runtime.threads(p) == 3


@pytest.mark.skipif(runtime.extension() is None, reason="native extension not built")
def test_a_call_step_declines_once_its_generation_moves():
    p = Prepared({})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    step = runtime.call_step(p, np.negative, (None,), [(0, 0, np.float32, x.shape, None)], [(-1, None)])
    np.testing.assert_array_equal(step.run((x,))[0], -x)
    p.runtime.threads = 2  # what the step was bound under changed
    assert step.run((x,)) is None
    assert runtime.guard(p) == (p.runtime.counter, 1)


def test_a_sessions_steps_keep_only_their_own_caches_in_memo():
    """After a run with sub-programs (Loop body, If branches), no step's kernel_cache holds a framework key and no
    step's attributes hold the constant shapes: they are the step's record and the step's field."""
    sess, program = _session(loop_with_if_model(), {"kernels": "native"})
    sess.run(None, _feeds(True))
    steps = [*program.steps, *_sub_steps(program.steps)]
    assert len(steps) > len(program.steps)  # sub-programs were loaded (into the owner's record)
    for st in steps:
        assert not FRAMEWORK_KEYS & set(st.prepared.kernel_cache), st.node_name
        assert "_const_shapes" not in st.prepared.attrs, st.node_name
        assert st.prepared.runtime.kernels == "native"
    assert any(st.const_shapes for st in steps)
    assert any(st.prepared.runtime.partition_outputs for st in program.steps)
