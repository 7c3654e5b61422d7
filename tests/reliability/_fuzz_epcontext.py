"""Fuzz NpuEP's EPContext loader in-process (run as a script in a child so a crash is a return code).

    python _fuzz_epcontext.py bytes N    # mutate the embedded container bytes (flip/overwrite/truncate/insert/splice)
    python _fuzz_epcontext.py header N   # re-pack valid containers around a mutated program header (hashes valid)
    python _fuzz_epcontext.py paths N    # embed_mode=0 payload locations: NUL, non-UTF-8, escapes, FIFO, /dev/zero,
                                         # sparse and folder payloads (every refusal must name the node)

Prints one JSON line of figures. Exit 1 if a mutated payload was accepted and ran with different results (bytes
mode: if a changed payload was accepted at all) — the invariant is "every corruption detected, never silently
wrong"."""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _child import static_model
from npu_testing import npu_session, save

X = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)


def build_context(folder: str) -> tuple[onnx.ModelProto, bytes, np.ndarray]:
    path = save(static_model(), folder)
    ctx = os.path.join(folder, "model_ctx.onnx")
    npu_session(path, **{"ep.context_enable": "1", "ep.context_file_path": ctx, "ep.context_embed_mode": "1"})
    model = onnx.load(ctx)
    attr = next(a for a in model.graph.node[0].attribute if a.name == "ep_cache_context")
    expected = npu_session(ctx).run(None, {"x": X})[0]
    return model, attr.s, expected


def with_payload(model: onnx.ModelProto, payload: bytes) -> bytes:
    m = copy.deepcopy(model)
    next(a for a in m.graph.node[0].attribute if a.name == "ep_cache_context").s = payload
    return m.SerializeToString()


def mutations(n: int):
    flip = st.tuples(st.just("flip"), st.integers(0, n - 1), st.integers(1, 255))
    over = st.tuples(st.just("overwrite"), st.integers(0, n - 1), st.binary(min_size=1, max_size=64))
    trunc = st.tuples(st.just("truncate"), st.integers(0, n - 1), st.just(b""))
    ins = st.tuples(st.just("insert"), st.integers(0, n), st.binary(min_size=1, max_size=64))
    dup = st.tuples(st.just("splice"), st.integers(0, n - 1), st.integers(0, n - 1))
    return st.lists(st.one_of(flip, over, trunc, ins, dup), min_size=1, max_size=4)


