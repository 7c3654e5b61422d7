"""Materialized attention as exported (MatMul(Q, K^T) -> scale -> mask Add -> Softmax -> MatMul(., V)) fused into
npu::AttentionChain: the pass takes the chain and leaves near misses alone; the native kernel equals the reference
model (the unfused chain's own numpy calls) within float tolerance over sizes, layouts, broadcasts and NaN/inf
rows, with the same bits at any thread count; sessions match ORT's CPU EP on the unfused graph with NpuEP running
every node, the reference kernels bit for bit with the unfused reference; and an exported decoder runs its
attention through the fused step in prefill and decode."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.fusion.attention import fuse_attention
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.attention_chain import reference
from npu_ep.kernels.target import Target
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session, session_options

RNG = np.random.default_rng(17)
REF = Target.load("npu-ref")
NAT = runtime.native_module()
needs_native = pytest.mark.skipif(NAT is None, reason="native extension not built")
LOWEST = float(np.finfo(np.float32).min)


def _chain_model(*, scale_op="Mul", mask=True, mask_first=False, axis=-1, opset=17, extra_reader=False,
                 scale_value=None, where_mask=False, pv_b=False, nan_guard=None, s=5, t=7, h=8, hv=6, heads=2,
                 k_perm=(0, 1, 3, 2), kt_out=None):
    """q [1, N, S, H], k [1, N, T, H] (transposed in the graph: ``k_perm``, and K's layout such that the result is
    [1, N, H, T]), v [1, N, T, Hv], mask [1, 1, S, T]. ``kt_out``: K^T is a graph output ("kt") or read by a
    Neg that is ("neg_kt") as well."""
    kt_shape = [1, heads, h, t]
    k_shape = [0] * 4
    for i, a in enumerate(k_perm):
        k_shape[a] = kt_shape[i]
    ins = [helper.make_tensor_value_info("q", F32, [1, heads, s, h]),
           helper.make_tensor_value_info("k", F32, k_shape),
           helper.make_tensor_value_info("v", F32, [1, heads, t, hv])]
    inits = {}
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], "kt", perm=list(k_perm)),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], "qk")]
    cur = "scores"
    outs = [helper.make_tensor_value_info("y", F32, [1, heads, s, hv])]
    if kt_out == "neg_kt":
        nodes.append(helper.make_node("Neg", ["kt"], ["neg_kt"], "neg_kt"))
    if kt_out is not None:
        outs.append(helper.make_tensor_value_info(kt_out, F32, kt_shape))
    if scale_op:
        inits["c"] = np.asarray(0.35 if scale_value is None else scale_value, np.float32)
        nodes.append(helper.make_node(scale_op, [cur, "c"], ["scaled"], "scale"))
        cur = "scaled"
    if extra_reader:
        nodes.append(helper.make_node("Neg", [cur], ["neg"], "neg"))
        outs.append(helper.make_tensor_value_info("neg", F32, [1, heads, s, t]))
    if mask:
        ins.append(helper.make_tensor_value_info("mask", F32 if not where_mask else TensorProto.BOOL,
                                                 [1, 1, s, t]))
        if where_mask:
            inits["ninf"] = np.asarray(-np.inf, np.float32)
            nodes.append(helper.make_node("Where", ["mask", cur, "ninf"], ["masked"], "mask"))
        else:
            nodes.append(helper.make_node("Add", ["mask", cur] if mask_first else [cur, "mask"], ["masked"], "mask"))
        cur = "masked"
    nodes.append(helper.make_node("Softmax", [cur], ["probs"], "softmax", axis=axis))
    if nan_guard is not None:  # Where(IsNaN(p), fill, p), as exporters write around a masked softmax
        inits["fill"] = np.asarray([nan_guard], np.float32)
        nodes += [helper.make_node("IsNaN", ["probs"], ["isnan"], "isnan"),
                  helper.make_node("Where", ["isnan", "fill", "probs"], ["guarded"], "guard")]
        probs = "guarded"
    else:
        probs = "probs"
    if pv_b:
        nodes.append(helper.make_node("MatMul", ["v", probs], ["y"], "pv"))
    else:
        nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], "pv"))
    return make_model(nodes, ins, outs, inits, opset=opset)


def _without_shapes(model, names=("q", "k", "v", "y")):
    """The model with these values' shapes removed (ranks unknown to the compiler, as in some exported graphs)."""
    for vi in (*model.graph.input, *model.graph.output):
        if vi.name in names:
            vi.type.tensor_type.ClearField("shape")
    return model


