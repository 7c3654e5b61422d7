"""Hostile model files given to an InferenceSession with NpuEP: a clear exception or a correct run, never a crash,
hang or an attempt to allocate terabytes. Every case runs in a child process (address space capped at 8 GiB)."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from _child import probe_batch, probe_in_child, static_model, two_partition_model
from npu_testing import F32, cpu_run, make_model, save

RNG = np.random.default_rng(8)


def _raw_model(nodes, inputs, outputs, inits=(), opset=17):
    """Like make_model but without onnx.checker: hostile models are by definition invalid."""
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _write(tmp_path, data: bytes, name="model.onnx") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _refused(res: dict, *words: str) -> None:
    assert not res["created"], f"hostile model was accepted: {res}"
    assert res["error"], res
    for w in words:
        assert w.lower() in res.get("error_full", res["error"]).lower(), res["error"]


GARBAGE = ["empty", "random", "truncated_half", "truncated_tail", "zeros"]
ESCAPES = {"dotdot": "../secret.bin", "absolute": "/etc/passwd", "nested": "sub/../../secret.bin"}


def _refusal_models(folder) -> dict[str, str]:
    """Every model that must be refused at session creation, written under ``folder``."""
    good = static_model().SerializeToString()
    paths = {}
    for kind, data in {"empty": b"", "random": RNG.bytes(4096), "truncated_half": good[: len(good) // 2],
                       "truncated_tail": good[:-3], "zeros": bytes(1000)}.items():
        paths[f"garbage_{kind}"] = _write(folder, data, f"garbage_{kind}.onnx")
    m = static_model()
    m.opset_import[0].version = 99
    paths["opset_99"] = save(m, folder, "opset99.onnx")
    x4 = helper.make_tensor_value_info("x", F32, [2, 4])
    paths["missing_initializer"] = save(_raw_model(
        [helper.make_node("MatMul", ["x", "W_missing"], ["y"], name="mm")], [x4],
        [helper.make_tensor_value_info("y", F32, [2, 3])]), folder, "missing.onnx")
    paths["cycle"] = save(_raw_model(
        [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
         helper.make_node("Identity", ["a"], ["y"], name="n3")], [x4],
        [helper.make_tensor_value_info("y", F32, [2, 4])]), folder, "cycle.onnx")
    (folder / "secret.bin").write_bytes(np.arange(12, dtype=np.float32).tobytes())
    (folder / "models" / "sub").mkdir(parents=True)
    for kind, location in ESCAPES.items():
        w = TensorProto(name="W", data_type=F32, dims=[4, 3], data_location=TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", "0"), ("length", "48")):
            w.external_data.add(key=k, value=v)
        paths[f"escape_{kind}"] = save(_raw_model(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [x4],
            [helper.make_tensor_value_info("y", F32, [2, 3])], [w]), folder / "models", f"escape_{kind}.onnx")
    big = TensorProto(name="W", data_type=F32, dims=[2**20, 2**20], raw_data=np.zeros(12, np.float32).tobytes())
    paths["huge_initializer"] = save(_raw_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [helper.make_tensor_value_info("x", F32, [2, 2**20])],
        [helper.make_tensor_value_info("y", F32, [2, 2**20])], [big]), folder, "huge_init.onnx")
    return paths


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, dict]:
    return probe_batch(_refusal_models(tmp_path_factory.mktemp("refusals")))


@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_bytes_as_model_are_refused(refusals, kind):
    res = refusals[f"garbage_{kind}"]
    if kind == "zeros" and res["created"]:  # all-zero bytes parse as an empty ModelProto in protobuf
        return
    _refused(res)


def test_unknown_opset_is_refused(refusals):
    _refused(refusals["opset_99"], "opset")


def test_missing_initializer_is_refused(refusals):
    _refused(refusals["missing_initializer"], "W_missing")


def test_graph_with_a_cycle_is_refused(refusals):
    _refused(refusals["cycle"])


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_external_data_escaping_the_model_dir_is_refused(refusals, kind):
    _refused(refusals[f"escape_{kind}"])


def test_initializer_declared_huge_with_little_data_is_refused(refusals):
    """A MatMul weight declared [2^20, 2^20] (4 TiB) but carrying 48 bytes of raw data."""
    _refused(refusals["huge_initializer"])


def test_old_opset_runs_like_cpu(tmp_path):
    nodes = [helper.make_node("Add", ["x", "B"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                   [helper.make_tensor_value_info("y", F32, [2, 4])], {"B": np.ones((2, 4), np.float32)}, opset=7)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    _, res = probe_in_child(save(m, tmp_path), {"x": x}, tmp_path=tmp_path)
    if res["created"]:
        assert res["ran"], res
        np.testing.assert_array_equal(res["outputs"][0], cpu_run(m, {"x": x})[0])
    else:
        assert res["error"]


def test_reshape_to_a_giant_constant_shape_does_not_allocate(tmp_path):
    """1e6 x 1e6 x 1e6 floats (4 EB): must be an error (shape mismatch), never an allocation."""
    shape = np.array([10**6, 10**6, 10**6], np.int64)
    nodes = [helper.make_node("Reshape", ["x", "S"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    m = _raw_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                   [helper.make_tensor_value_info("y", F32, None)], [numpy_helper.from_array(shape, "S")])
    _, res = probe_in_child(save(m, tmp_path), {"x": np.ones((2, 4), np.float32)}, tmp_path=tmp_path)
    assert not res.get("ran"), res
    assert res["error"] or res["run_error"]


def test_expand_to_a_giant_shape_fails_cleanly(tmp_path):
    """Expand a scalar to 2^20 x 2^20 (4 TiB): the run fails with an error; address space is capped at 8 GiB."""
    shape = np.array([2**20, 2**20], np.int64)
    nodes = [helper.make_node("Expand", ["x", "S"], ["e"], name="expand"),
             helper.make_node("Relu", ["e"], ["y"], name="relu")]
    m = _raw_model(nodes, [helper.make_tensor_value_info("x", F32, [1])],
                   [helper.make_tensor_value_info("y", F32, None)], [numpy_helper.from_array(shape, "S")])
    _, res = probe_in_child(save(m, tmp_path), {"x": np.ones((1,), np.float32)}, tmp_path=tmp_path)
    assert not res.get("ran"), res
    assert res["error"] or res["run_error"]


def test_huge_static_input_shape_does_not_allocate_at_compile(tmp_path):
    """x declared [2^31, 2^31]: compiling must not allocate per declared element (no run is attempted)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Tanh", ["r"], ["y"], name="tanh")]
    m = _raw_model(nodes, [helper.make_tensor_value_info("x", F32, [2**31, 2**31])],
                   [helper.make_tensor_value_info("y", F32, [2**31, 2**31])])
    _child, res = probe_in_child(save(m, tmp_path), tmp_path=tmp_path)
    assert res["created"] or res["error"]


