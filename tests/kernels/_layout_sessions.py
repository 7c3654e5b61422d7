"""Shared by the layout pass's tests (test_layout_pass, test_layout_pools, test_layout_resize): the pass's nodes for
a model, and a session with a ``conv_layout`` mode whose steps are inspected and whose results are the CPU EP's."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import layout
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, npu_session, session_options

REF = Target.load("npu-ref")


def layout_nodes(model, how):
    """The model's fused nodes after the layout pass in mode ``how``."""
    return layout.assign_layouts(fuse_partition(nodes_from_model(model), REF), REF, how)


def layout_session(model, how="nhwc"):
    """(NpuEP session in mode ``how`` holding every node, its compiled steps)."""
    LIVE_SESSIONS.clear()
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, {"conv_layout": how}, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    steps = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    return sess, steps


def matches_cpu(model, how, x, tol=1e-4):
    """The session's outputs for input ``x`` (observed, then on the bound native steps) are the CPU EP's and no step
    ran in Python; its steps."""
    sess, steps = layout_session(model, how)
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = cpu.run(None, {"x": x})
    for _ in range(3):
        got = sess.run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    assert python_steps(sess) == []
    return steps