def _feeds(model, masked_rows=()):
    feeds = {}
    for i in model.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "mask" and i.type.tensor_type.elem_type == TensorProto.BOOL:
            feeds[i.name] = RNG.random(dims) > 0.3
        elif i.name == "mask":
            feeds[i.name] = np.where(RNG.random(dims) < 0.3, np.float32(LOWEST), np.float32(0)).astype(np.float32)
        else:
            feeds[i.name] = RNG.standard_normal(dims).astype(np.float32)
    return feeds


def _session(model, **options):
    """An NpuEP-only session whose programs ``session_of`` finds."""
    so = session_options()
    tag_session_options(so)
    return npu_session(model, options, cpu=False, so=so)


def _ops(model):
    return [nd.op_type for nd in fuse_attention(nodes_from_model(model), REF)]


# --- the pass --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"scale_op": "Div"}, {"scale_op": None}, {"mask": False}, {"mask_first": True},
                                {"axis": 3}, {"scale_op": None, "mask": False}, {"nan_guard": 0.0},
                                {"opset": 11}])  # opset < 13 over the last axis: its rows are the last axis
def test_the_chain_becomes_one_fused_node(kw):
    ops = _ops(_chain_model(**kw))
    assert ops == ["AttentionChain"]  # K's Transpose too: the kernel reads K's rows


@pytest.mark.parametrize("kw, why", [
    ({"extra_reader": True}, "the scaled scores have a second reader"),
    ({"axis": 2}, "the softmax is not over the last axis"),
    ({"opset": 11, "axis": 1}, "opset < 13 softmax over the rows of the trailing axes flattened"),
    ({"scale_value": [0.5] * 7}, "the scale is a vector, not a scalar"),
    ({"where_mask": True}, "Where(mask, scores, -inf) masking is not taken"),
    ({"pv_b": True}, "the probabilities are the second product's B, not its A"),
    ({"nan_guard": 0.5}, "the guard fills NaN with 0.5, not 0"),
])
def test_near_misses_stay_unfused(kw, why):
    assert "AttentionChain" not in _ops(_chain_model(**kw)), why


@pytest.mark.parametrize("kw, reason", [
    ({"extra_reader": True}, "an intermediate value has other readers or is read outside the partition"),
    ({"axis": 2}, "node 'softmax' (Softmax) does not normalize the last axis"),
    ({"scale_value": [0.5] * 7}, "node 'scale' (Mul) does not scale the scores by a float32 scalar constant"),
    ({"where_mask": True}, "the chain differs from the pattern after 2 of its 3 nodes: OpType mismatch: expected "
                           "MatMul, got Where."),
    ({"nan_guard": 0.5}, "node 'guard' (Where) does not replace NaN rows by the constant 0"),
])
def test_each_near_miss_says_why(kw, reason):
    """The rule's candidate (the second MatMul) that does not fuse leaves a FusionMiss with the reason (npu-report
    --explain-fusions and the debug log show it)."""
    misses = []
    ops = [nd.op_type for nd in fuse_partition(nodes_from_model(_chain_model(**kw)), REF, misses)]
    assert "AttentionChain" not in ops
    # the other passes report their own declines of the same graph: only the rule's here
    assert [(m.fusion, m.node, m.reason) for m in misses if m.fusion == "attention"] == [("attention", "pv", reason)]


def test_ks_transpose_joins_the_fused_node():
    """The fused node takes K and reads its rows: the Transpose is no step of its own."""
    (fused,) = fuse_attention(nodes_from_model(_chain_model()), REF)
    assert [v.name for v in fused.inputs[:3]] == ["q", "k", "v"] and fused.attrs["fused_nodes"][0] == "kt"
    assert fused.attrs["k_transpose"].name == "kt" and fused.attrs["repeat_kv"] == {}


