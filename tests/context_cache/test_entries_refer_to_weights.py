"""A cache entry names the ORT initializers its program reads in place instead of holding their bytes, so a warm
start reads no weights from disk and holds no second copy; an entry that does not fit the session is rebuilt."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from npu_ep.ep.borrowed_refs import BorrowedRefError, BorrowedRefs
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.dtypes import TensorProto
from npu_ep.ep.program_io import ProgramFormatError, program_from_parts
from npu_ep.ep.weight_arena import borrowed_from_ort
from npu_ep.kernels.target import Target
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

RNG = np.random.default_rng(11)
DIMS = [256, 1024, 1024, 256]  # 1 MiB weights: read in place from ORT (>= 64 KiB)


def _model(seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = {f"w{i}": (rng.standard_normal((DIMS[i], DIMS[i + 1])) / np.sqrt(DIMS[i])).astype(np.float32)
             for i in range(3)}
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}" if i < 2 else "y"],
                              name=f"mm{i}") for i in range(3)]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 256])],
                      [helper.make_tensor_value_info("y", F32, [4, 256])], inits), inits


def _session(model, cache):
    before = set(LIVE_SESSIONS)
    sess = npu_session(model, {"cache_dir": str(cache)}, cpu=False)
    (ep,) = set(LIVE_SESSIONS) - before
    return sess, ep


def test_warm_session_reads_the_weights_in_place_and_the_entry_holds_none_of_them(tmp_path):
    model, inits = _model()
    _session(model, tmp_path)
    (entry,) = tmp_path.glob("*.npuctx")
    weight_bytes = sum(w.nbytes for w in inits.values())
    assert entry.stat().st_size < weight_bytes / 8, entry.stat().st_size  # references, not 3 MiB of weights
    sess, ep = _session(model, tmp_path)
    assert ep.compiled.stats["hits"] == 1 and ep.compiled.stats["misses"] == 0, ep.compiled.stats
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = ep.programs.values()
    weights = [a for st in program.steps for a in st.prepared.consts.values() if a.nbytes >= DIMS[0] * DIMS[1] * 4]
    assert len(weights) == 3 and all(borrowed_from_ort(w) for w in weights)
    assert program.arena_bytes == 0
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_other_weights_of_the_same_shape_miss_the_cache_and_give_their_own_results(tmp_path):
    first, _ = _model(seed=0)
    second, _ = _model(seed=1)
    _session(first, tmp_path)
    sess, ep = _session(second, tmp_path)
    assert ep.compiled.stats["misses"] == 1 and ep.compiled.stats["hits"] == 0, ep.compiled.stats
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(second, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _refs_for(values: dict[str, np.ndarray]) -> BorrowedRefs:
    refs = BorrowedRefs([])
    refs.values.update(values)
    return refs


@pytest.mark.parametrize("bad, why", [
    ({"init": "w", "init_nbytes": 64, "offset": 0, "dtype": "float32", "shape": [4, 4], "strides": [16, 4]},
     "does not hold"),
    ({"init": "w", "init_nbytes": 256, "offset": 200, "dtype": "float32", "shape": [4, 4], "strides": [16, 4]},
     "outside"),
    ({"init": "w", "init_nbytes": 256, "offset": 0, "dtype": "float32", "shape": [4, 4], "strides": [-16, 4]},
     "outside"),
    ({"init": "w", "init_nbytes": 256, "offset": 0, "dtype": "object", "shape": [4], "strides": [4]}, "malformed"),
    ({"init": "w", "init_nbytes": 256, "offset": 0, "dtype": "float32", "shape": [4, 4], "strides": [16]}, "malformed"),
    ({"init": "w", "init_nbytes": 256, "offset": -4, "dtype": "float32", "shape": [4], "strides": [4]}, "malformed"),
    ({"init": "w"}, "malformed"),
])
def test_a_reference_from_disk_is_checked_against_the_initializer_it_names(bad, why):
    refs = _refs_for({"w": np.zeros((8, 8), np.float32)})
    with pytest.raises(BorrowedRefError, match=why):
        refs.resolve(bad, "step 0 constant 'b'")
    good = refs.resolve({"init": "w", "init_nbytes": 256, "offset": 32, "dtype": "float32", "shape": [2, 8],
                         "strides": [32, 4]}, "step 0")
    assert good.shape == (2, 8) and not good.flags.writeable


def test_a_reference_outside_a_cache_entry_is_refused():
    header = {"n_slots": 2, "inputs": [["x", "float32", [4, 256]]], "outputs": [["y", "float32", [4, 1024]]],
              "output_slots": [1], "steps": [{
                  "node": "mm0", "op": "MatMul", "kernel": ["", "MatMul"], "in": [0, -1], "out": [1], "release": [],
                  "attrs": {}, "consts": [], "borrowed": {"b": {"init": "w0"}}}]}
    with pytest.raises(ProgramFormatError, match="only a cache entry"):
        program_from_parts(header, {}, Target.load("npu-ref"))


def test_element_types_match_onnx():
    for t in TensorProto:
        assert t.value == getattr(onnx.TensorProto, t.name), t


def test_starting_a_session_imports_neither_onnx_nor_ml_dtypes(tmp_path):
    """Their imports took ~0.9 s of every session start; the EP needs neither to compile or load a program."""
    model, _ = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    code = ("import sys, onnxruntime as ort, npu_ep\n"
            f"s = ort.InferenceSession({str(path)!r}, providers=[(npu_ep.get_ep_name(), "
            f"{{'cache_dir': {str(tmp_path / 'cache')!r}}})])\n"
            "s.run(None, {'x': __import__('numpy').zeros((4, 256), 'float32')})\n"
            "print(sorted(m for m in ('onnx', 'ml_dtypes') if m in sys.modules))\n")
    for _ in range(2):  # cold, then warm from the cache
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_constants_read_from_a_context_file_stay_in_its_buffer_and_copies_go_to_the_arena(tmp_path):
    """A context read from disk is one huge-page-sized numpy buffer: packing its arrays again would copy every
    weight a second time (the warm-start cost this avoids); arrays the compiler made still go to the arena."""
    from npu_ep.context_cache.container import ContainerMeta, pack, unpack
    from npu_ep.context_cache.fileio import read_container
    from npu_ep.ep.weight_arena import pack_constants
    from npu_ep.kernels.registry import Prepared

    arrays = {f"w{i}": np.full((1024, 1024), i, np.float32) for i in range(3)}  # 12 MiB
    path = tmp_path / "c.npuctx"
    path.write_bytes(pack({}, arrays, meta=ContainerMeta("v", "npu-ref", "h", "k")))
    loaded = unpack(read_container(path)).arrays
    preps = [Prepared({}, {"w": loaded[k]}) for k in sorted(loaded)]
    assert pack_constants(preps) == 0
    assert all(p.consts["w"] is loaded[k] for p, k in zip(preps, sorted(loaded)))
    copies = [Prepared({}, {"w": loaded[k].copy()}) for k in sorted(loaded)]
    assert pack_constants(copies) >= 3 * (4 << 20)
    for p, k in zip(copies, sorted(loaded)):
        np.testing.assert_array_equal(p.consts["w"], arrays[k])


def _level4_model(symmetric: bool):
    """x -> MatMulNBits (level 4) twice: a sibling pair fused into one MatMulGroup plus a lone one, 1 MiB of int4."""
    from npu_ep.quantization import quantize_matmul_nbits
    inits, nodes = {}, []
    for name, src, zp in (("a", "x", False), ("b", "x", True), ("c", "a", False)):
        q = quantize_matmul_nbits(RNG.standard_normal((1024, 1024)).astype(np.float32) / 32, 32,
                                  symmetric or not zp)
        inits.update({f"{name}_B": q.B, f"{name}_S": q.scales})
        ins = [src, f"{name}_B", f"{name}_S"]
        if q.zero_points is not None:
            inits[f"{name}_Z"] = q.zero_points
            ins.append(f"{name}_Z")
        nodes.append(helper.make_node("MatMulNBits", ins, [name], name, domain="com.microsoft", K=1024, N=1024,
                                      bits=4, block_size=32, accuracy_level=4))
    nodes.append(helper.make_node("Add", ["b", "c"], ["y"], "add"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [3, 1024])],
                      [helper.make_tensor_value_info("y", F32, [3, 1024])], inits, opset=21,
                      extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("symmetric", [True, False])
def test_level_4_tiles_are_stored_as_their_recipe_and_rebuilt_from_the_initializers(tmp_path, symmetric):
    """accuracy_level 4's tiles are computed from ORT's initializers: the entry stores the recipe and references
    (not 1.5 MB of tiles), and a warm session rebuilds the same tiles and the same outputs."""
    model = _level4_model(symmetric)
    cold, cold_ep = _session(model, tmp_path)
    (entry,) = tmp_path.glob("*.npuctx")
    assert entry.stat().st_size < 64 << 10, entry.stat().st_size
    warm, ep = _session(model, tmp_path)
    assert ep.compiled.stats["hits"] == 1 and ep.compiled.stats["misses"] == 0, ep.compiled.stats
    assert set(assignment(warm).values()) == {"NpuEP"}

    def consts(e):
        return {(st.node_name, k): v for p in e.programs.values() for st in p.steps
                for k, v in st.prepared.consts.items() if "nb_" in k}

    made, rebuilt = consts(cold_ep), consts(ep)
    assert len(made) >= 6 and made.keys() == rebuilt.keys()
    for key, arr in made.items():
        np.testing.assert_array_equal(rebuilt[key], arr, err_msg=str(key))
    x = RNG.standard_normal((3, 1024)).astype(np.float32)
    np.testing.assert_array_equal(warm.run(None, {"x": x})[0], cold.run(None, {"x": x})[0])


@pytest.mark.parametrize("derived, why", [
    ("int8_tiles", "invalid"),
    ({"recipe": "os.system", "consts": {"b": "nb_b"}, "sources": {}, "params": {}}, "invalid"),
    ({"recipe": "int8_tiles", "consts": {"b": 1}, "sources": {}, "params": {}}, "invalid"),
    ({"recipe": "int8_tiles", "consts": {"b": "nb_b"}, "sources": {"B": {"init": "w"}}, "params": {"K": 64}},
     "malformed"),
    ({"recipe": "int8_tiles", "consts": {"b": "nb_b", "scales": "nb_scales"},
      "sources": {"B": {"init": "w", "init_nbytes": 256, "offset": 0, "dtype": "uint8", "shape": [256],
                        "strides": [1]}, "scales": None},
      "params": {"K": 64, "N": 8, "block_size": 32}}, "do not fit|scales"),
])
def test_derived_constants_from_disk_are_checked(derived, why):
    """An entry's recipe is only ever a name in kernels.registry.RECIPES, its sources references that resolve to the
    session's initializers and its params ints that fit them."""
    header = {"n_slots": 2, "inputs": [["x", "float32", [4, 64]]], "outputs": [["y", "float32", [4, 8]]],
              "output_slots": [1], "steps": [{
                  "node": "mm0", "op": "MatMulNBits", "kernel": ["com.microsoft", "MatMulNBits"], "in": [0, -1],
                  "out": [1], "release": [], "attrs": {}, "consts": [], "derived": [derived]}]}
    refs = _refs_for({"w": np.zeros(256, np.uint8)})
    with pytest.raises(ProgramFormatError, match=why):
        program_from_parts(header, {}, Target.load("npu-ref"), refs=refs)
    with pytest.raises(ProgramFormatError, match="only a cache entry" if isinstance(derived, dict) else why):
        program_from_parts(header, {}, Target.load("npu-ref"))
