"""The calibration benchmark end to end on one real architecture, DETR-ResNet-50 at 640x640 with random weights (built
by transformers, which the test extras install; the torchvision architectures need torchvision): rebuilt, compiled
and costed as npu-report does, projected with the fitted terms, printed beside the measured latency."""

from __future__ import annotations

import json

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
    (ops,) = [v for k, v in memo.items() if k.startswith("v4:")]
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
