"""npu-report: schema-valid documents whose numbers agree with each other, measured boundaries, HTML, CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_ep
from npu_ep.tools.npu_report import main
from npu_ep.tools.report import validate
from tests.ep.test_policy import target_without
from tests.npu_testing import make_model

LAYERS, D = 3, 64


def erf_layers_model(layers: int = LAYERS) -> onnx.ModelProto:
    """Per layer: MatMul (NPU) -> Erf (forced onto the CPU by the test target): 2 crossings per layer."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "x"
    for i in range(layers):
        inits[f"w{i}"] = (rng.standard_normal((D, D)) / 8).astype(np.float32)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"/model/layers.{i}/mlp/MatMul"),
                  helper.make_node("Erf", [f"mm{i}"], [f"e{i}"], name=f"/model/layers.{i}/mlp/Erf")]
        x = f"e{i}"
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", D])], inits)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return target_without(tmp_path_factory.mktemp("target"))


def check_consistent(doc: dict) -> None:
    validate(doc)
    cov = doc["coverage"]
    assert cov["claimed"] + cov["declined"] == cov["total"] == sum(r["total"] for r in cov["by_op"])
    assert len(cov["declined_nodes"]) == cov["declined"] and all(d["reason"] for d in cov["declined_nodes"])
    assert sum(len(p["nodes"]) for p in doc["partitions"]) == cov["claimed"]
    for p in doc["partitions"]:
        mine = [c for c in doc["crossings"] if c["partition"] == p["name"]]
        assert sorted(c["name"] for c in mine if c["direction"] == "to_npu") == sorted(t["name"] for t in p["inputs"])
        assert sorted(c["name"] for c in mine if c["direction"] == "to_cpu") == sorted(t["name"] for t in p["outputs"])


def test_static_report_from_file_alone(target):
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 4})
    check_consistent(doc)
    assert doc["source"] == "file" and doc["measurement"] is None
    assert (doc["coverage"]["claimed"], doc["coverage"]["total"]) == (LAYERS, 2 * LAYERS)
    assert all("op not listed" in d["reason"] for d in doc["coverage"]["declined_nodes"])
    assert doc["layers"]["count"] == LAYERS and doc["layers"]["crossings_per_layer"] == 2
    assert all(r["crossings"] == 2 for r in doc["layers"]["crossings_by_layer"])
    assert all(c["bytes"] == 4 * D * 4 for c in doc["crossings"])
    mm = doc["timeline"][0]["ops"][0]
    assert mm["macs"] == 4 * D * D and mm["cycles"] > 0 and doc["timeline"][0]["sram_peak"] > 0


def test_run_measures_two_crossings_per_layer_with_positive_cost(target):
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 4}, run=True, runs=5, compare=True)
    check_consistent(doc)
    assert doc["source"] == "session"
    m, pr = doc["measurement"], doc["projection"]
    assert len(m["partitions"]) == LAYERS
    assert all(p["calls_per_run"] == 1 and p["bytes_in_per_call"] == 4 * D * 4 for p in m["partitions"])
    assert m["npu_latency_us"] > 0 and m["cpu_latency_us"] > 0
    assert doc["layers"]["crossings_per_layer"] == 2
    assert all(c["measured_us"] > 0 for c in doc["crossings"])
    assert pr["t_b_us"] > 0
    assert pr["per_token_us"] == pytest.approx(LAYERS * 2 * pr["t_b_us"])
    assert 0 < pr["full_coverage_saving_us"] < pr["boundary_us_per_run"]
    assert {e["signature"] == [[4, D]] for e in doc["timeline"]} == {True}
    assert all(e["cycles"] > 0 and e["dma_bytes"] > 0 for e in doc["timeline"])
    rows = doc["compare"]["nodes"]
    assert [r["tensor"] for r in rows] == [f"mm{i}" for i in range(LAYERS)]
    assert doc["compare"]["first_failure"] is None and all(r["max_abs"] < 1e-4 for r in rows)


def test_cli_writes_json_and_self_contained_html(tmp_path, target, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(erf_layers_model(), path)
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    rc = main([str(path), "--target", target, "--dim", "batch=2", "--json", str(out_json), "--html", str(out_html)])
    assert rc == 0
    assert "3/6" in capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    check_consistent(doc)
    page = out_html.read_text()
    for fid in ("coverage-by-op", "partition-map", "layer-timeline"):
        assert f'id="{fid}"' in page
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js bundle inlined
    assert '<script src="http' not in page


@pytest.mark.parametrize("argv, message", [
    (["missing.onnx"], "model file not found"),
    (["{model}", "--target", "no-such-target"], "unknown target"),
    (["{model}", "--dim", "batch"], "name=value"),
    (["{model}", "--dim", "batch=x"], "not an integer"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    path = tmp_path / "m.onnx"
    onnx.save(erf_layers_model(1), path)
    rc = main([a.format(model=path) for a in argv]) if "--dim" not in argv else None
    if rc is None:
        with pytest.raises(SystemExit) as exc:
            main([a.format(model=path) for a in argv])
        rc = exc.value.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_onnx_file_exits_2(tmp_path, capsys):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not a model")
    assert main([str(path)]) == 2
    assert "cannot read ONNX model" in capsys.readouterr().err
