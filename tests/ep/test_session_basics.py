"""NpuEP as a user meets it: registration, provider options, claimed nodes, partitions, numerics vs the CPU EP."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session

import npu_ep

RNG = np.random.default_rng(0)


def mlp(batch="N", middle_op="Relu"):
    """x -> MatMul -> Add -> <middle_op> -> MatMul -> Add -> Softmax -> y"""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="add1"),
        helper.make_node(middle_op, ["h2"], ["h3"], name="middle"),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"], name="mm2"),
        helper.make_node("Add", ["h4", "b2"], ["h5"], name="add2"),
        helper.make_node("Softmax", ["h5"], ["y"], name="softmax", axis=-1),
    ]
    inits = {"W1": RNG.standard_normal((32, 64)).astype(np.float32), "b1": RNG.standard_normal(64).astype(np.float32),
             "W2": RNG.standard_normal((64, 16)).astype(np.float32), "b2": RNG.standard_normal(16).astype(np.float32)}
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [batch, 32])],
                      [helper.make_tensor_value_info("y", F32, [batch, 16])], inits)


def test_ep_name_and_library_path():
    assert npu_ep.get_ep_name() == "NpuEP"
    path = npu_ep.get_library_path()
    assert os.path.isabs(path) and os.path.isfile(path)


def test_register_is_idempotent_even_after_user_registration():
    npu_ep.register()
    npu_ep.register()
    with pytest.raises(Exception):  # noqa: B017 - ORT itself refuses a second registration under the same name...
        ort.register_execution_provider_library("NpuEP", npu_ep.get_library_path())
    npu_ep.register(force=True)  # ...but ours tolerates it (the user registered first)
    assert "NpuEP" in [d.ep_name for d in ort.get_ep_devices()]


def test_all_nodes_claimed_and_results_match_cpu():
    model = mlp()
    sess = npu_session(model)
    x = RNG.standard_normal((5, 32)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    (ref,) = cpu_run(model, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    where = assignment(sess)
    assert set(where.values()) == {"NpuEP"}, where
    assert len(npu_partitions(sess)) == 1


def test_symbolic_batch_dimension_runs_for_several_batches():
    model = mlp(batch="batch")
    sess = npu_session(model)
    for b in (1, 3, 17):
        x = RNG.standard_normal((b, 32)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert set(assignment(sess).values()) == {"NpuEP"}


def test_unsupported_op_in_the_middle_gives_two_partitions_and_a_cpu_node(caplog):
    model = mlp(middle_op="Atan")  # on no target
    sess = npu_session(model)
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    where = assignment(sess)
    assert where["middle"] == "CPUExecutionProvider"
    parts = npu_partitions(sess)  # ORT fuses MatMul+Add into Gemm before GetCapability: names vary, count not
    assert len(parts) == 2 and "softmax" in parts[1], parts
    assert all(ep == "NpuEP" for name, ep in where.items() if name != "middle"), where
    # the reason reaches the application's logging (pytest's here; stderr without any: test_decline_log.py)
    err = "\n".join(r.getMessage() for r in caplog.records if r.name == "npu_ep")
    assert "Atan x1 ('middle')" in err and "npu-ref" in err


def test_disable_cpu_fallback_refuses_session_and_our_reason_is_visible(caplog):
    model = mlp(middle_op="Atan")
    with pytest.raises(Exception) as info:
        npu_session(model, cpu=False, **{"session.disable_cpu_ep_fallback": "1"})
    assert "fallback" in str(info.value).lower()
    assert "Atan x1 ('middle')" in "\n".join(r.getMessage() for r in caplog.records if r.name == "npu_ep")


def test_target_option_changes_coverage():
    model = mlp(batch=4)  # npu-edge requires static shapes
    sess = npu_session(model, {"target": "npu-edge"})
    where = assignment(sess)
    matmuls = [n for n in where if n.startswith("mm")]  # MatMul or the Gemm ORT fused it into
    assert matmuls and all(where[n] == "CPUExecutionProvider" for n in matmuls), where  # no float matmul on edge
    assert where["middle"] == "NpuEP"


def test_target_option_accepts_a_file(tmp_path):
    from npu_ep.kernels.target import BUILTIN_DIR

    custom = tmp_path / "my-npu.toml"
    custom.write_text((BUILTIN_DIR / "npu-ref.toml").read_text().replace('name = "npu-ref"', 'name = "my-npu"'))
    sess = npu_session(mlp(), {"target": str(custom)})
    assert set(assignment(sess).values()) == {"NpuEP"}


def test_unknown_provider_option_is_an_error_listing_valid_ones():
    with pytest.raises(Exception) as info:
        npu_session(mlp(), {"tagret": "npu-ref"})
    msg = str(info.value)
    assert "tagret" in msg and "target" in msg and "cache_dir" in msg


def test_unknown_target_is_an_error_naming_it():
    with pytest.raises(Exception, match="no-such-npu"):
        npu_session(mlp(), {"target": "no-such-npu"})


def test_target_from_the_environment_is_used_and_a_bad_one_names_the_variable(monkeypatch):
    monkeypatch.setenv("NPU_EP_TARGET", "npu-edge")
    where = assignment(npu_session(mlp(batch=4)))
    assert where["middle"] == "NpuEP" and all(where[n] == "CPUExecutionProvider" for n in where if n.startswith("mm"))
    monkeypatch.setenv("NPU_EP_TARGET", "npu-nope")
    with pytest.raises(Exception, match=r"\$NPU_EP_TARGET='npu-nope'.*unknown target 'npu-nope'"):
        npu_session(mlp())
    assert set(assignment(npu_session(mlp(), {"target": "npu-ref"})).values()) == {"NpuEP"}  # the option wins
