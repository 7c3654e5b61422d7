"""npu-report: schema-valid documents whose numbers agree with each other, measured boundaries and CPU fallback
time (ORT profiler), HTML, CLI, and bad input refused with exit 2 in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_ep
from npu_ep.tools.npu_report import main
from npu_ep.tools.report.build import SCHEMA_PATH, SCHEMA_VERSION, validate
from npu_ep.tools.report.profile import parse
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


def _range_model(data_dependent: bool) -> onnx.ModelProto:
    """positions [1, n, 1] * ones [1, 1, D] -> MatMul, n from Range over Shape(x)'s seq (as an exporter's causal
    mask is built), which ONNX's data propagation leaves unsized. ``data_dependent``: n from NonZero(x) instead,
    which no static inference can size."""
    d = 8
    count = [helper.make_node("Shape", ["x"], ["shape"], name="shape")]
    if data_dependent:
        count = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
                 helper.make_node("Shape", ["nz"], ["shape"], name="nz_shape")]
    nodes = [*count,
             helper.make_node("Gather", ["shape", "one"], ["n"], name="n", axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"], name="range"),
             helper.make_node("Cast", ["pos"], ["posf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["posf", "col"], ["posc"], name="reshape"),
             helper.make_node("Mul", ["posc", "ones"], ["h"], name="mul"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="/model/layers.0/mlp/MatMul")]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "col": np.array([1, -1, 1], np.int64),
             "ones": np.ones((1, 1, d), np.float32), "w": np.eye(d, dtype=np.float32)}
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", d])], inits)


def test_the_static_timeline_costs_steps_behind_shape_arithmetic():
    """The file's shapes with --dim applied go through ORT's symbolic inference, which sizes a Range over Shape
    values: the MatMul after it is costed on [1, 5, 8], nothing is left out."""
    doc = npu_ep.report(_range_model(False), dims={"batch": 2, "seq": 5})
    (entry,) = doc["timeline"]
    assert entry["skipped"] == []
    mm = next(o for o in entry["ops"] if o["op"] == "MatMul")
    assert mm["macs"] == 5 * 8 * 8 and mm["layer"] == 0


def test_steps_no_inference_can_size_are_named_not_costed_as_zero(capsys):
    doc = npu_ep.report(_range_model(True), dims={"batch": 2, "seq": 5})
    skipped = {s["node"] for e in doc["timeline"] for s in e["skipped"]}
    assert "/model/layers.0/mlp/MatMul" in skipped
    assert all(o["node"] not in skipped for e in doc["timeline"] for o in e["ops"])
    from npu_ep.tools.report.render import render

    render(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert f"the emulated timeline leaves out {len(skipped)} step(s)" in out and "--run costs every step" in out


def test_file_view_counts_no_constant_nodes(target):
    """ORT turns Constant nodes into initializers before any EP sees the graph (exporters emit hundreds): the file
    view neither counts them nor declines them, and the node reading one sees a constant input."""
    const = helper.make_node("Constant", [], ["w"], name="c", value=onnx.numpy_helper.from_array(
        np.eye(D, dtype=np.float32)))
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    model = make_model([const, mm], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", D])])
    doc = npu_ep.report(model, target=target, dims={"batch": 4})
    assert doc["file_coverage"] == {"total": 1, "claimed": 1}
    assert (doc["coverage"]["claimed"], doc["coverage"]["total"], doc["coverage"]["declined"]) == (1, 1, 0)


def _session(model: onnx.ModelProto, target: str, tagged: bool = True):
    import onnxruntime as ort

    from npu_ep.ep.sessions import tag_session_options

    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if tagged:
        tag_session_options(so)
    return ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0,
                                providers=[("NpuEP", {"target": target, "cache_dir": ""}), "CPUExecutionProvider"])


def test_report_on_a_session_reads_that_sessions_ep_not_the_newest(target):
    """Two live NpuEP sessions: each report describes its own session's partitions (found by its options' tag)."""
    three, one = erf_layers_model(3), erf_layers_model(1)
    first, second = _session(three, target), _session(one, target)
    for sess, model, layers in ((first, three, 3), (second, one, 1)):
        assert sum(sg.ep_name == "NpuEP" for sg in sess.get_provider_graph_assignment_info()) == layers
        doc = npu_ep.report(sess, model=model, target=target, dims={"batch": 2})
        check_consistent(doc)
        assert doc["source"] == "session" and len(doc["partitions"]) == layers
        assert sorted(n for p in doc["partitions"] for n in p["nodes"]) == \
            sorted(f"/model/layers.{i}/mlp/MatMul" for i in range(layers))


def test_report_on_an_untagged_session_says_how_to_tag_it(target):
    from npu_ep.tools.report.build import ReportInputError

    sess = _session(erf_layers_model(1), target, tagged=False)
    with pytest.raises(ReportInputError, match="tag_session_options"):
        npu_ep.report(sess, model=erf_layers_model(1), target=target, dims={"batch": 2})


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
    assert doc["compare"]["quantized"] is False and doc["compare"]["three_way"] is None
    assert doc["phases"] is None  # no KV cache


def test_cpu_fallback_and_partition_time_per_layer_are_measured_by_ort_profiler(target):
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 4}, run=True, runs=3)
    check_consistent(doc)
    m = doc["measurement"]
    assert m["assignment"] == {"CPUExecutionProvider": LAYERS, "NpuEP": LAYERS}  # ORT's own record
    prof = m["profile"]
    assert prof["runs"] == 3 and prof["run_us"] > 0
    by_node = {n["node"]: n for n in prof["nodes"]}
    for i in range(LAYERS):  # every CPU fallback node timed once per run, in its layer
        erf = by_node[f"/model/layers.{i}/mlp/Erf"]
        assert (erf["provider"], erf["op"], erf["layer"], erf["calls_per_run"]) == ("CPUExecutionProvider", "Erf", i, 1)
        assert erf["us_per_run"] > 0
    partitions = {p["name"] for p in doc["partitions"]}
    npu = [n for n in prof["nodes"] if n["provider"] == "NpuEP"]
    assert {n["node"] for n in npu} == partitions == {p["partition"] for p in m["partitions"]}
    for n in npu:  # same runs: ORT's kernel time wraps the shim's callback (profiler rounds to whole us)
        assert 0 < n["shim_us_per_run"] <= n["us_per_run"] + 1
    rows = {r["layer"]: r for r in doc["per_layer"]}
    assert sorted(rows) == list(range(LAYERS))
    for i in range(LAYERS):  # measured, per layer: not one number spread evenly
        assert rows[i]["cpu_fallback_us"] == pytest.approx(by_node[f"/model/layers.{i}/mlp/Erf"]["us_per_run"])
        assert rows[i]["partition_us"] > 0 and rows[i]["boundary_us"] > 0
    assert sum(r["partition_us"] for r in rows.values()) == pytest.approx(sum(n["us_per_run"] for n in npu))
    assert sum(r["cpu_fallback_us"] for r in rows.values()) == pytest.approx(
        prof["us_per_run_by_provider"]["CPUExecutionProvider"])


def test_profile_parse_keeps_runs_after_warmup_and_averages_per_run():
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(name, ts, dur, provider="CPUExecutionProvider"):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                "args": {"provider": provider, "op_name": "Erf"}}
    events = [run(0, 100), node("/layers.0/a", 10, 50),                                 # warmup: dropped
              run(200, 40), node("/layers.0/a", 210, 4), node("p", 220, 10, "NpuEP"),
              run(300, 60), node("/layers.0/a", 310, 6), node("p", 320, 30, "NpuEP"),
              {"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 1}]
    out = parse(events, warmup=1)
    rows = {n["node"]: n for n in out["nodes"]}
    assert out["runs"] == 2 and out["run_us"] == 50
    assert rows["/layers.0/a"]["us_per_run"] == 5 and rows["/layers.0/a"]["layer"] == 0
    assert rows["p"]["us_per_run"] == 20 and rows["p"]["calls_per_run"] == 1
    assert out["us_per_run_by_provider"] == {"CPUExecutionProvider": 5, "NpuEP": 20}


def test_schema_is_versioned_and_documents_carry_that_version(target):
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION == "1.6"
    assert schema["$id"].endswith(SCHEMA_VERSION)
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 4})
    validate(doc)
    assert doc["validation"] == {"structure": "ok", "checker": "full"}
    bad = dict(doc, schema_version="1.0")
    with pytest.raises(Exception, match=r"1.6"):
        validate(bad)


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


def _hostile(tmp_path) -> dict[str, str]:
    """Invalid models npu-report must refuse (exit 2, one line naming the file)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])

    def raw(nodes, inits=(), opset=17, inputs=(x,)):
        m = helper.make_model(helper.make_graph(nodes, "bad", list(inputs), [y], list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 10
        return m.SerializeToString()
    big = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2**20, 2**20], raw_data=bytes(48))
    files = {
        "empty": b"",
        "cycle": raw([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                      helper.make_node("Relu", ["a"], ["b"], name="n2"),
                      helper.make_node("Identity", ["a"], ["y"], name="n3")]),
        "missing_init": raw([helper.make_node("Add", ["x", "W"], ["y"], name="add")]),
        "opset_99": raw([helper.make_node("Relu", ["x"], ["y"], name="r")], opset=99),
        "huge_init": raw([helper.make_node("Add", ["x", "W"], ["y"], name="add")], [big]),
    }
    out = {}
    for name, data in files.items():
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(data)
        out[name] = str(path)
    return out


