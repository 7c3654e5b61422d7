"""The model-zoo view: one row per model from a real NpuEP session in a worker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper

from npu_ep.models.corpus import by_name
from npu_ep.tools.report.isolated import JobFailed, run_isolated
from npu_ep.tools.report.model_zoo import model_paths, render_html, render_terminal, zoo
from tests.npu_testing import make_model, save


def test_zoo_rows_come_from_real_sessions_with_reasons_and_errors(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    f32 = TensorProto.FLOAT
    save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    [helper.make_tensor_value_info("x", f32, ["n", 8])],
                    [helper.make_tensor_value_info("y", f32, ["n", 8])]), folder, "relu.onnx")
    save(make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                     helper.make_node("Atan", ["r"], ["y"], name="atan")],
                    [helper.make_tensor_value_info("x", f32, [2, 8])],
                    [helper.make_tensor_value_info("y", f32, [2, 8])]), folder, "atan.onnx")
    (folder / "broken.onnx").write_bytes(b"not a model")
    doc = zoo([str(folder)], workers=2, runs=1)
    rows = {r["model"]: r for r in doc["models"]}
    assert set(rows) == {"relu", "atan", "broken"}
    assert rows["relu"]["coverage"] == 1.0 and rows["relu"]["partitions"] == 1 and rows["relu"]["crossings"] == 2
    assert rows["relu"]["max_rel_diff"] == 0.0
    assert rows["atan"]["on_npu"] == 1 and rows["atan"]["nodes"] == 2
    assert rows["atan"]["top_reasons"] and rows["atan"]["top_reasons"][0].startswith("1 x Atan")
    assert "error" in rows["broken"]
    json.dumps(doc)
    text = render_terminal(doc)
    assert "relu" in text and "100%" in text and "[ops]" in text  # rich markup is escaped, not eaten
    assert "<table>" in render_html(doc)


def test_corpus_source_names_the_installed_real_models():
    if by_name("ocr-cls").path() is None:
        pytest.skip("rapidocr-onnxruntime is not installed (./run installs it with --no-deps)")
    names = [n for n, _ in model_paths(["corpus"])]
    assert "ocr-cls" in names


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model file or folder"):
        model_paths([str(tmp_path / "nope")])


def _relu_folder(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    f32 = TensorProto.FLOAT
    save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    [helper.make_tensor_value_info("x", f32, ["n", 8])],
                    [helper.make_tensor_value_info("y", f32, ["n", 8])]), folder, "relu.onnx")
    return folder


def test_cli_zoo_prints_the_table_and_writes_json_and_html(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    folder = _relu_folder(tmp_path)
    out_json, out_html = tmp_path / "zoo.json", tmp_path / "zoo.html"
    assert main(["--zoo", str(folder), "--workers", "1", "--runs", "1", "--json", str(out_json),
                 "--html", str(out_html)]) == 0
    out = capsys.readouterr().out
    assert "Model zoo on npu-ref" in out and "relu" in out and "100%" in out
    doc = json.loads(out_json.read_text())
    assert [(r["model"], r["coverage"], r["partitions"]) for r in doc["models"]] == [("relu", 1.0, 1)]
    assert "<table>" in out_html.read_text() and "relu" in out_html.read_text()


@pytest.mark.parametrize("extra, message", [
    (["--json", "{model}"], "output would replace"),
    (["--target", "no-such-target"], "no-such-target"),
    (["--run"], "--zoo does not take --run"),
    (["--workers", "0"], "--workers must be >= 1"),
])
def test_cli_zoo_bad_input_exits_2_in_one_line_and_writes_nothing(tmp_path, capsys, extra, message):
    from npu_ep.tools.npu_report import main

    folder = _relu_folder(tmp_path)
    model = folder / "relu.onnx"
    before = model.read_bytes()
    try:
        code = main(["--zoo", str(folder), "--workers", "1", *[a.format(model=model) for a in extra]])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert model.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["relu.onnx"]


def test_cli_zoo_missing_source_exits_2(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    assert main(["--zoo", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"npu-report: error: {tmp_path / 'nope'}: no such model file or folder\n"


def test_host_ratio_runs_the_two_sessions_alternately():
    """Load that comes and goes must weigh on both EPs: their timed runs alternate (after one warm-up each)."""
    from npu_ep.tools.report.model_zoo import host_ratio

    order: list[str] = []

    class Session:
        def __init__(self, name):
            self.name = name

        def run(self, outputs, feeds):
            order.append(self.name)

    median, low, high = host_ratio(Session("npu"), Session("cpu"), {}, runs=4)
    assert order == ["npu", "cpu"] * 5  # a warm-up each, then 4 blocks of one run each
    assert 0 < low <= median <= high


def _zoo_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """npu-report --zoo as its own process: a hang fails the test at ``timeout`` instead of hanging the suite."""
    return subprocess.run([sys.executable, "-m", "npu_ep.tools.npu_report", "--zoo", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd="/")


def test_cli_zoo_reports_a_fifo_and_a_link_to_a_device_as_rows_without_reading_them(tmp_path):
    """A FIFO named *.onnx blocked the run forever; a *.onnx symlink to /dev/zero took a worker to gigabytes."""
    folder = _relu_folder(tmp_path)
    os.mkfifo(folder / "fifo.onnx")
    (folder / "zero.onnx").symlink_to("/dev/zero")
    out = tmp_path / "zoo.json"
    done = _zoo_cli(str(folder), "--workers", "2", "--runs", "1", "--json", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    rows = {r["model"]: r for r in json.loads(out.read_text())["models"]}
    assert rows["relu"]["coverage"] == 1.0
    assert rows["fifo"]["error"].endswith("fifo.onnx: is a FIFO, not a regular file")
    assert rows["zero"]["error"].endswith("zero.onnx: is a character device, not a regular file")


def test_a_job_past_its_time_limit_is_killed_and_its_row_says_so():
    started = time.monotonic()
    slow, fast = run_isolated(time.sleep, [(120,), (0,)], workers=2, timeout_s=15.0)  # a spawn takes seconds
    assert isinstance(slow, JobFailed) and str(slow) == "timed out after 15 s (killed)"
    assert fast is None
    assert time.monotonic() - started < 60


def test_a_job_above_its_memory_bound_fails_with_memory_error():
    (big,) = run_isolated(np.empty, [((3 * 2**30,), np.uint8)], workers=1, timeout_s=60, max_memory_bytes=2**30)
    assert isinstance(big, JobFailed) and str(big).startswith("MemoryError"), big


def test_a_zoo_row_for_a_job_that_failed_names_the_model(tmp_path):
    folder = _relu_folder(tmp_path)
    doc = zoo([str(folder)], workers=1, runs=1, timeout_s=0.01)
    assert doc["models"] == [{"model": "relu", "path": str(folder / "relu.onnx"),
                              "error": "timed out after 0.01 s (killed)"}]


_SLEEPING_JOBS = ("import time; from npu_ep.tools.report.isolated import run_isolated; "
                  "run_isolated(time.sleep, [(300,), (300,)], workers=2, timeout_s=600)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_die_with_their_parent(sig):
    """SIGTERM: the parent kills its workers and exits 143; SIGKILL: Linux kills them (PR_SET_PDEATHSIG)."""
    parent = subprocess.Popen([sys.executable, "-c", _SLEEPING_JOBS], cwd="/")
    try:
        deadline = time.monotonic() + 60
        while len(workers := psutil.Process(parent.pid).children()) < 2:
            assert time.monotonic() < deadline and parent.poll() is None, "workers did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # the workers are past prctl
        parent.send_signal(sig)
        assert parent.wait(30) == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers outlived their parent: {alive}"
    finally:
        parent.kill()
        parent.wait()
