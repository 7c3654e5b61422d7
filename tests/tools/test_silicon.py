"""The calibration benchmark end to end on one real architecture, DETR-ResNet-50 at 640x640 with random weights (built
by transformers, which the test extras install; the torchvision architectures need torchvision): rebuilt, compiled
and costed as npu-report does, projected with the fitted terms, printed beside the measured latency."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from npu_ep.kernels.projection import project_seconds, terms
from npu_ep.kernels.target import Target
from npu_ep.tools.bench import silicon
from npu_ep.tools.bench.silicon_models import SiliconModelsUnavailable, model_path

pytestmark = pytest.mark.torch
MODEL = "detr_resnet50"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("silicon")
    try:
        model_path(MODEL, "float", folder)
    except SiliconModelsUnavailable as exc:
        pytest.skip(str(exc))
    return folder


def test_detr_projects_within_the_targets_recorded_calibration_error(cache):
    measured = silicon.measured_rows(silicon.DEFAULT_DATA)[(MODEL, "float", "snapdragon-8gen3")]
    t = Target.load("snapdragon-8gen3")
    work = silicon.model_work(model_path(MODEL, "float", cache), t)
    projected = project_seconds(work, terms(t)) * 1e3
    assert abs(projected / measured - 1) <= t.raw["projection"]["calibration"]["max_error"] + 1e-3
    # the costed timeline is remembered beside the model, not its projection: a new projection needs no new compile
    memo = json.loads((cache / "work.json").read_text())
    (ops,) = [v for k, v in memo.items() if k.startswith("v5:")]
    assert all(len(op) == len(silicon._OP_FIELDS) for partition in ops for op in partition)
    assert silicon.model_work(model_path(MODEL, "float", cache), t) == work


def test_the_benchmark_prints_and_writes_every_row(cache, tmp_path, capsys):
    out = tmp_path / "silicon.json"
    assert silicon.main(["--cache", str(cache), "--models", MODEL, "--targets", "snapdragon-8gen3",
                         "--no-llm", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{MODEL:<20}float     snapdragon-8gen3" in printed
    doc = json.loads(out.read_text())
    assert [(r["model"], r["precision"]) for r in doc["rows"]] == [(MODEL, "float")]
    assert doc["summary"][0]["rows"] == 1


def _calibration_csv(folder, rows):
    cols = ["model", "precision", "device", "chipset", "soc", "runtime", "inference_time_ms", "primary_compute_unit",
            "layers_total", "layers_npu", "layers_cpu", "source_file"]
    with open(folder / "cnn_calibration.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows([(m, p, "S25", "qualcomm-snapdragon-8-elite-for-galaxy", "", rt, ms, unit, "9", "9", cpu, "")
                     for m, p, rt, ms, unit, cpu in rows])


def test_the_measured_speedup_pairs_each_runtime_with_itself(tmp_path):
    """fp16 over w8a8 on the same device and runtime, the median over runtimes; a ratio across runtimes mixes their
    own speed in (the old rule: median fp16 over median w8a8), and a model with no common runtime gets no row."""
    _calibration_csv(tmp_path, [
        ("mixed", "float", "tflite", "4.0", "NPU", "0"), ("mixed", "float", "qnn_dlc", "8.0", "NPU", "0"),
        ("mixed", "float", "onnx", "9.0", "NPU", "0"),  # no w8a8 by ORT's QNN EP: no ratio of its own
        ("mixed", "w8a8", "tflite", "1.0", "NPU", "0"), ("mixed", "w8a8", "qnn_dlc", "4.0", "NPU", "0"),
        ("mixed", "w8a8", "onnx", "0.1", "GPU", "0"),  # not on the NPU
        ("apart", "float", "qnn_dlc", "5.0", "NPU", "0"), ("apart", "w8a8", "tflite", "2.0", "NPU", "0"),
        ("apart", "w8a8", "qnn_dlc", "1.0", "NPU", "3")])  # part on the CPU: QNN has no w8a8 row on the NPU
    runs = silicon.measured_runs(tmp_path)
    measured = silicon.measured_speedups(runs)
    t = "snapdragon-8elite"
    # TFLite 4.0x, QNN 2.0x: the median 3.0x (the old rule, median fp16 over median w8a8: 8.0 / 2.5 = 3.2x)
    assert measured[("mixed", t)]["runtimes"] == {("S25", "qnn_dlc"): 2.0, ("S25", "tflite"): 4.0}
    assert measured[("mixed", t)]["speedup"] == 3.0
    # fp16 by QNN only, w8a8 by TFLite only: the old rule's 5.0 / 2.0 = 2.5x compared two runtimes
    assert measured[("apart", t)] == {"speedup": None, "runtimes": {}}
    rows = [{"model": m, "precision": p, "target": t, "measured_ms": 1.0, "projected_ms": ms}
            for m, p, ms in (("mixed", "float", 5.0), ("mixed", "w8a8", 2.0), ("apart", "float", 4.0),
                             ("apart", "w8a8", 2.0))]
    sp = {s["model"]: s for s in silicon.speedups(rows, measured)}
    assert sp["mixed"]["measured"] == 3.0 and sp["mixed"]["projected"] == 2.5
    assert sp["mixed"]["error"] == pytest.approx(2.5 / 3.0 - 1)
    assert sp["mixed"]["runtimes"] == {"qnn_dlc": 2.0, "tflite": 4.0}
    assert sp["mixed"]["rows"] == 1.0  # the measured latency rows given to the fit: 1.0 ms each here
    assert sp["apart"]["measured"] is None and sp["apart"]["error"] is None


def test_a_model_without_a_common_runtime_is_said_to_have_no_speedup_row(capsys):
    silicon._print_speedups([{"model": "apart", "target": "snapdragon-8elite", "measured": None, "projected": 2.0,
                              "error": None, "runtimes": {}}])
    assert "no row: no runtime measured both precisions" in capsys.readouterr().out


def test_runtime_labels_name_the_device_where_a_target_holds_two():
    one = {("S25", "qnn_dlc"): 2.0, ("S25", "tflite"): 3.0}
    assert silicon._runtime_labels(one) == {"qnn_dlc": 2.0, "tflite": 3.0}
    two = {("S25", "qnn_dlc"): 2.0, ("QRD", "qnn_dlc"): 2.5}
    assert silicon._runtime_labels(two) == {"S25/qnn_dlc": 2.0, "QRD/qnn_dlc": 2.5}


def _key_in_a_process(model, hash_seed: str) -> str:
    code = ("import sys; from pathlib import Path; from npu_ep.kernels.target import Target; "
            "from npu_ep.tools.bench.silicon import memo_key; "
            "print(memo_key(Path(sys.argv[1]), Target.load('snapdragon-8elite'), {'sequence': 1}))")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-c", code, str(model)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_remembered_timeline_is_found_again_by_the_next_process(tmp_path):
    """The memo key is the same in every process (it was a repr of the op rules, whose dtype sets print in
    string-hash order: every run of the benchmark recompiled every model), and it ignores the fitted terms only."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert _key_in_a_process(model, "1") == _key_in_a_process(model, "2")
    t = Target.load("snapdragon-8elite")
    refit = Target.from_dict({**t.raw, "projection": {**t.raw["projection"], "graph_overhead_us": 1.0}})
    assert silicon.memo_key(model, refit) == silicon.memo_key(model, t)
    assert silicon.memo_key(model, Target.from_dict({**t.raw, "sram_bytes": 1 << 20})) != silicon.memo_key(model, t)
    assert silicon.memo_key(model, t, {"sequence": 2}) != silicon.memo_key(model, t, {"sequence": 1})


def test_a_speedup_row_prints_the_ratio_of_the_latency_rows_the_fit_sees(capsys):
    """ViT on 8 Elite: fp16's row is QNN's 5.300 ms (the median of three runtimes), w8a8's TFLite's 3.365 ms (the only
    one wholly on the NPU): the fit is given 1.58x while TFLite against TFLite is 1.17x, and the output says both."""
    rows = [{"model": "vit", "precision": p, "target": "snapdragon-8elite", "measured_ms": ms, "projected_ms": proj}
            for p, ms, proj in (("float", 5.300, 5.5), ("w8a8", 3.365, 2.95))]
    tflite = 3.943 / 3.365
    measured = {("vit", "snapdragon-8elite"): {"speedup": tflite, "runtimes": {("S25", "tflite"): tflite}}}
    (s,) = silicon.speedups(rows, measured)
    assert s["rows"] == pytest.approx(5.300 / 3.365)
    silicon._print_speedups([s])
    assert "(tflite 1.17x; latency rows 1.58x)" in capsys.readouterr().out
