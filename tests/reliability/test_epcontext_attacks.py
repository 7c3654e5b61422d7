"""Attacks on the EP-side EPContext loader (ep/epcontext.py): mutated embedded payloads, corrupt or escaping external
payloads, contexts compiled for another target or compiler — always a clear refusal, never a crash or wrong result."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from _child import HERE, PYTHON, assert_no_crash, run_child, static_model
from npu_testing import assignment, npu_session, save

from npu_ep.context_cache.container import pack, unpack

X = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)


def _compile(tmp_path, embed: int, target: str = "npu-ref", name: str = "model_ctx.onnx"):
    src = save(static_model(), tmp_path)
    ctx = str(tmp_path / name)
    sess = npu_session(src, {"target": target}, **{"ep.context_enable": "1", "ep.context_file_path": ctx,
                                                   "ep.context_embed_mode": str(embed)})
    expected = sess.run(None, {"x": X})[0]
    return ctx, expected


def _attr(model: onnx.ModelProto, name: str) -> onnx.AttributeProto:
    return next(a for a in model.graph.node[0].attribute if a.name == name)


def _error(ctx: str, **opts) -> str:
    with pytest.raises(Exception) as info:
        npu_session(ctx, opts or None)
    return str(info.value)


@pytest.mark.parametrize("embed", [1, 0])
def test_context_round_trip_runs_on_npu_with_identical_results(tmp_path, embed):
    ctx, expected = _compile(tmp_path, embed)
    sess = npu_session(ctx)
    assert set(assignment(sess).values()) == {"NpuEP"}
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], expected)


def _fuzz(mode: str, n: int, timeout: float) -> dict:
    import subprocess

    p = subprocess.run([PYTHON, os.path.join(HERE, "_fuzz_epcontext.py"), mode, str(n)], capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode in (0, 1), f"fuzzer crashed: rc={p.returncode}\n{p.stderr[-3000:]}"
    figures = json.loads(p.stdout.strip().splitlines()[-1])
    figures["rc"] = p.returncode
    return figures


def test_fuzzed_embedded_payload_bytes_are_all_detected():
    f = _fuzz("bytes", 200, timeout=300)
    assert f["cases"] == 200 and f["non_runtime_errors"] == 0, f
    assert f["accepted_changed"] == 0 and f["wrong_results"] == 0, f  # every changed byte is caught by a hash
    assert f["refused"] + f["accepted_same_bytes"] == f["cases"], f


@pytest.mark.slow
def test_fuzzed_embedded_payload_bytes_5000():
    f = _fuzz("bytes", 5000, timeout=3600)
    assert f["accepted_changed"] == 0 and f["wrong_results"] == 0 and f["rc"] == 0, f


def test_fuzzed_payload_locations_are_refused_naming_the_node_or_run_the_valid_payload():
    """embed_mode=0 locations: NUL, non-UTF-8, escapes, FIFO, /dev/zero, folder, sparse file, random text."""
    f = _fuzz("paths", 150, timeout=300)
    assert f["cases"] == 150 and f["non_runtime_errors"] == 0 and f["wrong_results"] == 0, f
    assert f["refused"] + f["accepted_same_bytes"] == f["cases"] and f["accepted_same_bytes"] >= 3, f


def test_hostile_headers_with_valid_hashes_never_crash():
    """Re-signed containers with mutated program headers reach program_from_parts and the kernels."""
    f = _fuzz("header", 150, timeout=300)
    assert f["cases"] >= 100 and f["refused"] > 0, f


def _repack(payload: bytes, edit_header=None, arrays_edit=None, **meta_changes) -> bytes:
    import dataclasses

    c = unpack(payload)
    header = json.loads(json.dumps(c.header))
    if edit_header:
        edit_header(header)
    arrays = {k: np.array(v) for k, v in c.arrays.items()}
    if arrays_edit:
        arrays_edit(arrays)
    return pack(header, arrays,
                meta=dataclasses.replace(c.meta, **meta_changes))


def _with_payload(ctx: str, blob: bytes, tmp_path, name="evil_ctx.onnx") -> str:
    m = onnx.load(ctx)
    _attr(m, "ep_cache_context").s = blob
    out = str(tmp_path / name)
    onnx.save(m, out)
    return out


def test_program_that_never_writes_its_output_is_refused(tmp_path):
    ctx, _ = _compile(tmp_path, 1)
    payload = _attr(onnx.load(ctx), "ep_cache_context").s
    evil = _with_payload(ctx, _repack(payload, lambda h: h["steps"].pop()), tmp_path)  # drop the Relu step
    try:
        sess = npu_session(evil)
    except Exception:  # noqa: BLE001 - refused at load: fine
        return
    with pytest.raises(Exception):  # noqa: B017 - any refusal will do, as long as it is not a crash
        got = sess.run(None, {"x": X})[0]
        print("accepted output", got.dtype, got.shape)


def test_context_from_another_compiler_version_is_refused(tmp_path):
    ctx, _ = _compile(tmp_path, 1)
    payload = _attr(onnx.load(ctx), "ep_cache_context").s
    evil = _with_payload(ctx, _repack(payload, compiler_version="0.0.0+c0"), tmp_path)
    msg = _error(evil)
    assert "0.0.0+c0" in msg and "recompile" in msg, msg


@pytest.mark.parametrize("embed", [1, 0])
def test_context_compiled_for_another_target_is_refused(tmp_path, embed):
    ctx, _expected = _compile(tmp_path, embed, target="npu-edge")
    assert set(assignment(npu_session(ctx, {"target": "npu-edge"})).values()) == {"NpuEP"}
    msg = _error(ctx, target="npu-ref")
    assert "npu-edge" in msg and "npu-ref" in msg and "recompile" in msg, msg
    # and the other way round
    ctx2, _ = _compile(tmp_path, embed, target="npu-ref", name="ref_ctx.onnx")
    msg = _error(ctx2, target="npu-edge")
    assert "compiled for target 'npu-ref'" in msg and "npu-edge" in msg and "recompile" in msg, msg


def _payload_file(ctx: str) -> str:
    return os.path.join(os.path.dirname(ctx), _attr(onnx.load(ctx), "ep_cache_context").s.decode())


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_flipped_byte_in_an_external_payload_is_a_clear_error(tmp_path, where):
    ctx, _ = _compile(tmp_path, 0)
    path = _payload_file(ctx)
    data = bytearray(Path(path).read_bytes())
    i = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[i] ^= 0x01
    Path(path).write_bytes(bytes(data))
    msg = _error(ctx)
    assert "corrupt context binary" in msg and os.path.basename(path) in msg, msg


def test_truncated_or_missing_external_payload_is_a_clear_error(tmp_path):
    ctx, _ = _compile(tmp_path, 0)
    path = _payload_file(ctx)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 3])
    assert "corrupt context binary" in _error(ctx)
    os.remove(path)
    assert "cannot read payload" in _error(ctx)


def _point_payload_at(ctx: str, location: str, tmp_path) -> str:
    m = onnx.load(ctx)
    _attr(m, "ep_cache_context").s = location.encode()
    out = str(tmp_path / "evil_ctx.onnx")
    onnx.save(m, out)
    return out


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "nested_dotdot", "symlink_out"])
def test_payload_path_escaping_the_model_dir_is_refused(tmp_path, kind):
    ctx, _ = _compile(tmp_path, 0)
    real = _payload_file(ctx)
    outside = tmp_path.parent / f"outside_{tmp_path.name}.npuctx"
    outside.write_bytes(Path(real).read_bytes())  # a VALID payload, just outside the folder
    try:
        if kind == "absolute":
            loc = str(outside)
        elif kind == "dotdot":
            loc = f"../{outside.name}"
        elif kind == "nested_dotdot":
            (tmp_path / "sub").mkdir()
            loc = f"sub/../../{outside.name}"
        else:
            os.symlink(outside, tmp_path / "link.npuctx")
            loc = "link.npuctx"
        msg = _error(_point_payload_at(ctx, loc, tmp_path))
        assert "refusing" in msg and ("absolute" in msg or "escapes the model directory" in msg), msg
    finally:
        outside.unlink()


def test_payload_path_that_is_a_directory_is_a_clear_error(tmp_path):
    ctx, _ = _compile(tmp_path, 0)
    (tmp_path / "dir.npuctx").mkdir()
    assert "not a regular file" in _error(_point_payload_at(ctx, "dir.npuctx", tmp_path))


def _assert_session_refused_in_child(model: str, timeout: float = 60) -> None:
    """Creating an NpuEP session on ``model`` in a child process is refused with an error: no crash, no hang."""
    child = run_child(f"""
        from npu_testing import npu_session
        try:
            npu_session({model!r}); print("ACCEPTED")
        except Exception as e:
            print("REFUSED", " ".join(str(e).split())[:400])
    """, timeout=timeout)
    assert_no_crash(child)
    assert child.last_line().startswith("REFUSED"), child.stdout


def test_payload_path_that_is_a_fifo_does_not_hang(tmp_path):
    """A named pipe inside the model folder: reading it would block forever. Must fail, not hang."""
    ctx, _ = _compile(tmp_path, 0)
    os.mkfifo(tmp_path / "pipe.npuctx")
    evil = _point_payload_at(ctx, "pipe.npuctx", tmp_path)
    _assert_session_refused_in_child(evil, timeout=5)


@pytest.mark.parametrize("mutation", ["embed_mode_2", "no_payload", "empty_payload", "source_other_ep",
                                      "payload_is_text"])
def test_malformed_epcontext_nodes_give_clear_errors(tmp_path, mutation):
    ctx, _ = _compile(tmp_path, 1)
    m = onnx.load(ctx)
    node = m.graph.node[0]
    if mutation == "embed_mode_2":
        _attr(m, "embed_mode").i = 2
    elif mutation == "no_payload":
        node.attribute.remove(_attr(m, "ep_cache_context"))
    elif mutation == "empty_payload":
        _attr(m, "ep_cache_context").s = b""
    elif mutation == "source_other_ep":
        _attr(m, "source").s = b"QNNExecutionProvider"
    else:
        _attr(m, "ep_cache_context").s = b"import os; os.system('touch /tmp/pwned')"
    evil = str(tmp_path / "evil_ctx.onnx")
    onnx.save(m, evil)
    _assert_session_refused_in_child(evil)


def test_absurd_slot_count_in_a_header_is_refused_at_load(tmp_path):
    ctx, _ = _compile(tmp_path, 1)
    payload = _attr(onnx.load(ctx), "ep_cache_context").s

    def edit(h):
        h["n_slots"] = 2**28

    evil = _with_payload(ctx, _repack(payload, edit), tmp_path)
    child = run_child(f"""
        import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import numpy as np
        from npu_testing import npu_session
        try:
            s = npu_session({evil!r})
        except Exception as e:
            print("REFUSED", " ".join(str(e).split())[:300]); raise SystemExit(0)
        try:
            s.run(None, {{"x": np.ones((2, 8), np.float32)}}); print("RAN")
        except Exception as e:
            print("RUN_FAILED", " ".join(str(e).split())[:300])
    """, timeout=60)
    assert_no_crash(child)
    assert child.last_line().startswith("REFUSED"), child.stdout


def test_program_output_contradicting_the_declared_shape_is_never_silent(tmp_path, caplog):
    """Re-signed header: Mul reads only its constant, and that constant is empty -> output float32[0] where the graph
    declares [2, 8]. Refused at load, or the run reports the contradiction naming the node: a shape, or a rank, other
    than the graph declares is a warning as in ORT's own executor (exporters declare wrong output shapes and the CPU
    EP runs those models; a re-signed program could as well return wrong values of the declared shape)."""
    ctx, _ = _compile(tmp_path, 1)
    payload = _attr(onnx.load(ctx), "ep_cache_context").s

    def edit(h):
        h["steps"][1]["in"] = [-1]

    def arrays(a):
        a["1/in1"] = np.zeros((0,), np.float32)

    evil = _with_payload(ctx, _repack(payload, edit, arrays), tmp_path)
    try:
        sess = npu_session(evil)
    except Exception:  # noqa: BLE001 - refused at load: fine
        return
    with caplog.at_level("WARNING", logger="npu_ep"):
        try:
            got = sess.run(None, {"x": X})[0]
        except Exception:  # noqa: BLE001 - refused at run: fine
            return
    assert got.shape != X.shape
    assert any("has shape [0] but the graph declares [2,8]" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


def test_payload_path_with_a_nul_byte_names_the_node(tmp_path):
    """Issue 14 item 7: a NUL in ep_cache_context used to raise a bare ValueError ("embedded null byte")."""
    ctx, _ = _compile(tmp_path, 0)
    node_name = onnx.load(ctx).graph.node[0].name
    for loc in ("model_ctx.npuctx\0.txt", "\0"):
        msg = _error(_point_payload_at(ctx, loc, tmp_path))
        assert "NUL" in msg and node_name in msg and "EPContext" in msg, msg


def test_payload_path_that_is_not_utf8_names_the_node(tmp_path):
    ctx, _ = _compile(tmp_path, 0)
    m = onnx.load(ctx)
    _attr(m, "ep_cache_context").s = b"\xff\xfe.npuctx"
    evil = str(tmp_path / "evil_ctx.onnx")
    onnx.save(m, evil)
    msg = _error(evil)
    assert "not UTF-8" in msg and m.graph.node[0].name in msg, msg


@pytest.mark.parametrize("kind", ["sparse_zeros", "valid_then_hole"])
def test_huge_sparse_payload_is_refused_without_reading_it(tmp_path, kind):
    ctx, _ = _compile(tmp_path, 0)
    path = _payload_file(ctx)
    valid = Path(path).read_bytes()
    with open(path, "wb") as f:
        if kind == "valid_then_hole":
            f.write(valid)
        f.truncate(2 << 30)
    child = run_child(f"""
        from npu_testing import npu_session
        from npu_ep.tools.bench.peak_rss import peak_rss_bytes
        rss0 = peak_rss_bytes() / 1024
        try:
            npu_session({ctx!r}); print("ACCEPTED")
        except Exception as e:
            growth = (peak_rss_bytes() / 1024 - rss0) / 1024
            print("REFUSED", round(growth), " ".join(str(e).split())[:400])
    """, timeout=60)
    assert_no_crash(child)
    verdict, growth, msg = child.last_line().split(" ", 2)
    assert verdict == "REFUSED" and "corrupt context binary" in msg, child.stdout
    assert int(growth) < 64, child.stdout  # MiB: refused from the 64-byte prefix, not read whole


def test_dump_never_writes_through_a_planted_symlink(tmp_path):
    """Issue 14 item 5: the embed_mode=0 dump wrote through a fixed '<payload>.tmp' that could be a symlink."""
    ctx, expected = _compile(tmp_path, 0)  # learn the payload's name, then dump again into the same folder
    name = os.path.basename(_payload_file(ctx))
    os.remove(_payload_file(ctx))
    os.remove(ctx)
    victim = tmp_path.parent / f"victim_{tmp_path.name}.txt"
    victim.write_bytes(b"precious")
    planted = [f"{name}.tmp", f".{name}.tmp", f".{name}.{os.getpid()}.tmp"]
    for p in planted:
        os.symlink(victim, tmp_path / p)
    try:
        ctx2, _ = _compile(tmp_path, 0)
        assert victim.read_bytes() == b"precious"
    finally:
        victim.unlink()
    assert ctx2 == ctx and os.path.basename(_payload_file(ctx2)) == name, "the same name was dumped again"
    assert not os.path.islink(_payload_file(ctx2))
    np.testing.assert_array_equal(npu_session(ctx2).run(None, {"x": X})[0], expected)
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".tmp")) == sorted(planted)  # none of ours left
