"""A compiled program's large weights live in one contiguous arena (huge-page sized), except weights ORT keeps
for the session, which the program reads in place; results are unchanged."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.weight_arena import borrowed_from_ort, pack_constants
from npu_ep.kernels.registry import Prepared
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

RNG = np.random.default_rng(5)


def test_pack_moves_large_constants_into_one_aligned_arena_and_keeps_values():
    big = [RNG.standard_normal((512, 1024)).astype(np.float32) for _ in range(3)]  # 2 MiB each
    small = np.ones(16, np.float32)
    preps = [Prepared({}, {"w": w.copy(), "bias": small}) for w in big]
    assert pack_constants(preps) >= 3 * big[0].nbytes
    bases = {p.consts["w"].base.ctypes.data for p in preps}
    assert len(bases) == 1  # one arena
    for p, w in zip(preps, big):
        assert p.consts["w"].flags.c_contiguous and p.consts["w"].ctypes.data % 64 == 0
        np.testing.assert_array_equal(p.consts["w"], w)
        assert p.consts["bias"] is small  # small constants stay where they are
    assert pack_constants([Prepared({}, {"w": np.ones((64, 64), np.float32)})]) == 0  # below a huge page: no-op


def test_arrays_on_their_own_pages_stay_where_they_are():
    """Weights the compiler made on their own mappings (level 4's tiles, kernels.own_pages) are not copied into the
    arena: the copy would hold them twice while the compile runs."""
    from npu_ep.kernels.own_pages import copy_to_pages, on_own_pages, page_array

    tiles = [copy_to_pages(RNG.integers(0, 256, (3 << 20,), dtype=np.uint8)) for _ in range(2)]
    heap = RNG.standard_normal((512, 1024)).astype(np.float32)
    preps = [Prepared({}, {"t": t}) for t in tiles] + [Prepared({}, {"w": heap.copy()})]
    assert all(on_own_pages(t) and on_own_pages(t[1:]) for t in tiles) and not on_own_pages(heap)
    assert pack_constants(preps) == 0  # what is left (2 MiB) is below the arena's size
    assert all(p.consts["t"] is t for p, t in zip(preps, tiles))
    z = page_array((5, 7), np.int32)
    assert z.shape == (5, 7) and z.flags.writeable and z.flags.c_contiguous and not z.any()


def _three_matmuls():
    dims = [256, 1024, 1024, 256]
    inits = {f"w{i}": (RNG.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
             for i in range(3)}
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}" if i < 2 else "y"],
                              name=f"mm{i}") for i in range(3)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 256])],
                       [helper.make_tensor_value_info("y", F32, [4, 256])], inits)
    return model, inits


def _program_of(sess):
    progs = [prog for ep in LIVE_SESSIONS for prog in ep.programs.values()
             if {s.node_name for s in prog.steps} == {"mm0", "mm1", "mm2"}]
    assert progs
    return progs[-1]


def _run_and_compare(sess, model):
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(2):  # the second call reads the weights again, after ORT's first run
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-3)


def test_session_reads_orts_weights_in_place_without_a_copy_and_matches_cpu():
    model, inits = _three_matmuls()
    sess = npu_session(model, cpu=False)
    _run_and_compare(sess, model)
    prog = _program_of(sess)
    weights = [a for st in prog.steps for a in st.prepared.consts.values()
               if isinstance(a, np.ndarray) and a.nbytes >= min(w.nbytes for w in inits.values())]
    assert len(weights) == 3 and all(borrowed_from_ort(w) for w in weights)
    assert prog.arena_bytes == 0  # nothing of ours to pack


def test_session_writing_an_epcontext_copies_its_weights_into_the_arena(tmp_path):
    model, inits = _three_matmuls()
    sess = npu_session(model, cpu=False, **{"ep.context_enable": "1",
                                            "ep.context_file_path": str(tmp_path / "ctx.onnx")})
    _run_and_compare(sess, model)
    prog = _program_of(sess)
    assert prog.arena_bytes >= sum(w.nbytes for w in inits.values())
    assert not any(borrowed_from_ort(a) for st in prog.steps for a in st.prepared.consts.values()
                   if isinstance(a, np.ndarray))


def test_weights_in_an_external_data_file_are_read_in_place(tmp_path):
    model, _ = _three_matmuls()
    path = str(tmp_path / "model.onnx")
    external = onnx.ModelProto()
    external.CopyFrom(model)  # onnx.save moves the tensors of the proto it saves out to the data file
    onnx.save(external, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.data",
              size_threshold=1024)
    sess = npu_session(path, cpu=False)
    _run_and_compare(sess, model)
    assert _program_of(sess).arena_bytes == 0


def test_a_large_outer_scope_weight_read_inside_if_branches_matches_cpu():
    """The weight lives in the main graph and both branches read it: the If is claimed with its branches, whose
    programs hold the weight as a constant."""
    w = (RNG.standard_normal((256, 512)) / 16).astype(np.float32)  # 512 KiB: borrowed, not copied

    def branch(name, op):
        return helper.make_graph([helper.make_node("MatMul", ["x", "w"], [f"{name}_mm"], name=f"{name}_matmul"),
                                  helper.make_node(op, [f"{name}_mm"], [f"{name}_out"], name=f"{name}_act")],
                                 name, [], [helper.make_tensor_value_info(f"{name}_out", F32, None)])

    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Sigmoid"))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 256])],
                       [helper.make_tensor_value_info("y", F32, [4, 512])], {"w": w, "zero": np.float32(0)})
    sess = npu_session(model)
    where = assignment(sess)
    assert where == {"sum": "NpuEP", "greater": "NpuEP", "if": "NpuEP"}, where
    for sign in (1.0, -1.0):
        x = sign * np.abs(RNG.standard_normal((4, 256))).astype(np.float32)
        for _ in range(2):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0],
                                       rtol=1e-5, atol=1e-5)


def test_each_session_reads_its_own_weights_after_another_is_gone():
    model, _ = _three_matmuls()
    first, second = npu_session(model, cpu=False), npu_session(model, cpu=False)
    _run_and_compare(first, model)
    del first
    _run_and_compare(second, model)


def test_rebase_moves_every_view_of_a_moved_initializer_and_nothing_else(monkeypatch):
    """ORT may pass other memory at run time than Compile saw (external data is loaded twice): the program's
    views, derived views and nested kernels included, move to the same offsets of the new buffer."""
    from npu_ep.ep import weight_arena

    old, new, other = (np.arange(4096, dtype=np.uint8) for _ in range(3))
    new[:] = 255 - old

    def in_ort_buffers(a):  # stands in for "the base chain ends at ORT's initializer"
        return any(b.ctypes.data <= a.ctypes.data < b.ctypes.data + b.nbytes for b in (old, new))

    monkeypatch.setattr(weight_arena, "borrowed_from_ort", in_ort_buffers)
    w = old[1024:].view(np.float32).reshape(32, 24)  # a typed view at an offset
    inner = Prepared({}, {"w": w[:, ::2]})  # a strided view, one level down
    outer = Prepared({"parts": [old[:16]]}, {"mine": other, "w": w}, kernel_cache={"inner": inner})
    program = type("P", (), {"steps": [type("S", (), {"prepared": outer})()]})()
    assert weight_arena.rebase_borrowed(program, [(old.ctypes.data, old.nbytes, new)]) == 3
    moved_w = outer.consts["w"]
    assert moved_w.ctypes.data == new.ctypes.data + 1024 and not moved_w.flags.writeable
    np.testing.assert_array_equal(moved_w, new[1024:].view(np.float32).reshape(32, 24))
    np.testing.assert_array_equal(inner.consts["w"], moved_w[:, ::2])
    np.testing.assert_array_equal(outer.attrs["parts"][0], new[:16])
    assert outer.consts["mine"] is other  # memory we own is never touched
