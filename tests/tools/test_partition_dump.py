"""npu-report --dump-partitions: each NPU partition as a standalone ONNX model that replays exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.capability import analyze
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.target import Target
from npu_ep.tools.report.partition_dump import DumpError, boundary_values, dump_partitions
from tests.ep.test_policy import target_without
from tests.npu_testing import assignment, cpu_run, make_model, npu_session

F32 = TensorProto.FLOAT


def two_partition_model() -> onnx.ModelProto:
    """x -> MatMul -> Relu -> Erf (CPU-only here) -> Mul(by a Constant node) -> MatMul -> y, plus a side output."""
    rng = np.random.default_rng(0)
    inits = {"w1": (rng.standard_normal((16, 32)) / 4).astype(np.float32),
             "w2": (rng.standard_normal((32, 8)) / 4).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Erf", ["r"], ["e"], name="erf"),
             helper.make_node("Constant", [], ["two"], name="two", value=helper.make_tensor("t", F32, [], [2.0])),
             helper.make_node("Mul", ["e", "two"], ["m"], name="mul"),
             helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 16])],
                      [helper.make_tensor_value_info("y", F32, ["batch", 8]),
                       helper.make_tensor_value_info("r", F32, ["batch", 32])], inits)


def test_dumped_partitions_replay_the_whole_models_values_on_cpu_and_run_wholly_on_npuep(tmp_path):
    model = two_partition_model()
    target = target_without(tmp_path)
    nodes = nodes_from_model(model)
    cap = analyze(nodes, Target.load(target))
    names = [f"part{i}" for i in range(len(cap.partitions))]
    written = dump_partitions(model, nodes, cap, names, tmp_path / "dump", dims={"batch": 3})
    assert [(w["inputs"], w["outputs"], w["nodes"]) for w in written] == [
        (["x"], ["r"], 2), (["e"], ["y"], 2)]  # the Constant node travels with the Mul as a constant
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)}
    values = boundary_values(model, feeds, ["x", "r", "e", "y"])
    for w in written:
        sub = onnx.load(w["path"])
        assert next(d.dim_value for d in sub.graph.input[0].type.tensor_type.shape.dim) == 3  # --dim applied
        sub_feeds = {n: values[n] for n in w["inputs"]}
        got = cpu_run(sub, sub_feeds)
        for name, value in zip(w["outputs"], got):
            np.testing.assert_array_equal(value, values[name])
        sess = npu_session(sub, {"target": target}, cpu=False)  # no CPU EP: every node must run on NpuEP
        assert set(assignment(sess).values()) == {"NpuEP"}
        for name, value in zip(w["outputs"], sess.run(None, sub_feeds)):
            np.testing.assert_allclose(value, values[name], rtol=1e-5, atol=1e-5)


def test_dump_refuses_to_replace_an_existing_file(tmp_path):
    model = two_partition_model()
    nodes = nodes_from_model(model)
    cap = analyze(nodes, Target.load(target_without(tmp_path)))
    names = ["a", "b"]
    dump_partitions(model, nodes, cap, names, tmp_path / "dump")
    with pytest.raises(DumpError, match="exists already"):
        dump_partitions(model, nodes, cap, names, tmp_path / "dump")


def test_cli_dump_partitions_writes_files_that_replay_on_the_cpu_ep(tmp_path, capsys):
    """Through ``npu-report --dump-partitions``: the report's partitions (names included), --dim applied, each
    file replays the whole model's boundary values exactly on ORT's CPU EP."""
    from npu_ep.tools.npu_report import main

    model = two_partition_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    target = target_without(tmp_path)
    out = tmp_path / "dump"
    assert main([str(path), "--target", target, "--dim", "batch=3", "--dump-partitions", str(out), "--quiet",
                 "--json", str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["p000.onnx", "p001.onnx"]
    assert err.count("npu-report: wrote ") == 2
    import json
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [d["partition"] for d in doc["partition_dumps"]] == [p["name"] for p in doc["partitions"]]
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)}
    values = boundary_values(model, feeds, ["x", "r", "e", "y"])
    for d in doc["partition_dumps"]:
        sub = onnx.load(d["path"])
        assert next(d.dim_value for d in sub.graph.input[0].type.tensor_type.shape.dim) == 3
        got = cpu_run(sub, {n: values[n] for n in d["inputs"]})
        for name, value in zip(d["outputs"], got):
            np.testing.assert_array_equal(value, values[name])


def test_cli_dump_partitions_with_run_names_files_as_without(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    out = tmp_path / "dump"
    assert main([str(path), "--target", target_without(tmp_path), "--dim", "batch=2", "--run", "--runs", "1",
                 "--dump-partitions", str(out), "--quiet"]) == 0
    assert sorted(f.name for f in out.iterdir()) == ["p000.onnx", "p001.onnx"]  # one naming scheme, run or not


def test_cli_dump_into_a_folder_holding_the_same_files_exits_2_and_keeps_them(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    target = target_without(tmp_path)
    out = tmp_path / "dump"
    argv = [str(path), "--target", target, "--dump-partitions", str(out), "--quiet"]
    assert main(argv) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists already" in err[0], err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def _cli(argv: list[str]) -> int:
    from npu_ep.tools.npu_report import main

    try:
        return main(argv)
    except SystemExit as e:  # argparse errors
        return e.code


@pytest.mark.parametrize("where, reason", [
    ("{file}", "it exists and is not a folder"),
    ("{file}/sub", "cannot create the folder: Not a directory"),
    ("", "the folder name is empty"),
])
def test_cli_dump_into_a_folder_that_cannot_be_one_exits_2_naming_it(tmp_path, capsys, monkeypatch, where, reason):
    """A file, a path under a file, '' (which dumped into the current folder): one line, exit 2, no traceback."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    folder = where.format(file=path)
    assert _cli([str(path), "--target", target_without(tmp_path), "--dump-partitions", folder, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("npu-report: error: ") and reason in err[0], err
    assert folder == "" or err[0].startswith(f"npu-report: error: {folder}"), err
    assert sorted(f.name for f in tmp_path.rglob("*.onnx")) == ["m.onnx"]  # nothing dumped, '' included


def test_a_dump_that_fails_midway_removes_what_it_wrote(tmp_path, monkeypatch, capsys):
    """A full disk at the second partition: the first one's file and the folders the run created go too."""
    import errno

    from npu_ep.tools.report import partition_dump

    real, calls = partition_dump.atomic_write_bytes, []

    def full_disk_at_second(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(partition_dump, "atomic_write_bytes", full_disk_at_second)
    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    out = tmp_path / "new" / "dump"
    assert _cli([str(path), "--target", target_without(tmp_path), "--dump-partitions", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"npu-report: error: {out}: cannot write partition file p001.onnx: No space left on device; "
                   "no partition was kept"]
    assert len(calls) == 2 and not (tmp_path / "new").exists()


def test_a_failed_dump_into_an_existing_folder_keeps_the_files_that_were_there(tmp_path, monkeypatch):
    from npu_ep.tools.report import partition_dump

    def read_only(path, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(partition_dump, "atomic_write_bytes", read_only)
    model = two_partition_model()
    nodes = nodes_from_model(model)
    cap = analyze(nodes, Target.load(target_without(tmp_path)))
    out = tmp_path / "dump"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DumpError, match=f"^{out}: cannot write partition file p000.onnx: Permission denied"):
        dump_partitions(model, nodes, cap, ["a", "b"], out)
    assert [f.name for f in out.iterdir()] == ["notes.txt"]
