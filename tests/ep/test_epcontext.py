"""Compiled contexts: EPContext dump/reload (both embed modes, several partitions), the on-disk cache, and refusals."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper
from npu_testing import F32, assignment, make_model, npu_session, save

from npu_ep.ep import entry_points

RNG = np.random.default_rng(7)


def model_with_cpu_node_between(w_scale: float = 1.0, static: bool = False):
    """mm1 -> relu -> [Atan on CPU] -> mm2 -> tanh: two NpuEP partitions around a CPU node."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Atan", ["r"], ["e"], name="atan"),  # on no target
             helper.make_node("MatMul", ["e", "W2"], ["m"], name="mm2"),
             helper.make_node("Tanh", ["m"], ["y"], name="tanh")]
    rng = np.random.default_rng(3)
    inits = {"W1": (rng.standard_normal((16, 32)) * w_scale).astype(np.float32),
             "W2": rng.standard_normal((32, 8)).astype(np.float32)}
    batch = 2 if static else "N"
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [batch, 16])],
                      [helper.make_tensor_value_info("y", F32, [batch, 8])], inits)


def elementwise_model():
    """Ops both built-in targets run (static shapes), for cross-target refusal tests."""
    nodes = [helper.make_node("Add", ["x", "b"], ["h"], name="add"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 8])],
                      [helper.make_tensor_value_info("y", F32, [2, 8])], {"b": np.ones(8, np.float32)})


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = entry_points.compile_partition

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(entry_points, "compile_partition", counting)
    return calls


def _dump(tmp_path, model, embed: int, prefix: str = "", options=None):
    src = save(model, tmp_path)
    ctx = str(tmp_path / "model_ctx.onnx")
    sess = npu_session(src, options, **{"ep.context_enable": "1", "ep.context_file_path": ctx,
                                         "ep.context_embed_mode": str(embed), "ep.context_node_name_prefix": prefix})
    return src, ctx, sess


@pytest.mark.parametrize("embed", [1, 0])
def test_dump_and_reload_several_partitions_without_recompiling(tmp_path, embed, count_compiles):
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    _, ctx, first = _dump(tmp_path, model_with_cpu_node_between(), embed, prefix="npu_")
    expected = first.run(None, {"x": x})[0]
    assert len(count_compiles) == 2

    ctx_model = onnx.load(ctx)
    ep_nodes = [n for n in ctx_model.graph.node if n.op_type == "EPContext"]
    assert len(ep_nodes) == 2 and [n.op_type for n in ctx_model.graph.node].count("Atan") == 1
    for n in ep_nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert n.domain == "com.microsoft" and attrs["partition_name"].startswith(b"npu_")
        assert attrs["source"] == b"NpuEP" and attrs["main_context"] == 1 and attrs["embed_mode"] == embed
        assert attrs["hardware_architecture"] == b"npu-ref" and attrs["ep_sdk_version"]
        if embed == 0:
            payload = attrs["ep_cache_context"].decode()
            assert not os.path.isabs(payload) and (tmp_path / payload).is_file()

    count_compiles.clear()
    second = npu_session(ctx)
    np.testing.assert_array_equal(second.run(None, {"x": x})[0], expected)
    assert count_compiles == []  # loaded, not recompiled
    where = assignment(second)
    assert [where[n.name] for n in ep_nodes] == ["NpuEP", "NpuEP"] and where["atan"] == "CPUExecutionProvider"


def test_cache_hit_skips_compile_and_any_weight_change_misses(tmp_path, count_compiles):
    cache = {"cache_dir": str(tmp_path / "cache")}
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    y1 = npu_session(model_with_cpu_node_between(), cache).run(None, {"x": x})[0]
    assert len(count_compiles) == 2
    y2 = npu_session(model_with_cpu_node_between(), cache).run(None, {"x": x})[0]
    assert len(count_compiles) == 2 and np.array_equal(y1, y2)  # both partitions from the cache
    changed = model_with_cpu_node_between()
    w = onnx.numpy_helper.to_array(changed.graph.initializer[0]).copy()
    w[0, 0] += 1.0
    changed.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, "W1"))
    npu_session(changed, cache)
    assert len(count_compiles) == 3  # the partition holding W1 recompiled, the other one reused


def test_cache_key_depends_on_target(tmp_path, count_compiles):
    cache = {"cache_dir": str(tmp_path / "cache")}
    npu_session(elementwise_model(), {**cache, "target": "npu-ref"})
    npu_session(elementwise_model(), {**cache, "target": "npu-edge"})
    assert len(count_compiles) == 2


def test_cache_key_depends_on_compiler_version(tmp_path, count_compiles, monkeypatch):
    from npu_ep.ep import compiler_version

    cache = {"cache_dir": str(tmp_path / "cache")}
    npu_session(elementwise_model(), cache)
    monkeypatch.setattr(compiler_version, "COMPILER_VERSION", compiler_version.COMPILER_VERSION + "-next")
    npu_session(elementwise_model(), cache)
    assert len(count_compiles) == 2


