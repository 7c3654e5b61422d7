"""npu_ep.tools.version_matrix: its per-environment check runs here (the versions ./run installs), and its verdict
catches what the matrix exists for. The matrix itself (one venv per onnxruntime version, downloads) is run by hand:
``python -m npu_ep.tools.version_matrix --wheel dist/npu_ep-*.whl``.
"""

from __future__ import annotations

import copy

from npu_ep.tools import version_matrix


def test_check_runs_the_demo_qdq_and_if_models_on_npu_ep_like_the_cpu_ep():
    result = version_matrix.check()
    assert result["demo"]["tokens"] == result["demo"]["cpu_tokens"]
    assert len(result["demo"]["tokens"]) == version_matrix.NEW_TOKENS
    assert result["demo"]["nodes_on_npu"] > 0
    assert result["qdq"]["nodes_on_npu"] > 0 and result["qdq"]["max_abs_diff_vs_cpu"] == 0.0
    assert result["if"] == {"identical_to_cpu": True, "nodes_on_npu": 2}


def test_verdict_names_a_set_that_differs():
    good = {"set": "a", "demo": {"tokens": [1, 2], "cpu_tokens": [1, 2]}, "qdq": {"sha256": "x"},
            "if": {"identical_to_cpu": True, "nodes_on_npu": 2}}
    assert version_matrix.verdict([good, {**copy.deepcopy(good), "set": "b"}]) == []
    other_tokens = copy.deepcopy(good) | {"set": "b"}
    other_tokens["demo"]["tokens"] = [1, 3]
    failed_if = copy.deepcopy(good) | {"set": "c", "if": {"error": "CompileError: node 'If_1' reads 'x'"}}
    broken = {"set": "d", "pins": [], "error": "pip install failed\nResolutionImpossible"}
    problems = version_matrix.verdict([good, other_tokens, failed_if, broken])
    assert "d: ResolutionImpossible" in problems
    assert "b: NpuEP tokens [1, 3] != CPU EP [1, 2]" in problems
    assert "the demo's tokens differ between sets" in problems
    assert "c: If with outer-scope reads: CompileError: node 'If_1' reads 'x'" in problems
