"""Compiling a partition, or loading it from the cache, reads weights ORT mapped from an external data file (level
4's int8 tiles are made from the int4 B), but gives their pages back once the step no longer needs them: the file
does not sit in the peak RSS beside what the compiler made of it (issue 40 item 6). A weight the program reads in
place keeps its pages; results are unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from npu_ep.context_cache import file_pages
from npu_ep.ep import compiler, program_io
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.kernels.runtime import borrowed_from_ort
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pagemap is Linux's")

RNG = np.random.default_rng(40)
K, N, BS = 1024, 2048, 32  # B: 1 MiB of int4 codes, at least release_weight_pages' minimum


def _model(folder: Path, levels: tuple[int, ...]) -> str:
    """MatMulNBits nodes in a chain, one per level, their weights in an external data file ORT maps."""
    nodes, inits = [], {}
    for i, level in enumerate(levels):
        w = quantize_matmul_nbits(RNG.standard_normal((K, N)).astype(np.float32) / 32, BS, False)
        inits.update({f"B{i}": w.B, f"s{i}": w.scales, f"z{i}": w.zero_points})
        out = "y" if i == len(levels) - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMulNBits", ["x" if i == 0 else f"p{i}", f"B{i}", f"s{i}", f"z{i}"], [out],
                                      name=f"mm{i}", domain="com.microsoft", K=K, N=N, bits=4, block_size=BS,
                                      accuracy_level=level))
        if i < len(levels) - 1:  # back to width K for the next product
            nodes.append(helper.make_node("Slice", [out, "zero", "k", "one"], [f"p{i + 1}"], name=f"slice{i}"))
    inits.update({"zero": np.array([0], np.int64), "k": np.array([K], np.int64), "one": np.array([1], np.int64)})
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, K])],
                       [helper.make_tensor_value_info("y", F32, [4, N])], inits,
                       extra_opsets=[("com.microsoft", 1)])
    path = folder / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.data",
              size_threshold=1024)
    return str(path)


@pytest.fixture
def released(monkeypatch) -> dict[str, list[np.ndarray]]:
    """The initializers each module handed to ``release_weight_pages``, and the bytes it gave back."""
    seen: dict[str, list] = {"compiler": [], "program_io": [], "bytes": []}

    def recorder(where):
        def release(arrays, *args):
            arrays = list(arrays)
            seen[where].extend(arrays)
            seen["bytes"].append(file_pages.release_weight_pages(arrays, *args))
            return seen["bytes"][-1]
        return release

    monkeypatch.setattr(compiler, "release_weight_pages", recorder("compiler"))
    monkeypatch.setattr(program_io, "release_weight_pages", recorder("program_io"))
    return seen


def _program(sess_before: set):
    (ep,) = set(LIVE_SESSIONS) - sess_before
    (program,) = ep.programs.values()
    return ep, program


def _borrowed_consts(program) -> list[np.ndarray]:
    return [c for st in program.steps for c in st.prepared.consts.values()
            if isinstance(c, np.ndarray) and borrowed_from_ort(c)]


def test_level4_weights_give_their_pages_back_cold_and_warm_and_results_hold(tmp_path, released):
    path = _model(tmp_path, (4, 4))
    x = RNG.standard_normal((4, K)).astype(np.float32)
    outputs = []
    for start in ("cold", "warm"):
        before = set(LIVE_SESSIONS)
        sess = npu_session(path, {"cache_dir": str(tmp_path / "cache")}, cpu=False)
        ep, _ = _program(before)
        assert ep.compiled.stats["hits" if start == "warm" else "misses"] == 1, ep.compiled.stats
        assert set(assignment(sess).values()) == {"NpuEP"}
        outputs.append(sess.run(None, {"x": x})[0])
    codes = [a for a in released["compiler"] if a.dtype == np.uint8 and a.nbytes == N * K // 2]
    again = [a for a in released["program_io"] if a.dtype == np.uint8 and a.nbytes == N * K // 2]
    assert len(codes) == 2 and len(again) == 2  # both B, once compiled and once from the entry
    assert sum(released["bytes"]) >= 4 * N * K // 2 - 4 * file_pages.PAGE  # their pages were in, and left
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_allclose(outputs[1], cpu_run(path, {"x": x})[0], rtol=1e-3, atol=2e-3 * np.sqrt(K) * 4)


def test_a_weight_the_program_reads_in_place_is_not_given_back(tmp_path, released):
    path = _model(tmp_path, (0,))
    before = set(LIVE_SESSIONS)
    sess = npu_session(path, cpu=False)
    _, program = _program(before)
    kept = _borrowed_consts(program)
    assert any(c.nbytes == N * K // 2 for c in kept)  # level 0 reads ORT's B in place
    assert not any(np.may_share_memory(a, c) for a in released["compiler"] for c in kept)
    x = RNG.standard_normal((4, K)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(path, {"x": x})[0], rtol=1e-4,
                               atol=1e-4 * np.sqrt(K))


def test_release_weight_pages_skips_small_strided_and_other_items(tmp_path):
    data = tmp_path / "w.data"
    np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8).tofile(data)
    mapped = np.memmap(data, np.uint8, "r")
    assert int(mapped[::file_pages.PAGE].astype(np.int64).sum()) >= 0  # fault every page in
    assert file_pages.release_weight_pages([mapped[:4096], mapped[::2], None, "B"]) == 0
    assert file_pages.release_weight_pages([mapped]) == 4 << 20
    assert file_pages.release_weight_pages([mapped.copy()]) == 0  # anonymous memory is never given back
    assert np.array_equal(mapped, np.fromfile(data, np.uint8))