@pytest.mark.parametrize("kw, why", [
    ({"k_perm": (1, 0, 3, 2)}, "the Transpose also swaps batch and heads"),
    ({"k_perm": (0, 3, 1, 2)}, "the Transpose moves K's axes around, not the last two swapped"),
    ({"kt_out": "kt"}, "K^T is a partition output"),
    ({"kt_out": "neg_kt"}, "K^T has another reader"),
])
def test_ks_transpose_near_misses_stay_a_step_of_their_own(kw, why):
    nodes = fuse_attention(nodes_from_model(_chain_model(**kw)), REF)
    assert [nd.op_type for nd in nodes if nd.op_type != "Neg"] == ["Transpose", "AttentionChain"], why
    assert nodes[-1].inputs[1].name == "kt" and nodes[-1].attrs["k_transpose"] is None


def test_a_transpose_with_the_default_perm_stays_a_step_of_its_own():
    """No perm: all axes reversed, not K's last two swapped."""
    model = _chain_model()
    (tr,) = [n for n in model.graph.node if n.op_type == "Transpose"]
    del tr.attribute[:]
    assert _ops(model) == ["Transpose", "AttentionChain"]


def _k_transposes():
    """A rank-3 (perm [0, 2, 1]) and a rank-2 (perm [1, 0]) chain, K transposed in the graph."""
    for rank, perm in ((3, [0, 2, 1]), (2, [1, 0])):
        lead = [2][:rank - 2]
        ins = [helper.make_tensor_value_info(x, F32, lead + d) for x, d in (("q", [5, 8]), ("k", [7, 8]),
                                                                          ("v", [7, 6]))]
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], "kt", perm=perm),
                 helper.make_node("MatMul", ["q", "kt"], ["scores"], "qk"),
                 helper.make_node("Softmax", ["scores"], ["probs"], "softmax", axis=-1),
                 helper.make_node("MatMul", ["probs", "v"], ["y"], "pv")]
        yield make_model(nodes, ins, [helper.make_tensor_value_info("y", F32, lead + [5, 6])], {})


@pytest.mark.parametrize("model", list(_k_transposes()), ids=["rank3", "rank2"])
def test_ks_transpose_of_rank_2_or_3_joins_the_fused_node(model):
    assert _ops(model) == ["AttentionChain"]
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = cpu_run(model, feeds)[0]
    sess = _session(model)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::AttentionChain"]


def test_a_runtime_scale_is_not_folded():
    model = _chain_model()
    graph = model.graph
    (init,) = [i for i in graph.initializer if i.name == "c"]
    graph.initializer.remove(init)
    graph.input.append(helper.make_tensor_value_info("c", F32, []))
    assert "AttentionChain" not in _ops(model)


