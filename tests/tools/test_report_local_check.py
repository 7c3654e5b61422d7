"""npu-report --compare's local check: a node out of tolerance is run alone on the CPU EP with NpuEP's own
inputs, telling a kernel error from a difference propagated from upstream. The mechanism is tested on values
given to it (an exact NpuEP output, a wrong one, an input fused away); the compare path on a real model in
test_genai.py and test_report_llm.py."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from npu_ep.tools.report.compare import _within
from npu_ep.tools.report.local_check import MAX_NODES, local_checks
from tests.npu_testing import cpu_run, make_model

F32 = TensorProto.FLOAT


def chain(n: int = 3):
    """x -> MatMul -> Relu -> MatMul -> ... (n MatMul/Relu pairs), every output named."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "x"
    for i in range(n):
        inits[f"w{i}"] = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 8])],
                      [helper.make_tensor_value_info(x, F32, [2, 8])], inits)


def _rows(names):
    return [{"node": node, "tensor": tensor, "ok": False} for node, tensor in names]


def test_a_kernel_that_agrees_on_its_own_inputs_is_reported_as_propagated_one_that_does_not_as_failing():
    model = chain()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    upstream = np.maximum(x @ _w(model, "w0"), 0) + np.float32(0.5)  # NpuEP's input already off by 0.5
    right = np.maximum(upstream @ _w(model, "w1"), 0)
    values = {"r0": upstream, "m1": upstream @ _w(model, "w1"), "r1": right}
    checks = local_checks(model, _rows([("mm1", "m1"), ("relu1", "r1")]), values, {"x": x}, _within)
    assert [(c["node"], c["ok"], c["nodes_run"]) for c in checks] == [("mm1", True, 1), ("relu1", True, 1)]
    values["m1"] = values["m1"] + np.float32(0.1)  # a kernel error in mm1
    checks = local_checks(model, _rows([("mm1", "m1")]), values, {"x": x}, _within)
    assert len(checks) == 1 and not checks[0]["ok"] and checks[0]["max_abs"] > 0.09


def _w(model, name) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def test_inputs_fused_away_run_with_their_producers():
    """relu1's input m1 was never recorded (fused into one step with mm1): mm1 runs with it, from r0."""
    model = chain()
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    r0 = np.maximum(x @ _w(model, "w0"), 0)
    r1 = np.maximum(r0 @ _w(model, "w1"), 0)
    checks = local_checks(model, _rows([("relu1", "r1")]), {"r0": r0, "r1": r1}, {"x": x}, _within)
    assert [(c["node"], c["nodes_run"], c["ok"]) for c in checks] == [("relu1", 2, True)]


def test_a_node_needing_more_than_max_nodes_producers_is_left_unchecked():
    model = chain(MAX_NODES)
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    last = f"r{MAX_NODES - 1}"
    out = cpu_run(model, {"x": x}, [last])[0]
    assert local_checks(model, _rows([(f"relu{MAX_NODES - 1}", last)]), {last: out}, {"x": x}, _within) == []
    # near miss: one node fewer than the whole chain fits
    short = chain(MAX_NODES // 2)
    last = f"r{MAX_NODES // 2 - 1}"
    out = cpu_run(short, {"x": x}, [last])[0]
    (check,) = local_checks(short, _rows([(f"relu{MAX_NODES // 2 - 1}", last)]), {last: out}, {"x": x}, _within)
    assert check["ok"] and check["nodes_run"] == MAX_NODES
