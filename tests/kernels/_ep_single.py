"""Test helper: one ONNX node through a real NpuEP session (ORT's graph assignment proves NpuEP ran it) and
through the kernel alone (``_vector_ortref.check_against_ort``: attrs JSON round trip, cost), both against ORT's
CPU EP. The session lists only NpuEP, and the assignment is asserted, so a silent CPU fallback fails the test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from _vector_ortref import assert_close, check_against_ort, feeds_of, make_model, run_ort
from npu_testing import assignment, npu_session


def check_on_ep(op: str, inputs, outputs: Sequence[tuple], attrs: Mapping[str, Any] | None = None, *,
                opset: int = 21, tol: tuple[float, float] | None = None,
                targets: Sequence[str] = ("npu-ref",), domain: str = "", kernel: bool = True) -> list[np.ndarray]:
    """Compare the kernel and an NpuEP session per target with ORT's CPU EP; returns ORT's outputs."""
    if kernel:
        check_against_ort(op, inputs, outputs, attrs, domain=domain, opset=opset, tol=tol, target=targets[0])
    model = make_model(op, inputs, outputs, attrs, domain=domain, opset=opset)
    feeds = feeds_of(inputs)
    want = run_ort(model, feeds)
    for target in targets:
        sess = npu_session(model, {"target": target}, cpu=False)
        ran = assignment(sess)
        assert set(ran.values()) == {"NpuEP"}, f"{op} on {target}: {ran}"
        for i, (g, w) in enumerate(zip(sess.run(None, feeds), want)):
            assert_close(g, w, tol, f"{op} on {target} output {i}")
    return want


def declined_by(op: str, inputs, outputs: Sequence[tuple], attrs: Mapping[str, Any] | None = None, *,
                opset: int = 21, target: str = "npu-edge") -> str | None:
    """The reason ``target`` declines this node (None if it takes it)."""
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target
    (node,) = nodes_from_model(make_model(op, inputs, outputs, attrs, opset=opset))
    return why_not(node, Target.load(target))