def _repeat_kv_model(*, axes=2, expand=(1, 2, 3, 7, 8), reshape=(1, 6, 7, 8), runtime_shapes=False, s=5):
    """The chain over the exporters' repeat_kv of K and V [1, 2, 7, 8] (2 KV heads, 6 query heads)."""
    ins = [helper.make_tensor_value_info("q", F32, [1, 6, s, 8]), helper.make_tensor_value_info("k", F32, [1, 2, 7, 8]),
           helper.make_tensor_value_info("v", F32, [1, 2, 7, 8])]
    inits = {"axes": np.asarray([axes], np.int64), "c": np.asarray(0.35, np.float32)}
    if runtime_shapes:  # computed at run time, as torchscript exports do (here: passed in)
        ins += [helper.make_tensor_value_info("eshape", TensorProto.INT64, [5]),
                helper.make_tensor_value_info("rshape", TensorProto.INT64, [4])]
    else:
        inits.update(eshape=np.asarray(expand, np.int64), rshape=np.asarray(reshape, np.int64))
    nodes = []
    for x in ("k", "v"):
        nodes += [helper.make_node("Unsqueeze", [x, "axes"], [f"{x}_u"], f"{x}_unsqueeze"),
                  helper.make_node("Expand", [f"{x}_u", "eshape"], [f"{x}_e"], f"{x}_expand"),
                  helper.make_node("Reshape", [f"{x}_e", "rshape"], [f"{x}_rep"], f"{x}_reshape")]
    nodes += [helper.make_node("Transpose", ["k_rep"], ["kt"], "kt", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], "qk"),
              helper.make_node("Mul", ["scores", "c"], ["scaled"], "scale"),
              helper.make_node("Softmax", ["scaled"], ["probs"], "softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "v_rep"], ["y"], "pv")]
    return make_model(nodes, ins, [helper.make_tensor_value_info("y", F32, [1, 6, s, 8])], inits)


def test_the_exporters_repeat_kv_joins_the_fused_node():
    (fused,) = fuse_attention(nodes_from_model(_repeat_kv_model()), REF)
    assert fused.op_type == "AttentionChain" and [v.name for v in fused.inputs[:3]] == ["q", "k", "v"]
    assert set(fused.attrs["fused_nodes"]) >= {"k_unsqueeze", "k_expand", "k_reshape", "kt", "v_reshape"}
    fused = fuse_attention(nodes_from_model(_repeat_kv_model(runtime_shapes=True)), REF)[0]
    assert [v.name for v in fused.inputs[4:]] == ["eshape", "rshape", "eshape", "rshape"]  # runtime shapes go in


def test_an_unsqueeze_at_another_axis_keeps_its_path():
    ops = _ops(_repeat_kv_model(axes=1, expand=(1, 3, 2, 7, 8)))
    assert ops.count("AttentionChain") == 1 and ops.count("Expand") == 2  # the chain fused, the paths not


# --- the native kernel against the reference model --------------------------------------------------------------

def _operands(b, n, s, t, h, hv, mask_shape, kt_layout="view"):
    q = (RNG.standard_normal((b, n, s, h)) / np.sqrt(h)).astype(np.float32)  # scores of attention's size
    k = RNG.standard_normal((b, n, t, h)).astype(np.float32)
    if kt_layout == "view":  # the exported graph's Transpose: K rows read across
        kt = k.transpose(0, 1, 3, 2)
    elif kt_layout == "contiguous":
        kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    else:  # every other key of a wider K: no unit stride on either axis
        wide = RNG.standard_normal((b, n, 2 * t, h)).astype(np.float32)
        kt = wide[:, :, ::2].transpose(0, 1, 3, 2)
    v = RNG.standard_normal((b, n, t, hv)).astype(np.float32)
    mask = None
    if mask_shape is not None:
        mask = np.where(RNG.random(mask_shape) < 0.3, np.float32(LOWEST), np.float32(0)).astype(np.float32)
    return q, kt, v, mask


SHAPES = [  # (B, N, S, T, H, Hv, mask shape, K^T layout)
    (1, 8, 40, 40, 32, 32, (1, 1, 40, 40), "view"),  # a prefill: K transposed once per head
    (1, 8, 1, 41, 32, 32, (1, 1, 1, 41), "view"),  # a decode step: dot products over K's rows
    (2, 3, 17, 33, 7, 5, (2, 1, 17, 33), "contiguous"),  # odd sizes, vector tails everywhere
    (2, 3, 5, 33, 7, 5, None, "strided"),  # no mask, K^T gathered
    (1, 2, 70, 9, 64, 48, (1, 9), "contiguous"),  # a rank-2 mask, Hv != H, more than 64 rows
    (1, 2, 3, 1, 4, 4, (1, 1, 3, 1), "view"),  # one key
    (1, 1, 20, 100, 130, 3, (20, 1), "strided"),  # H wider than two vectors, the mask broadcast along keys
]


@needs_native
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scale_kind", [0, 1, 2])
def test_native_equals_the_reference_within_float_tolerance(isa, shape, scale_kind):
    q, kt, v, mask = _operands(*shape)
    want = reference(q, kt, v, mask, scale_kind, 0.3)
    got = NAT.attention_chain(q, kt, v, mask, scale_kind, 0.3, 1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * float(np.abs(want).max()))
    assert np.array_equal(NAT.attention_chain(q, kt, v, mask, scale_kind, 0.3, 2), got)  # any thread count


@needs_native
def test_native_broadcasts_leading_dims_as_numpys_matmul():
    q = RNG.standard_normal((2, 4, 6, 8)).astype(np.float32)
    kt = RNG.standard_normal((1, 4, 8, 10)).astype(np.float32)  # one batch for both
    v = RNG.standard_normal((2, 1, 10, 8)).astype(np.float32)  # one head for all
    mask = RNG.standard_normal((6, 10)).astype(np.float32)
    want = reference(q, kt, v, mask, 1, 0.5)
    np.testing.assert_allclose(NAT.attention_chain(q, kt, v, mask, 1, 0.5, 2), want, rtol=2e-5, atol=1e-6)
    q3, kt3, v3 = q[0], kt[0], v[0]  # rank 3
    np.testing.assert_allclose(NAT.attention_chain(q3, kt3, v3, None, 0, 1.0, 1), reference(q3, kt3, v3, None, 0, 1.0),
                               rtol=2e-5, atol=1e-6)


@needs_native
def test_native_rows_with_nan_or_infinite_maxima_are_nan_as_the_chains_softmax(isa):
    q, kt, v, mask = _operands(1, 2, 20, 12, 8, 8, (1, 1, 20, 12))
    mask[0, 0, 3] = -np.inf  # every key masked: the chain's Softmax gives NaN
    mask[0, 0, 5, 4] = np.inf  # an infinite maximum
    mask[0, 0, 7] = LOWEST  # every key at float32's lowest: a uniform row, not NaN
    q[0, 1, 9, 2] = np.nan
    with np.errstate(invalid="ignore"):
        want = reference(q, kt, v, mask, 1, 0.25)
    got = NAT.attention_chain(q, kt, v, mask, 1, 0.25, 1)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[:, :, [3, 5]]).all() and np.isnan(got[0, 1, 9]).all() and not np.isnan(got[:, :, 7]).any()
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-5, atol=2e-6)


