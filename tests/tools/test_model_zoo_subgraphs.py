"""The zoo counts the nodes compiled inside an If/Loop/Scan that NpuEP claimed whole: ORT's graph-assignment record
lists only the claimed node, so without them a model with claimed control flow would show too few nodes. Nodes of a
subgraph whose If stays on the CPU EP are in ORT's record already and are not counted twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npu_ep.tools.report.model_zoo import measure_model, render_terminal
from tests.npu_testing import save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ep"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from test_if import if_model
from test_loop_scan import counted_loop_model

TOP_LEVEL = 5  # sum, greater, mean, outer_if, post
IN_BRANCHES = 7  # then: gather, mul, add; else: inner_if; inner_if's then: gather, sub; its else: relu
BODY = 6  # b_mul, b_add, b_act, b_cast, b_scan, b_cond (the zoo's feeds give M = 0: other ints are 0)


def _row(tmp_path, model, name):
    return measure_model(name, save(model, tmp_path, f"{name}.onnx"), "npu-ref", {"N": 3}, 1)


def test_claimed_if_counts_its_branch_nodes(tmp_path):
    row = _row(tmp_path, if_model(unsupported=False), "if_claimed")
    assert "error" not in row, row
    assert row["assigned_nodes"] == TOP_LEVEL and row["in_claimed_subgraphs"] == IN_BRANCHES
    assert row["nodes"] == row["on_npu"] == TOP_LEVEL + IN_BRANCHES and row["coverage"] == 1.0
    assert "nodes in claimed If/Loop/Scan" in render_terminal({"target": "npu-ref", "models": [row]})


def test_if_left_on_cpu_is_counted_once_from_orts_record(tmp_path):
    """Near miss: with a Tan in a branch the Ifs stay on the CPU EP; ORT's record lists every branch node."""
    row = _row(tmp_path, if_model(unsupported=True), "if_cpu")
    assert "error" not in row, row
    assert row["in_claimed_subgraphs"] == 0
    assert row["nodes"] == row["assigned_nodes"] == TOP_LEVEL + IN_BRANCHES + 1  # + the Tan
    assert row["on_npu"] < row["nodes"]


@pytest.mark.parametrize("body_op, claimed", [("Tanh", True), ("Tan", False)])
def test_loop_body_nodes_are_counted(tmp_path, body_op, claimed):
    row = _row(tmp_path, counted_loop_model(body_op), f"loop_{body_op}")
    assert "error" not in row, row
    assert row["nodes"] == 1 + BODY
    assert row["in_claimed_subgraphs"] == (BODY if claimed else 0)
    assert (row["coverage"] == 1.0) is claimed
