"""npu-report's projected latency contract (issue 42): ``projected_latency_ms``, ``target`` and ``precision`` at the
JSON's top level, the target's calibration error beside the projection, what bounds each layer in the HTML."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.kernels.projection import Work, op_work, project_seconds, terms, timeline_work
from npu_ep.kernels.target import Target
from npu_ep.tools.npu_report import main
from npu_ep.tools.report.build import build_report
from npu_ep.tools.report.latency import latency, precision


def conv_net() -> onnx.ModelProto:
    """Conv 3x3 (16 -> 32) -> Relu -> depthwise Conv 3x3 -> Gemm head, 1x16x56x56, random weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (32, 16, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, 0.1, (32, 1, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (10, 32)).astype(np.float32), "wf")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="dw1", pads=[1, 1, 1, 1], group=32),
             helper.make_node("GlobalAveragePool", ["c1"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 56, 56])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("name", ["snapdragon-8gen3", "snapdragon-8elite", "snapdragon-xelite"])
def test_json_carries_the_projection_its_target_and_precision(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setenv("COLUMNS", "400")  # the line is checked whole: no wrapping by the terminal width
    path, out = tmp_path / "net.onnx", tmp_path / "r.json"
    onnx.save(conv_net(), path)
    assert main([str(path), "--target", name, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["target"] == name and doc["precision"] == "fp16"  # a float model runs in fp16 on these NPUs
    t = Target.load(name)
    assert doc["projected_latency_ms"] == pytest.approx(
        project_seconds(timeline_work(doc["timeline"], t), terms(t)) * 1e3)
    assert doc["projected_latency_ms"] > t.raw["projection"]["graph_overhead_us"] * 1e-3  # overheads included
    cal = t.raw["projection"]["calibration"]
    assert doc["latency"]["calibrated"] and doc["latency"]["calibration"] == cal
    printed = capsys.readouterr().out
    assert f"projected latency on {name}" in printed
    assert f"this target's calibration error: median {cal['median_error']:.0%}" in printed


def test_a_made_up_target_says_it_has_no_calibration(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    path = tmp_path / "net.onnx"
    onnx.save(conv_net(), path)
    assert main([str(path), "--target", "npu-ref"]) == 0
    assert "no calibration against a device" in capsys.readouterr().out
    doc = build_report(str(path), target="npu-ref")
    assert doc["latency"] == {"calibrated": False, "calibration": None, "ops": doc["latency"]["ops"],
                              "partitions": 1}
    assert doc["precision"] == "fp32"


def test_one_inference_calls_each_partition_once():
    t = Target.load("snapdragon-8gen3")
    op = {"op": "MatMul", "cycles": 1000.0, "compute_cycles": 1000.0, "dma_cycles": 10.0, "dma_bytes": 64,
          "weight_bytes": 64, "unit": "matrix", "mode": "int8"}
    prefill = {"partition": "p0", "ops": [op]}
    decode = {"partition": "p0", "ops": [op, op]}  # the same partition at a second signature
    got = latency([prefill, decode], t)
    assert got["latency"]["ops"] == 1 and got["latency"]["partitions"] == 1
    assert got["projected_latency_ms"] == pytest.approx(project_seconds(Work.of([op_work(op, t)]), terms(t)) * 1e3)
    assert precision([prefill]) == "int8"
    assert precision([{"ops": [op, {**op, "mode": "float16"}]}]) == "int8 + fp16"


def test_html_says_what_bounds_each_layer(tmp_path):
    path, html = tmp_path / "net.onnx", tmp_path / "r.html"
    onnx.save(conv_net(), path)
    assert main([str(path), "--target", "snapdragon-8gen3", "--html", str(html)]) == 0
    page = html.read_text()
    assert "projected latency on snapdragon-8gen3" in page
    assert "compute-bound" in page or "bandwidth-bound" in page