@needs_native
def test_native_zeroes_nan_rows_as_the_exporters_guard(isa):
    q, kt, v, mask = _operands(1, 2, 20, 12, 8, 8, (1, 1, 20, 12))
    mask[0, 0, 3] = -np.inf
    v[0, 1, 4, 0] = np.inf  # a guarded row's 0 * inf is NaN in the chain's product too
    mask[0, 0, 6] = -np.inf
    with np.errstate(invalid="ignore"):
        want = reference(q, kt, v, mask, 1, 0.25, zero_nan_rows=True)
    got = NAT.attention_chain(q, kt, v, mask, 1, 0.25, 1, True)
    assert not np.isnan(got[0, 0, 3]).any() and (got[0, 0, 3] == 0).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-5, atol=2e-6)


@needs_native
@pytest.mark.parametrize("s", [1, 20])
def test_native_reads_each_kv_head_for_its_group_of_query_heads(isa, s):
    q = (RNG.standard_normal((2, 8, s, 16)) / 4).astype(np.float32)
    k = RNG.standard_normal((2, 2, 33, 16)).astype(np.float32)  # K rows [B, Nkv, T, H], not K^T
    v = RNG.standard_normal((2, 2, 33, 12)).astype(np.float32)
    mask = np.zeros((2, 1, s, 33), np.float32)
    mask[..., 30:] = LOWEST
    want = reference(q, np.repeat(k, 4, axis=1).transpose(0, 1, 3, 2), np.repeat(v, 4, axis=1), mask, 1, 0.25)
    got = NAT.attention_chain(q, k, v, mask, 1, 0.25, 2, False, True, 4, 4)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * float(np.abs(want).max()))
    with pytest.raises(ValueError, match="shapes do not chain"):
        NAT.attention_chain(q, k, v, mask, 1, 0.25, 1, False, True, 3, 4)  # 2 x 3 heads for 8 query heads


@needs_native
def test_onnx_and_ms_attention_run_the_native_kernel_with_orts_masked_row_rule(isa):
    """_sdpa.attend (ONNX Attention, com.microsoft MultiHeadAttention / Attention) on the native kernel: within
    float tolerance of its numpy reference, including ORT's rule that a row with every key masked gives zeros, while a
    row holding a NaN stays NaN; softcap and intermediate scores keep the reference."""
    from npu_ep.kernels.ops._sdpa import attend

    q = (RNG.standard_normal((2, 8, 20, 16)) / 4).astype(np.float32)
    k = RNG.standard_normal((2, 2, 24, 16)).astype(np.float32)
    v = RNG.standard_normal((2, 2, 24, 16)).astype(np.float32)
    bias = np.zeros((2, 1, 20, 24), np.float32)
    bias[0, 0, 3] = -np.inf  # every key masked: zeros, as ORT
    bias[1, 0, 5, 7:] = -np.inf
    q[1, 3, 9, 0] = np.nan  # NaN stays NaN
    with np.errstate(invalid="ignore"):
        want, _ = attend(q, k, v, 0.3, bias)
    got, scores = attend(q, k, v, 0.3, bias, native=NAT, threads=2)
    assert scores is None and np.array_equal(np.isnan(got), np.isnan(want))
    assert (got[0, :, 3] == 0).all() and np.isnan(got[1, 3, 9]).all()
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-5, atol=2e-6)
    capped, _ = attend(q, k, v, 0.3, bias, softcap=2.0, native=NAT)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(capped, attend(q, k, v, 0.3, bias, softcap=2.0)[0], equal_nan=True)  # the reference