def apply(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, i, arg in ops:
        i = min(i, len(b))
        if kind == "flip" and i < len(b):
            b[i] ^= arg
        elif kind == "overwrite":
            b[i:i + len(arg)] = arg
        elif kind == "truncate":
            del b[i:]
        elif kind == "insert":
            b[i:i] = arg
        elif kind == "splice" and b:
            j = min(arg, len(b) - 1)
            b[i:i + 8] = b[j:j + 8]
    return bytes(b)


def run(mode: str, n: int) -> dict:
    figures = {"mode": mode, "cases": 0, "refused": 0, "accepted_same_bytes": 0, "accepted_changed": 0,
               "wrong_results": 0, "ran_different": 0,
               "ran_wrong_signature": 0, "run_errors": 0, "non_runtime_errors": 0, "examples": []}
    with tempfile.TemporaryDirectory() as folder:
        model, payload, expected = build_context(folder)

        def check(blob: bytes) -> None:
            figures["cases"] += 1
            try:
                sess = npu_session(with_payload(model, blob))
            except Exception as exc:  # noqa: BLE001 - a refusal is counted, then its text checked
                figures["refused"] += 1
                msg = str(exc)
                if "EpContextError" not in msg and "EP_FAIL" not in msg and "Fail" not in msg:
                    figures["non_runtime_errors"] += 1
                    figures["examples"].append(msg[:300])
                return
            try:
                got = sess.run(None, {"x": X})[0]
                same = np.array_equal(got, expected, equal_nan=True)
                if not same:
                    figures["ran_different"] += 1
                    if got.shape != expected.shape or got.dtype != expected.dtype:
                        figures["ran_wrong_signature"] += 1
                        figures["examples"].append(f"output {got.dtype}{list(got.shape)} accepted for "
                                                   f"{expected.dtype}{list(expected.shape)}")
            except Exception:  # noqa: BLE001 - accepted, then failed at run: still an error, not a crash
                figures["run_errors"] += 1
                same = False
            if blob == payload:
                figures["accepted_same_bytes"] += 1
            else:
                figures["accepted_changed"] += 1
                if mode == "bytes":
                    figures["examples"].append(f"accepted changed payload ({len(blob)} bytes), same={same}")
            if not same:
                figures["wrong_results"] += 1

        if mode == "bytes":
            @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(mutations(len(payload)))
            def fuzz(ops):
                check(apply(payload, ops))
            fuzz()
        elif mode == "paths":
            fuzz_paths(folder, model, payload, expected, figures, n)
        else:
            from _header_mutations import fuzz_headers

            fuzz_headers(payload, check, n)
    figures["examples"] = figures["examples"][:5]
    return figures


def _path_corpus(folder: str, payload: bytes) -> list[bytes]:
    """Hostile objects inside the model folder, and the locations that name them."""
    os.mkfifo(os.path.join(folder, "pipe.npuctx"))
    os.symlink("/dev/zero", os.path.join(folder, "zero.npuctx"))
    os.mkdir(os.path.join(folder, "dir.npuctx"))
    with open(os.path.join(folder, "sparse.npuctx"), "wb") as f:
        f.write(payload)
        f.truncate(1 << 30)
    with open(os.path.join(folder, "valid.npuctx"), "wb") as f:
        f.write(payload)
    return [b"pipe.npuctx", b"zero.npuctx", b"dir.npuctx", b"sparse.npuctx", b"valid.npuctx", b"./valid.npuctx",
            b"valid.npuctx\0", b"\0", b"", b".", b"..", b"/dev/zero", b"../valid.npuctx", b"dir.npuctx/../valid.npuctx",
            b"\xff\xfe", "v\u00e4lid.npuctx".encode(), b"valid.npuctx" * 400, b"missing.npuctx"]


def fuzz_paths(folder: str, model: onnx.ModelProto, payload: bytes, expected: np.ndarray, figures: dict,
               n: int) -> None:
    """embed_mode=0 EPContext nodes pointing anywhere: refused with the node's name, or the valid payload runs."""
    m0 = copy.deepcopy(model)
    node = m0.graph.node[0]
    next(a for a in node.attribute if a.name == "embed_mode").i = 0
    corpus = _path_corpus(folder, payload)
    path = os.path.join(folder, "paths_ctx.onnx")

    def check(loc: bytes) -> None:
        figures["cases"] += 1
        onnx.save(with_payload_model(m0, loc), path)
        try:
            sess = npu_session(path)
        except Exception as exc:  # noqa: BLE001 - a refusal is counted, then its text checked
            figures["refused"] += 1
            if node.name not in str(exc) or "EpContextError" not in str(exc):
                figures["non_runtime_errors"] += 1
                figures["examples"].append(f"{loc[:40]!r}: {str(exc)[:300]}")
            return
        same = np.array_equal(sess.run(None, {"x": X})[0], expected)
        figures["accepted_same_bytes" if same else "wrong_results"] += 1

    for loc in corpus:
        check(loc)

    @settings(max_examples=max(0, n - len(corpus)), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.binary(max_size=40), st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     st.lists(st.sampled_from(["..", ".", "valid.npuctx", "dir.npuctx", "pipe.npuctx", "", "\0"]),
                              min_size=1, max_size=4).map(lambda p: "/".join(p).encode())))
    def fuzz(loc):
        check(loc)

    if n > len(corpus):
        fuzz()


def with_payload_model(model: onnx.ModelProto, payload: bytes) -> onnx.ModelProto:
    m = copy.deepcopy(model)
    next(a for a in m.graph.node[0].attribute if a.name == "ep_cache_context").s = payload
    return m


if __name__ == "__main__":
    t0 = time.perf_counter()
    f = run(sys.argv[1], int(sys.argv[2]))
    f["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(f))
    # bytes: nothing changed may be accepted. header (valid hashes, hostile content): an accepted program may
    # compute something else (that is what a re-signed program says), but never outputs of the wrong signature.
    bad = {"bytes": f["wrong_results"] or f["accepted_changed"], "paths": f["wrong_results"] or f["non_runtime_errors"]
           }.get(f["mode"], f["ran_wrong_signature"])
    sys.exit(1 if bad else 0)