def _nan_inf(shape) -> np.ndarray:
    a = RNG.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    flat[::3] = np.nan
    flat[1::5] = np.inf
    flat[2::7] = -np.inf
    return a


def test_nan_and_inf_in_weights_and_inputs_match_the_cpu_ep(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "B"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "C"], ["m"], name="mul"),
             helper.make_node("Softmax", ["m"], ["y"], name="softmax", axis=-1)]
    m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 16])],
                   [helper.make_tensor_value_info("y", F32, [4, 8])],
                   {"W": _nan_inf((16, 8)), "B": _nan_inf((8,)), "C": RNG.standard_normal((4, 8)).astype(np.float32)})
    x = _nan_inf((4, 16))
    x[0] = RNG.standard_normal(16)  # one finite row, so not every output is NaN
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.where(np.arange(16 * 8).reshape(16, 8) < 8, 0.5, _nan_inf((16, 8))).astype(np.float32), "W"))
    _, res = probe_in_child(save(m, tmp_path), {"x": x}, tmp_path=tmp_path)
    assert res["ran"], res
    assert set(res["assignment"].values()) == {"NpuEP"}, res["assignment"]
    expected = cpu_run(m, {"x": x})[0]
    np.testing.assert_allclose(res["outputs"][0], expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(res["outputs"][0]), np.isnan(expected))


@pytest.mark.parametrize("op", ["Relu", "Tanh", "Sigmoid", "Exp", "Abs", "Neg"])
def test_special_values_through_elementwise_ops_match_cpu(op):
    from npu_testing import assignment, npu_session

    m = make_model([helper.make_node(op, ["x"], ["y"], name="op")], [helper.make_tensor_value_info("x", F32, [12])],
                   [helper.make_tensor_value_info("y", F32, [12])])
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 88.8, -88.8, 1.0], np.float32)
    sess = npu_session(m)
    assert assignment(sess).get("op") == "NpuEP"
    got = sess.run(None, {"x": x})[0]
    # atol: the CPU EP flushes denormals in some ops
    np.testing.assert_allclose(got, cpu_run(m, {"x": x})[0], rtol=1e-6, atol=1.2e-38, equal_nan=True)


@pytest.mark.parametrize("bad", ["float64", "int32", "wrong_rank", "wrong_inner_dim", "empty_batch", "missing_input"])
def test_wrong_input_at_run_time_is_an_error_or_correct(tmp_path, bad):
    m = two_partition_model()
    feeds = {"float64": {"x": np.ones((3, 16), np.float64)}, "int32": {"x": np.ones((3, 16), np.int32)},
             "wrong_rank": {"x": np.ones((3, 16, 1), np.float32)},
             "wrong_inner_dim": {"x": np.ones((3, 15), np.float32)},
             "empty_batch": {"x": np.ones((0, 16), np.float32)},
             "missing_input": {"z": np.ones((3, 16), np.float32)}}[bad]
    _, res = probe_in_child(save(m, tmp_path), feeds, tmp_path=tmp_path)
    assert res["created"], res
    if bad == "empty_batch":  # a legal input: must run and agree with the CPU EP
        assert res["ran"], res
        np.testing.assert_array_equal(res["outputs"][0], cpu_run(m, feeds)[0])
    else:
        assert not res["ran"] and res["run_error"], res


@pytest.mark.parametrize("feed_shape", [(3, 15), (3, 17), (3, 0), (0, 16)])
def test_inconsistent_symbolic_shapes_reach_the_ep_and_fail_cleanly(tmp_path, feed_shape):
    """x is [N, K] with K symbolic, W is [16, 8]: ORT cannot check K, so NpuEP's MatMul gets the bad shape."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    m = make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", "K"])],
                   [helper.make_tensor_value_info("y", F32, ["N", 8])],
                   {"W": RNG.standard_normal((16, 8)).astype(np.float32)})
    feeds = {"x": np.ones(feed_shape, np.float32)}
    _, res = probe_in_child(save(m, tmp_path), feeds, tmp_path=tmp_path)
    assert res["assignment"].get("mm") == "NpuEP", res
    if feed_shape[1] == 16:  # legal (empty batch): same as the CPU EP
        assert res["ran"], res
        np.testing.assert_array_equal(res["outputs"][0], cpu_run(m, feeds)[0])
    else:
        msg = res["run_error"] or ""
        assert not res["ran"] and "node 'mm" in msg and "MatMul" in msg, res  # names the (possibly fused) node
        assert f"float32{list(feed_shape)}".replace(" ", "") in msg.replace(" ", ""), msg  # and the bad shape