@needs_native
def test_native_names_operands_that_do_not_chain():
    q, kt, v, _ = _operands(1, 2, 4, 6, 8, 8, None)
    with pytest.raises(ValueError, match=r"shapes do not chain: q \[1, 2, 4, 8\], kt \[1, 2, 8, 6\], v \[1, 2, 5, 8\]"):
        NAT.attention_chain(q, kt, v[:, :, :5], None, 0, 1.0, 1)
    with pytest.raises(ValueError, match="mask must be a float32 array"):
        NAT.attention_chain(q, kt, v, np.zeros((1, 2, 4, 6), np.float64), 0, 1.0, 1)


# --- sessions ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"scale_op": "Div", "s": 24, "t": 24}, {"mask": False, "s": 1, "t": 30},
                                {"nan_guard": 0.0, "s": 20, "t": 20}])
def test_a_session_fuses_the_chain_and_matches_the_cpu_ep(kw):
    model = _chain_model(**kw)
    feeds = _feeds(model)
    want = cpu_run(model, feeds)[0]
    sess = _session(model)
    got = sess.run(None, feeds)[0]
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::AttentionChain"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    if NAT is not None:  # the second call of a signature runs the bound native step
        again = sess.run(None, feeds)[0]
        assert np.array_equal(again, got)
        sig = next(iter(program._bindings))
        assert all(n is not None for n in program._bindings[sig])


@pytest.mark.parametrize("kernels", ["native", "reference"])
@pytest.mark.parametrize("s", [5, 20])  # the kernel's K^T read as rows, and K transposed once per head
def test_a_session_with_ks_transpose_fused_gives_the_bits_of_the_transpose_as_its_own_step(s, kernels):
    """The same chain with K^T also a graph output (so its Transpose stays a step): the same bits."""
    feeds = _feeds(_chain_model(s=s, t=19))
    fused_sess = _session(_chain_model(s=s, t=19), kernels=kernels)
    step_sess = _session(_chain_model(s=s, t=19, kt_out="kt"), kernels=kernels)
    for sess, steps in ((fused_sess, ["npu::AttentionChain"]), (step_sess, ["Transpose", "npu::AttentionChain"])):
        assert set(assignment(sess).values()) == {"NpuEP"}
        (program,) = session_of(sess).programs.values()
        assert [st.op for st in program.steps] == steps
    for _ in range(2):  # the first call binds, the second runs the bound step
        got, want = fused_sess.run(None, feeds)[0], step_sess.run(None, feeds)[0]
        assert np.array_equal(got, want, equal_nan=True)
    np.testing.assert_array_equal(step_sess.run(None, feeds)[1], feeds["k"].transpose(0, 1, 3, 2))


@pytest.mark.parametrize("kw, fused", [({}, True), ({"runtime_shapes": True}, True),
                                       ({"expand": (1, 2, 3, 1, 1), "reshape": (1, 6, 7, 8)}, True),
                                       ({"reshape": (0, 6, -1, 8)}, True),
                                       ({"expand": (3, 2, 1, 1, 1)}, False)])  # heads interleaved: n reads n % 2
def test_a_session_runs_repeat_kv_in_the_fused_step_where_it_repeats_heads_in_place(kw, fused):
    model = _repeat_kv_model(**kw)
    feeds = {"q": RNG.standard_normal((1, 6, 5, 8)).astype(np.float32),
             "k": RNG.standard_normal((1, 2, 7, 8)).astype(np.float32),
             "v": RNG.standard_normal((1, 2, 7, 8)).astype(np.float32)}
    if kw.get("runtime_shapes"):
        feeds.update(eshape=np.asarray([1, 2, 3, 7, 8], np.int64), rshape=np.asarray([1, 6, 7, 8], np.int64))
    want = cpu_run(model, feeds)[0]
    sess = _session(model)
    for _ in range(2):  # the first call binds, the second runs the bound step
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::AttentionChain"]
    if NAT is not None:  # a path that does not repeat in place runs as written (the kernel: no step is bound)
        bound = [natives[0] is not None for natives in program._bindings.values()]
        assert bound == ([True] if fused else [])