@pytest.mark.parametrize("case, message", [
    ("empty", "empty ONNX model"),
    ("cycle", "node 'n1' (Add) reads 'b' before node 'n2' (Relu) produces it"),
    ("missing_init", "node 'add' (Add) reads 'W', which is no graph input, initializer or node output"),
    ("opset_99", "opset 99 of the ONNX domain is newer"),
    ("huge_init", "invalid tensor 'W'"),
])
@pytest.mark.parametrize("run", [False, True])
def test_invalid_model_exits_2_naming_file_and_reason(tmp_path, capsys, case, message, run):
    path = _hostile(tmp_path)[case]
    assert main([path, "--quiet"] + (["--run"] if run else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npu-report: error: {path}: ") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_model_ort_refuses_at_run_time_exits_2_naming_the_cpu_ep(tmp_path, capsys):
    """Valid for onnx.checker, refused by ORT when run: Reshape to 10^18 elements (--run only)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    m = make_model([helper.make_node("Reshape", ["x", "S"], ["y"], name="r")], [x],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10**6] * 3)],
                   {"S": np.array([10**6] * 3, np.int64)})
    path = tmp_path / "reshape.onnx"
    onnx.save(m, path)
    assert main([str(path), "--quiet", "--no-check"]) == 0  # the static report needs no run
    capsys.readouterr()
    assert main([str(path), "--quiet", "--no-check", "--run"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: ONNX Runtime cannot run the model on the CPU EP" in err and "Reshape" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_checker_is_skipped_only_for_ops_without_onnx_schema(tmp_path):
    """ORT's SimplifiedLayerNormalization lives in the ONNX domain without an ONNX schema: the checker would
    reject a model ORT runs, so it is skipped, and the document says so."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, D])
    graph = helper.make_graph([helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], name="ln", axis=-1)],
                              "ln", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, D])],
                              [onnx.numpy_helper.from_array(np.ones(D, np.float32), "g")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    doc = npu_ep.report(m, run=True, runs=2)
    validate(doc)
    assert doc["validation"]["checker"].startswith("skipped: ops without an ONNX schema")
    assert "SimplifiedLayerNormalization" in doc["validation"]["checker"]
    assert doc["measurement"]["assignment"] == {"NpuEP": 1}


def test_npu_ep_failure_on_a_model_the_cpu_ep_runs_is_its_own_error(target, tmp_path, capsys, monkeypatch):
    """Not bad input (exit 2) and not a traceback: one line naming the file and NpuEP's reason, exit 1."""
    with pytest.raises(npu_ep.tools.report.build.NpuEPFailure, match="partition_policy='bogus'") as exc:
        npu_ep.report(erf_layers_model(1), target=target, dims={"batch": 2}, run=True, runs=2,
                      provider_options={"partition_policy": "bogus"})
    assert str(exc.value).startswith("<ModelProto>: NpuEP failed on a model the CPU EP runs: EP_FAIL : NpuEP")
    path = tmp_path / "m.onnx"
    onnx.save(erf_layers_model(1), path)

    def failing(*args, **kwargs):
        raise npu_ep.tools.report.build.NpuEPFailure(f"{path}: NpuEP failed on a model the CPU EP runs: EP_FAIL : x")
    monkeypatch.setattr(npu_ep.tools.report.build, "build_report", failing)
    assert main([str(path), "--run"]) == 1
    err = capsys.readouterr().err
    assert err == f"npu-report: {path}: NpuEP failed on a model the CPU EP runs: EP_FAIL : x\n"


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
