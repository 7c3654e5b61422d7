"""Differential sweep of com.microsoft EmbedLayerNormalization (issue 40): ``embed_layernorm``
(kernels/native/embed_layernorm.cc) against the reference model (kernels/ops/embed_layernorm.py), bit for bit: the
kernel makes the same float32 operations in the same order, its sums in numpy's pairwise order. Widths around the
pairwise blocks (8, 128 and the splits above), rows around the task split (4096 / D rows a task), one thread and
two, with and without segments (rows [B, S] and [1, S]), masks, position_ids [B, S] and [1, S], the embedding_sum
output, special values in the tables (NaN, +-Inf, huge and tiny), and out-of-range ids of each table as the
reference's error naming it. A session shows NpuEP ran the node as its bound native step with the CPU EP's values
(within float32 rounding there: ORT sums in another order)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import REF, around, bound_step_outputs, check, node_model, run_kernel, with_specials
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4040)
MS = "com.microsoft"
V, P, G = 13, 160, 3  # word, position and segment table rows


def _inputs(b, s, d, *, segments="rows", mask=False, pos_ids=None, specials=False):
    """The node's inputs (name, value or None when missing, constant); segments "rows" ([B, S]), "one" ([1, S]) or
    None."""
    tables = [RNG.standard_normal((n, d)).astype(np.float32) for n in (V, P, G)]
    if specials:
        tables[0] = with_specials(tables[0], RNG, fraction=0.02)
    ids = RNG.integers(0, V, (b, s)).astype(np.int32)
    seg = None if segments is None else RNG.integers(0, G, (b if segments == "rows" else 1, s)).astype(np.int32)
    inputs = [("ids", ids, False), ("seg", seg, False), ("word", tables[0], True), ("pos", tables[1], True),
              ("segemb", tables[2] if seg is not None else None, True),
              ("gamma", RNG.standard_normal(d).astype(np.float32), True),
              ("beta", RNG.standard_normal(d).astype(np.float32), True)]
    if mask or pos_ids is not None:
        m = (RNG.random((b, s)) > 0.3).astype(np.int32) if mask else None
        inputs.append(("mask", m, False))
    if pos_ids is not None:
        inputs.append(("pos_ids", RNG.integers(0, P, (b if pos_ids == "rows" else 1, s)).astype(np.int32), False))
    return inputs


def _check(inputs, n_out=2, threads=1, what=""):
    check("EmbedLayerNormalization", inputs, "embed_layernorm", domain=MS, n_out=n_out, threads=threads,
          what=what, epsilon=1e-5)


@pytest.mark.parametrize("d", sorted({1, 2, 7, *around(8, 16, 128, 256), 300, 768}))
def test_widths_around_the_pairwise_blocks(d):
    _check(_inputs(2, 3, d), n_out=3, what=f"D={d}")


@pytest.mark.parametrize("segments", ["rows", "one", None])
@pytest.mark.parametrize("pos_ids", [None, "rows", "one"])
def test_segments_masks_and_position_ids(segments, pos_ids):
    for mask in (False, True):
        _check(_inputs(3, 5, 24, segments=segments, mask=mask, pos_ids=pos_ids), n_out=3,
               what=f"segments={segments} mask={mask} pos_ids={pos_ids}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("d", [64, 768])
def test_rows_around_the_task_split(threads, d):
    per = 4096 // d  # embed_layernorm.cc's rows per task
    for s in around(per, 2 * per):
        _check(_inputs(1, s, d), threads=threads, what=f"S={s} D={d} threads={threads}")


def test_special_values_in_the_tables():
    for d in (7, 129, 768):
        _check(_inputs(2, 6, d, specials=True), n_out=3, what=f"specials D={d}")


@pytest.mark.parametrize("table", ["input_ids", "position", "segment_ids"])
def test_an_out_of_range_id_names_its_table(table):
    inputs = _inputs(1, 4, 8, pos_ids="rows")
    where = {"input_ids": 0, "position": 8, "segment_ids": 1}[table]
    name, value, const = inputs[where]
    bad = value.copy()
    bad[0, 2] = {"input_ids": V, "position": -1, "segment_ids": G}[table]
    inputs[where] = (name, bad, const)
    for kernels in ("native", "reference"):
        with pytest.raises(ValueError, match=f"{table} index out of range"):
            _run(inputs, kernels)


def _run(inputs, kernels):
    m = node_model("EmbedLayerNormalization", inputs, domain=MS, n_out=2, epsilon=1e-5)
    return run_kernel(m, {s[0]: s[1] for s in inputs if s[1] is not None and not s[2]}, kernels)


def test_the_bound_step_writes_the_kernels_bits():
    inputs = _inputs(2, 9, 40, mask=True)
    m = node_model("EmbedLayerNormalization", inputs, domain=MS, n_out=3, epsilon=1e-5)
    (node,) = nodes_from_model(m)
    k = kernel_for(MS, "EmbedLayerNormalization")
    p = k.prepare(node, REF)
    runtime.configure([p], "native", 1)
    args = [None if v.missing or v.is_constant else s[1] for v, s in zip(node.inputs, inputs)]
    outs = k.run(p, args)
    bound = bound_step_outputs(k, p, args, outs)
    assert len(bound) == 3, "EmbedLayerNormalization bound no native step"
    for g, w in zip(bound, outs):
        assert g.dtype == w.dtype and g.tobytes() == np.asarray(w).tobytes()


def test_session_matches_cpu_ep_and_runs_on_npu_ep():
    b, s, d = 2, 16, 96
    inits = {"word": RNG.standard_normal((V, d)).astype(np.float32),
             "pos": RNG.standard_normal((P, d)).astype(np.float32),
             "segemb": RNG.standard_normal((G, d)).astype(np.float32),
             "gamma": RNG.standard_normal(d).astype(np.float32), "beta": RNG.standard_normal(d).astype(np.float32)}
    node = helper.make_node("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segemb", "gamma", "beta", "mask"],
                            ["y", "mask_index"], name="the_op", domain=MS, epsilon=1e-5)
    ints = [helper.make_tensor_value_info(n, TensorProto.INT32, [b, s]) for n in ("ids", "seg", "mask")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d]),
            helper.make_tensor_value_info("mask_index", TensorProto.INT32, [b])]
    model = make_model([node], ints, outs, inits, extra_opsets=[(MS, 1)])
    feeds = {"ids": RNG.integers(0, V, (b, s)).astype(np.int32), "seg": RNG.integers(0, G, (b, s)).astype(np.int32),
             "mask": (RNG.random((b, s)) > 0.4).astype(np.int32)}
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, feeds)
    for _ in range(3):
        got = sess.run(None, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    assert python_steps(sess) == [], "EmbedLayerNormalization ran its Python kernel instead of the bound native step"


def test_arrays_of_other_layouts_are_converted_as_before():
    """The kernel borrows C-order int32/float32 arrays as they are and converts the others pybind11's caster took
    (strided ids, a Fortran-order table, lists) to the same values; a value that is no array of numbers (or one
    only an unsafe cast would give: int64 ids) is a TypeError."""
    nat = runtime.native_module()
    rng = np.random.default_rng(5)
    b, s, d = 2, 5, 24
    ids = rng.integers(0, 30, (b, s)).astype(np.int32)
    word, pos = rng.standard_normal((30, d)).astype(np.float32), rng.standard_normal((8, d)).astype(np.float32)
    seg_ids = rng.integers(0, 2, (b, s)).astype(np.int32)
    seg = rng.standard_normal((2, d)).astype(np.float32)
    gamma, beta = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    mask = (rng.random((b, s)) < 0.7).astype(np.int32)
    want = nat.embed_layernorm(ids, seg_ids, word, pos, seg, gamma, beta, mask, None, 1e-5, True, None, 1)
    wide = np.zeros((b, 2 * s), np.int32)
    wide[:, ::2] = ids
    got = nat.embed_layernorm(wide[:, ::2], seg_ids.tolist(), np.asfortranarray(word), pos, seg[::-1][::-1],
                              gamma.tolist(), beta, mask[:, ::-1][:, ::-1], None, 1e-5, True, None, 1)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    for bad in ("word", ids.astype(np.int64)):
        with pytest.raises(TypeError):
            args = (ids, None, bad) if isinstance(bad, str) else (bad, None, word)
            nat.embed_layernorm(*args, pos, None, gamma, beta, None, None, 1e-5, False, None, 1)


def test_session_writes_every_output_into_ort_buffers_with_each_calls_values():
    """The bound step writes output, mask_index and embedding_sum into ORT's buffers (out, mask_out, sum_out): each
    call's values are that call's and the CPU EP's."""
    b, s, d = 3, 7, 40
    inits = {"word": RNG.standard_normal((V, d)).astype(np.float32),
             "pos": RNG.standard_normal((P, d)).astype(np.float32),
             "gamma": RNG.standard_normal(d).astype(np.float32), "beta": RNG.standard_normal(d).astype(np.float32)}
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "beta", "mask"],
                            ["y", "mask_index", "sum"], name="the_op", domain=MS, epsilon=1e-5)
    ints = [helper.make_tensor_value_info(n, TensorProto.INT32, [b, s]) for n in ("ids", "mask")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d]),
            helper.make_tensor_value_info("mask_index", TensorProto.INT32, [b]),
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, [b, s, d])]
    model = make_model([node], ints, outs, inits, extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    for _ in range(4):
        feeds = {"ids": RNG.integers(0, V, (b, s)).astype(np.int32),
                 "mask": (RNG.random((b, s)) > 0.4).astype(np.int32)}
        got, want = sess.run(None, feeds), cpu_run(model, feeds)
        for i in (0, 2):
            np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    assert python_steps(sess) == [], "EmbedLayerNormalization ran its Python kernel instead of the bound native step"


def test_mask_and_sum_outputs_are_written_and_returned():
    """mask_out / sum_out of the kernel's size and dtype are written and returned as they are; others (float64,
    another size, read-only) are left alone and new arrays returned, with the same values."""
    nat = runtime.native_module()
    rng = np.random.default_rng(6)
    b, s, d = 2, 5, 24
    ids = rng.integers(0, 30, (b, s)).astype(np.int32)
    word, pos = rng.standard_normal((30, d)).astype(np.float32), rng.standard_normal((8, d)).astype(np.float32)
    gamma, beta = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    mask = (rng.random((b, s)) < 0.7).astype(np.int32)
    args = (ids, None, word, pos, None, gamma, beta, mask, None, 1e-5, True, None, 1)
    want = nat.embed_layernorm(*args)
    mask_out, sum_out = np.full(b, -1, np.int32), np.full((b, s, d), np.nan, np.float32)
    got = nat.embed_layernorm(*args, mask_out, sum_out)
    assert got[1] is mask_out and got[2] is sum_out
    readonly = np.zeros(b, np.int32)
    readonly.flags.writeable = False
    for bad_mask, bad_sum in ((np.zeros(b, np.int64), np.zeros((b, s, d + 1), np.float32)),
                              (readonly, np.zeros((b, s, d), np.float64))):
        got2 = nat.embed_layernorm(*args, bad_mask, bad_sum)
        assert got2[1] is not bad_mask and got2[2] is not bad_sum
        got = got + got2
    for i, g in enumerate(got):
        assert g.tobytes() == want[i % 3].tobytes()
