"""The file view (``ep.onnx_graph.nodes_from_model``, what ``npu-report model.onnx`` shows without a session) gives
If/Loop/Scan nodes their graphs and outer-scope inputs as the plugin shim does, so it decides them as a session
does: claimed whole when every node inside runs on the target, else declined naming the op."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npu_ep.ep.capability import analyze
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.ops.control_flow import BranchGraph
from npu_ep.kernels.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from test_if import if_model
from test_loop_scan import counted_loop_model, scan_model


def _decision(model, op):
    nodes = nodes_from_model(model)
    cap = analyze(nodes, Target.load("npu-ref"))
    (d,) = [d for d in cap.decisions if d.node.op_type == op]
    return d


@pytest.mark.parametrize("model, op", [(counted_loop_model(), "Loop"), (scan_model()[0], "Scan"),
                                       (if_model(unsupported=False), "If")])
def test_file_view_claims_control_flow_whose_graphs_run_on_the_target(model, op):
    d = _decision(model, op)
    assert d.claimed, d.reason


def test_file_view_loop_has_its_body_and_outer_scope_inputs():
    d = _decision(counted_loop_model(), "Loop")
    body = d.node.attrs["body"]
    assert isinstance(body, BranchGraph)
    assert [v.name for v in body.inputs] == ["i", "cond_in", "acc_in"]
    assert [v.name for v in body.outputs] == ["cond_out", "acc_out", "y"]
    assert [v.name for v in d.node.inputs] == ["M", "", "acc0", "x"]  # x: read in the body, from the outer scope
    assert next(v for v in body.nodes[0].inputs if v.name == "w").is_constant  # an outer-scope initializer


@pytest.mark.parametrize("model, op", [(counted_loop_model("Tan"), "Loop"), (if_model(unsupported=True), "If")])
def test_file_view_declines_control_flow_naming_the_op(model, op):
    d = _decision(model, op)
    assert not d.claimed and "holds a Tan node" in d.reason, d.reason