@pytest.mark.parametrize("axis, native", [(-1, True), (3, True), (2, False)])
def test_unknown_ranks_fuse_and_the_softmax_axis_is_checked_on_every_call(axis, native):
    """Q, K and V of unknown rank (a Paddle export's attention): the chain fuses; at run time the Softmax over the
    last axis of the scores runs the native kernel, another axis the chain as written."""
    model = _without_shapes(_chain_model(axis=axis, s=6, t=6))
    assert "AttentionChain" in _ops(model)
    feeds = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in
             (("q", (1, 2, 6, 8)), ("k", (1, 2, 6, 8)), ("v", (1, 2, 6, 6)))}
    feeds["mask"] = np.zeros((1, 1, 6, 6), np.float32)
    want = cpu_run(model, feeds)[0]
    sess = _session(model)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert "npu::AttentionChain" in [st.op for st in program.steps]
    if NAT is not None:
        fused_bound = [natives[-1] is not None for natives in program._bindings.values()]
        assert fused_bound == ([True] if native else [])  # the chain as written: nothing of the program is bound


def test_the_reference_kernels_compute_the_unfused_chain_bit_for_bit():
    model = _chain_model(s=20, t=20)
    feeds = _feeds(model)
    sess = _session(model, kernels="reference")
    got = sess.run(None, feeds)[0]
    assert set(assignment(sess).values()) == {"NpuEP"}
    kt = feeds["k"].transpose(0, 1, 3, 2)
    scores = np.add(np.multiply(np.matmul(feeds["q"], kt), np.float32(0.35)), feeds["mask"])
    e = np.exp(scores - scores.max(-1, keepdims=True))
    assert np.array_equal(got, np.matmul(e / e.sum(-1, keepdims=True), feeds["v"]))
    # with repeat_kv: the path's own kernels (a G-fold copy), then the chain
    model = _repeat_kv_model()
    feeds = {x: RNG.standard_normal((1, n, t, 8)).astype(np.float32) for x, n, t in (("q", 6, 5), ("k", 2, 7),
                                                                                   ("v", 2, 7))}
    got = _session(model, kernels="reference").run(None, feeds)[0]
    k, v = (np.repeat(feeds[x], 3, axis=1) for x in "kv")
    scores = np.multiply(np.matmul(feeds["q"], k.transpose(0, 1, 3, 2)), np.float32(0.35))
    e = np.exp(scores - scores.max(-1, keepdims=True))
    assert np.array_equal(got, np.matmul(e / e.sum(-1, keepdims=True), v))


@pytest.mark.parametrize("nan_guard", [False, True])
def test_an_exported_decoder_runs_its_attention_fused_in_prefill_and_decode(tmp_path, nan_guard):
    """The tiny Llama as torch exports it (not rewritten; with the SDPA decomposition's NaN guard or without): each
    layer's attention is one fused step, bound in the prefill (S >= 16: K transposed once per head) and in decode
    steps; tokens equal the CPU EP's."""
    from npu_ep.models.tiny_llama import build_tiny_llama
    from npu_ep.models.weights import LlamaConfig
    from npu_ep.tools.generation import Generator

    model = build_tiny_llama(tmp_path / "tiny.onnx", nan_guard=nan_guard)
    sess = _session(str(model))
    gen = Generator(sess, max_kv_len=64)
    ref = Generator(str(model), providers=["CPUExecutionProvider"], max_kv_len=64)
    prompt = [int(x) for x in RNG.integers(3, 900, 24)]
    got, want = gen.generate(prompt, 8), ref.generate(prompt, 8)
    assert got.tokens == want.tokens
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=2e-5 * float(np.abs(want.logits).max()))
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    fused = [i for i, st in enumerate(program.steps) if st.op == "npu::AttentionChain"]
    assert len(fused) == LlamaConfig().num_hidden_layers
    assert not any(st.op in ("Softmax", "IsNaN") for st in program.steps)
    assert [st.op for st in program.steps].count("Expand") == 1  # the causal mask's; repeat_kv runs in the fused step
    if NAT is not None:
        for sig, natives in program._bindings.items():
            assert all(natives[i] is not None for i in fused), f"an attention step is not bound for {sig}"
        lengths = {sig[0][1] for sig in program._bindings}  # input_ids [1, S]: the generator pads prompts to buckets
        assert 1 in lengths and max(lengths) >= len(prompt)  # decode and prefill signatures
