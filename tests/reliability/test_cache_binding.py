"""A cache entry is bound to its key: a valid entry of model A copied over model B's entry name is refused and
rebuilt with a warning, so a session for B never runs A's weights (issue 14, item 1)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
from _child import static_model
from npu_testing import assignment, cpu_run, npu_session, save

from npu_ep.context_cache.store import SUFFIX, CacheStore, CacheWarning
from npu_ep.ep.entry_points import LIVE_SESSIONS

X = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)


def _session(model: str, cache) -> tuple[np.ndarray, dict, list[str], dict]:
    """Create + run an NpuEP session on ``cache``; (output, stats, CacheWarnings, node -> EP)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = npu_session(model, {"cache_dir": str(cache)})
        out = sess.run(None, {"x": X})[0]
    stats = next(dict(s.compiled.stats) for s in LIVE_SESSIONS if s.compiled.store is not None
                 and s.compiled.store.root == cache)
    LIVE_SESSIONS.clear()
    return out, stats, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)], assignment(sess)


def _only_entry(cache) -> str:
    [p] = [p for p in cache.iterdir() if p.name.endswith(SUFFIX)]
    return p.name


@pytest.fixture
def two_models(tmp_path):
    """Models A and B: same graph and I/O, different weights (one NpuEP partition, so one cache entry each)."""
    a = save(static_model(seed=1), tmp_path, "a.onnx")
    b = save(static_model(seed=2), tmp_path, "b.onnx")
    return a, b


def test_an_entry_copied_over_another_models_entry_is_refused_and_rebuilt(tmp_path, two_models):
    a, b = two_models
    expected_b = cpu_run(b, {"x": X})[0]
    assert not np.allclose(cpu_run(a, {"x": X})[0], expected_b)  # the swap would be visible in the outputs
    _session(a, tmp_path / "ca")
    _session(b, tmp_path / "cb")
    name_a, name_b = _only_entry(tmp_path / "ca"), _only_entry(tmp_path / "cb")
    assert name_a != name_b
    shutil.copyfile(tmp_path / "ca" / name_a, tmp_path / "cb" / name_b)  # A's valid entry under B's key

    out, stats, warns, where = _session(b, tmp_path / "cb")
    assert set(where.values()) == {"NpuEP"}, where
    np.testing.assert_allclose(out, expected_b, rtol=1e-6, atol=1e-6)  # B's weights, not A's
    assert stats["hits"] == 0 and stats["misses"] == 1, stats
    assert any("copied or swapped" in w and name_b in w for w in warns), warns
    # the entry was rebuilt for B: the next session hits it, and it verifies (bound to its key)
    assert [e.ok for e in CacheStore(tmp_path / "cb").verify_all()] == [True]
    out2, stats2, warns2, _ = _session(b, tmp_path / "cb")
    np.testing.assert_array_equal(out2, out)
    assert stats2["hits"] == 1 and not warns2, (stats2, warns2)


def test_npu_cache_verify_flags_a_swapped_entry(tmp_path, two_models, capsys):
    from npu_ep.tools.npu_cache import main

    a, b = two_models
    _session(a, tmp_path / "ca")
    _session(b, tmp_path / "cb")
    name_a, name_b = _only_entry(tmp_path / "ca"), _only_entry(tmp_path / "cb")
    shutil.copyfile(tmp_path / "ca" / name_a, tmp_path / "cb" / name_b)
    [entry] = CacheStore(tmp_path / "cb").entries()
    assert not entry.ok and "copied or swapped" in entry.error
    assert main(["--dir", str(tmp_path / "cb"), "verify"]) == 1
    assert "CORRUPT" in capsys.readouterr().out


def test_put_refuses_a_container_written_for_another_key(tmp_path):
    from npu_ep.context_cache import container as C
    from npu_ep.context_cache.keys import cache_key

    meta = C.ContainerMeta("0.1.0", "npu-ref", "a1" * 32, cache_key("model A"))
    blob = C.pack({}, {"w": np.zeros(4, np.int8)}, meta=meta)
    with pytest.raises(ValueError, match="source_key must be the key"):
        CacheStore(tmp_path).put(cache_key("model B"), blob)
    assert list(tmp_path.iterdir()) == []
