"""0-d constants (torch's ``x[:, 0]``, a Gather with a scalar index, scalar arithmetic) keep rank 0 through
compile, the context cache and EPContext; a (1,) constant would broadcast one extra dim into the output."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session, save

RNG = np.random.default_rng(5)


def select_and_scale_model():
    """y = x[:, 0] * 2 + 1 with every constant 0-d; y's leading dim is symbolic, as exporters write it."""
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
             helper.make_node("Mul", ["g", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "one"], ["y"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 3, 128])],
                      [helper.make_tensor_value_info("y", F32, ["N", 128])],
                      {"idx": np.array(0, np.int64), "two": np.array(2.0, np.float32),
                       "one": np.array(1.0, np.float32)})


def scalar_output_model():
    """A 0-d result: Gather of a scalar index from a 1-D input, times a 0-d constant."""
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=0, name="gather"),
             helper.make_node("Mul", ["g", "half"], ["y"], name="mul")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [5])],
                      [helper.make_tensor_value_info("y", F32, [])],
                      {"idx": np.array(-2, np.int64), "half": np.array(0.5, np.float32)})


@pytest.mark.parametrize("build, feeds", [
    (select_and_scale_model, {"x": RNG.standard_normal((2, 3, 128)).astype(np.float32)}),
    (scalar_output_model, {"x": RNG.standard_normal(5).astype(np.float32)}),
])
def test_rank0_constants_keep_rank0_on_npu(build, feeds):
    model = build()
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    got, ref = sess.run(None, feeds)[0], cpu_run(model, feeds)[0]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def test_rank0_constants_survive_the_context_cache(tmp_path):
    model = select_and_scale_model()
    feeds = {"x": RNG.standard_normal((3, 3, 128)).astype(np.float32)}
    cache = {"cache_dir": str(tmp_path / "cache")}
    npu_session(model, cache).run(None, feeds)
    sess = npu_session(model, cache)  # programs now come from the cache container
    assert set(assignment(sess).values()) == {"NpuEP"}
    np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])


def test_rank0_constants_survive_epcontext(tmp_path):
    model = select_and_scale_model()
    feeds = {"x": RNG.standard_normal((1, 3, 128)).astype(np.float32)}
    ctx = str(tmp_path / "model_ctx.onnx")
    npu_session(save(model, tmp_path), **{"ep.context_enable": "1", "ep.context_file_path": ctx})
    sess = npu_session(ctx)
    assert set(assignment(sess).values()) == {"NpuEP"}
    np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])