def test_corrupt_cache_entry_is_rebuilt_with_a_warning(tmp_path, count_compiles):
    cache_dir = tmp_path / "cache"
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    expected = npu_session(elementwise_model(), {"cache_dir": str(cache_dir)}).run(None, {"x": x})[0]
    entries = [p for p in cache_dir.rglob("*") if p.is_file()]
    assert len(entries) == 1
    data = bytearray(entries[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    with pytest.warns(Warning, match="corrupt"):
        sess = npu_session(elementwise_model(), {"cache_dir": str(cache_dir)})
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], expected)
    assert len(count_compiles) == 2


def test_flipped_byte_in_external_payload_is_a_clear_error(tmp_path):
    _, ctx, _ = _dump(tmp_path, elementwise_model(), embed=0)
    payload = next(tmp_path.glob("*.npuctx"))
    data = bytearray(payload.read_bytes())
    data[-10] ^= 0x01
    payload.write_bytes(bytes(data))
    with pytest.raises(Exception, match="corrupt context binary"):
        npu_session(ctx)


def test_external_payload_of_format_1_is_refused_with_how_to_recompile(tmp_path):
    """An EPContext model dumped by an older NpuEP (format 1: sections hashed with SHA-256 under ``sha256``)."""
    from npu_ep.context_cache import container as C

    _, ctx, _ = _dump(tmp_path, elementwise_model(), embed=0)
    payload = next(tmp_path.glob("*.npuctx"))
    raw = payload.read_bytes()
    hlen = C.PREFIX.unpack_from(raw, 0)[3]
    data = raw[C._align(C.PREFIX_SIZE + hlen):]
    doc = json.loads(raw[C.PREFIX_SIZE:C.PREFIX_SIZE + hlen])
    for row in doc["arrays"]:
        del row["blake3"]
        row["sha256"] = hashlib.sha256(data[row["offset"]:row["offset"] + row["nbytes"]]).hexdigest()
    jb = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    head = jb + bytes(C._align(C.PREFIX_SIZE + len(jb)) - C.PREFIX_SIZE - len(jb))
    total = C.PREFIX_SIZE + len(head) + len(data)
    digest = hashlib.sha256(C.PREFIX.pack(C.MAGIC, 1, 0, len(jb), total, bytes(32))[:C.HASHED_PREFIX] + jb).digest()
    payload.write_bytes(C.PREFIX.pack(C.MAGIC, 1, 0, len(jb), total, digest) + head + data)
    with pytest.raises(Exception, match=rf"{payload.name}.*format_version at offset 8 is 1 \(written by an older "
                                        r"NpuEP\).*ep\.context_enable=1 to recompile"):
        npu_session(ctx)


@pytest.mark.parametrize("bad_path", ["/etc/passwd", "../outside.npuctx", "sub/../../outside.npuctx"])
def test_payload_path_escaping_the_model_directory_is_refused(tmp_path, bad_path):
    _, ctx, _ = _dump(tmp_path, elementwise_model(), embed=0)
    model = onnx.load(ctx)
    for n in model.graph.node:
        if n.op_type == "EPContext":
            for a in n.attribute:
                if a.name == "ep_cache_context":
                    a.s = bad_path.encode()
    onnx.save(model, ctx)
    with pytest.raises(Exception, match="refusing"):
        npu_session(ctx)


def test_context_compiled_for_another_target_is_refused_with_how_to_recompile(tmp_path):
    _, ctx, _ = _dump(tmp_path, elementwise_model(), embed=1, options={"target": "npu-edge"})
    with pytest.raises(Exception) as info:
        npu_session(ctx, {"target": "npu-ref"})
    msg = str(info.value)
    assert "npu-edge" in msg and "npu-ref" in msg and "recompile" in msg


def test_disk_full_while_writing_an_external_payload_names_the_file(tmp_path, monkeypatch):
    """ENOSPC surfaces from fsync/write as an OSError naming no file; the error must say which payload of which
    partition could not be written (the disk is not really filled: fsync is made to fail as a full disk does)."""
    import errno

    from npu_ep import _atomic

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic.os, "fsync", full_disk)
    with pytest.raises(Exception) as info:
        _dump(tmp_path, elementwise_model(), embed=0)
    msg = str(info.value)
    assert "No space left on device" in msg and "EPContext payload" in msg, msg
    assert str(tmp_path / "model_ctx_") in msg and ".npuctx" in msg, msg
    assert "At:" not in msg and __file__ not in msg, msg  # no Python frames (ep/entry_points.py error_text)
    assert not list(tmp_path.glob("*.npuctx")) and not list(tmp_path.glob(".*.tmp"))
