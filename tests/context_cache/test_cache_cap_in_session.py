"""A session whose cache_max_bytes is below the size of a valid shared cache entry works without caching that
entry, says so, and leaves the entry for the sessions it fits."""

from __future__ import annotations

import warnings

import numpy as np
from onnx import helper

from npu_ep.context_cache.store import CacheStore
from npu_ep.ep.entry_points import LIVE_SESSIONS
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session


def _model():
    w = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"],
                                                                                      name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 8])],
                      [helper.make_tensor_value_info("y", F32, [2, 8])], {"w": w})


def _session(model, options: dict[str, str]):
    before = set(LIVE_SESSIONS)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sess = npu_session(model, options, cpu=False)
    (ep,) = set(LIVE_SESSIONS) - before
    return sess, ep, [str(w.message) for w in rec]


def test_an_entry_larger_than_the_sessions_cap_is_not_called_corrupt_nor_removed(tmp_path):
    model = _model()
    _session(model, {"cache_dir": str(tmp_path)})
    (entry,) = tmp_path.glob("*.npuctx")
    size = entry.stat().st_size

    sess, ep, warns = _session(model, {"cache_dir": str(tmp_path), "cache_max_bytes": str(size - 1)})
    assert not any("corrupt" in w for w in warns), warns
    assert any("does not fit" in w and str(entry) in w for w in warns), warns
    assert ep.compiled.stats["hits"] == 0 and ep.compiled.stats["rebuilt"] == 0, ep.compiled.stats
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)

    assert entry.exists() and [e.ok for e in CacheStore(tmp_path).verify_all()] == [True]
    _, ep, _ = _session(model, {"cache_dir": str(tmp_path)})
    assert ep.compiled.stats["hits"] == 1, ep.compiled.stats  # the entry still serves a session it fits
