"""The packed-B float GEMM (``kernels/native/packed_sgemm.h``): the native float MatMul of large products with a
constant B on AVX-512 hosts. Its sums run in a fixed order that is not numpy's BLAS's, so it is checked against
exact (float64) math within the forward error bound of a float32 dot product, K * 2^-24 * sum |a| |b| (Higham,
"Accuracy and Stability of Numerical Algorithms", 3.1), and against itself: every ISA path and thread count gives
the same bits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import matmul
from tests.kernels._isa import ISA_ORDER, cap_isa, host_isas
from tests.kernels.test_bound_native_calls import compiled, float_mm_model, prepared
from tests.loop_oracle import python_loop
from tests.npu_testing import assignment, cpu_run, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(23)
AVX512 = "avx512" in host_isas()


def kern():
    return runtime.native_module()


def within_bound(y: np.ndarray, a: np.ndarray, b: np.ndarray, exact: np.ndarray) -> None:
    k = a.shape[-1]
    bound = k * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30
    assert (np.abs(y - exact) <= bound).all(), float(np.max(np.abs(y - exact) / bound))


def portable_product(a, packed, n, isa):
    """The product on the portable path (the same multiply-adds in the same order), then back to ``isa``."""
    kern().set_isa_cap(0)
    try:
        return kern().float_matmul_packed(a, packed, n, threads=1)
    finally:
        kern().set_isa_cap(ISA_ORDER.index(isa))


# M: row tails of the 8-row tile, M = 0 (an empty batch); N: panels of 32 and their tails; K: depth chunks of 256
# and their tails, K = 0
SHAPES = [(128, 1024, 256), (9, 513, 47), (1, 3, 1), (17, 256, 33), (5, 0, 7), (3, 257, 64), (70, 600, 100),
          (0, 16, 8)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_the_product_is_within_the_float32_error_bound_and_the_same_on_every_isa(isa, m, k, n):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    packed = kern().pack_sgemm_b(b)
    y = kern().float_matmul_packed(a, packed, n, threads=2)
    assert y.shape == (m, n) and y.dtype == np.float32
    within_bound(y, a, b, a.astype(np.float64) @ b.astype(np.float64))
    assert portable_product(a, packed, n, isa).tobytes() == y.tobytes()


def test_the_bits_do_not_depend_on_the_thread_count():
    a = RNG.standard_normal((2, 200, 700)).astype(np.float32)  # rank 3: the rows of every leading index
    b = RNG.standard_normal((700, 300)).astype(np.float32)
    packed = kern().pack_sgemm_b(b)
    one, two = (kern().float_matmul_packed(a, packed, 300, threads=t) for t in (1, 2))
    assert one.shape == (2, 200, 300) and one.tobytes() == two.tobytes()
    within_bound(one.reshape(-1, 300), a.reshape(-1, 700), b, a.reshape(-1, 700).astype(np.float64) @ b)


@pytest.mark.parametrize("tn", [20, 48, 64])
def test_a_plans_tiles_give_the_same_bits_also_where_they_cut_through_a_panel(isa, tn):
    """With a tile plan (DMA counting) the kernel runs the plan's output tiles; a tile edge inside a 32-column panel
    computes the panel aside and copies its part. Each output is still summed whole, in the same order."""
    m, k, n = 37, 600, 150
    a = RNG.standard_normal((m, k)).astype(np.float32)
    packed = kern().pack_sgemm_b(RNG.standard_normal((k, n)).astype(np.float32))
    bias = RNG.standard_normal(n).astype(np.float32)
    plain = kern().float_matmul_packed(a, packed, n, bias=bias, relu=True)
    plan = (5, tn, 128, 0, 8, 8, 8, 0, 0)  # tm, tn, tk, nothing resident, 4 bytes per element (in half-bytes)
    tiled, dma = kern().float_matmul_packed(a, packed, n, plan, True, bias=bias, relu=True, threads=2)
    assert tiled.tobytes() == plain.tobytes()
    tiles = -(-m // 5) * -(-n // tn)
    assert dma["out"] == m * n * 8 and dma["a"] == -(-n // tn) * m * k * 8 and dma["b"] == -(-m // 5) * k * n * 8
    assert dma["transfers"] == tiles * (1 + 2 * -(-k // 128))


def test_bias_relu_and_quantize_are_the_reference_passes_on_the_product():
    """In the registers, + bias then ReLU as np.maximum(y, 0) give the bits of those numpy passes over the bare
    product: a NaN row stays NaN, -0 becomes +0; the quantize is float_matmul's."""
    m, k, n = 20, 300, 70
    a = RNG.standard_normal((m, k)).astype(np.float32)
    a[3, 5] = np.nan
    a[4] = 0.0
    b = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    bias[::7] = -0.0
    packed = kern().pack_sgemm_b(b)
    bare = kern().float_matmul_packed(a, packed, n)
    fused = kern().float_matmul_packed(a, packed, n, bias=bias, relu=True)
    want = np.maximum(bare + bias, np.float32(0))
    assert fused.tobytes() == want.tobytes()
    assert np.isnan(fused[3]).all() and not np.signbit(fused).any()
    q = kern().float_matmul_packed(a, packed, n, bias=bias, relu=True, quantize=(0.05, 10, False))
    ref_q = kern().float_matmul(np.matmul, a, b, bias, True, (0.05, 10, False))  # same epilogue, numpy's product
    assert q.dtype == np.uint8 and np.abs(q.astype(int) - ref_q.astype(int)).max() <= 1


def test_a_packed_b_of_another_shape_is_refused_with_the_shapes():
    packed = kern().pack_sgemm_b(np.ones((64, 40), np.float32))
    assert packed.shape == (2, 64, 32)
    with pytest.raises(ValueError, match="64 rows x 72 columns"):
        kern().float_matmul_packed(np.ones((2, 64), np.float32), packed, 72)
    with pytest.raises(ValueError, match=r"a has 63 columns .* 63 rows x 40 columns"):
        kern().float_matmul_packed(np.ones((2, 63), np.float32), packed, 40)
    with pytest.raises(ValueError, match="bias has 3 values for 40"):
        kern().float_matmul_packed(np.ones((2, 64), np.float32), packed, 40, bias=np.ones(3, np.float32))


# --- in the kernel and the session -------------------------------------------------------------------------------

BIG = ((2, 64, 512), 512, 520)  # 64 M multiply-adds: a product host_blas would cut in two


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
def test_a_large_product_binds_the_packed_gemm_and_the_loop_oracle_gives_its_bits():
    a_shape, k, n = BIG
    model = float_mm_model(a_shape, k, n, tail=("bias", "relu"))
    program = compiled(model)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    first = program(a)[0]
    assert program._bound[(a_shape,)].native_steps == 1
    got = program(a)[0]
    assert got.tobytes() == first.tobytes()
    assert python_loop(program, (a,))[0].tobytes() == first.tobytes()
    (step,) = program.steps
    assert matmul.PACKED_B in step.prepared.kernel_cache
    b, bias = (np.asarray(step.prepared.consts[c]) for c in ("b", "ep_bias"))
    exact = np.maximum(a.reshape(-1, k).astype(np.float64) @ b + bias, 0)
    within_bound(got.reshape(-1, n), a.reshape(-1, k), b, exact)


def test_small_products_run_packed_and_the_reference_model_keeps_numpys_bits():
    """On AVX-512 hosts a small product runs the packed GEMM too (no call back into numpy); elsewhere, and in the
    reference model at any size, numpy's matmul and its bits."""
    small = float_mm_model((4, 16), 16, 8)
    kernel, p = prepared(small, "MatMul")
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    b = p.consts["b"]
    got = kernel.run(p, [x])[0]
    if AVX512:
        assert matmul.PACKED_B in p.kernel_cache
        within_bound(got, x, b, x.astype(np.float64) @ b)
    else:
        assert got.tobytes() == np.matmul(x, b).tobytes()
    big = float_mm_model(*BIG)
    kernel, p = prepared(big, "MatMul")
    runtime.configure([p], "reference", 2)
    x = RNG.standard_normal(BIG[0]).astype(np.float32)
    assert matmul.PACKED_B not in p.kernel_cache
    np.testing.assert_array_equal(kernel.run(p, [x])[0], np.matmul(x, p.consts["b"]))


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
@pytest.mark.parametrize("is_output", [True, False])
def test_sessions_run_large_products_on_the_packed_gemm_and_match_the_cpu_ep(monkeypatch, is_output):
    """Same bits run after run, the CPU EP's result within float tolerance. A product that is an output of the
    partition is written into ORT's buffer (the bound step passes it as ``out``: the bridge copies nothing); a
    product that only feeds the next step gets an array of its own."""
    nat = kern()
    seen = []
    real = nat.float_matmul_packed

    def spy(*args):
        y = real(*args)
        out = args[9] if len(args) > 9 else None  # the Python kernel's call passes none
        seen.append(out is not None and y is out)
        return y

    monkeypatch.setattr(nat, "float_matmul_packed", spy)
    a_shape, k, n = (128, 512), 512, 520  # 2-D: with a bias, a 3-D A would run as Reshape, Gemm, Reshape
    model = float_mm_model(a_shape, k, n, tail=("bias",))
    if not is_output:  # a Sigmoid after the product: not fused, so the product stays inside the partition
        model.graph.node[-1].output[0] = "t1"
        model.graph.node.append(onnx.helper.make_node("Sigmoid", ["t1"], ["y"], name="sig"))
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    a = RNG.standard_normal(a_shape).astype(np.float32)
    want = cpu_run(model, {"a": a})[0]
    runs = [sess.run(None, {"a": a})[0] for _ in range(3)]
    assert all(r.tobytes() == runs[0].tobytes() for r in runs)
    np.testing.assert_allclose(runs[0], want, rtol=1e-4, atol=1e-4)
    (program,) = session_of(sess).programs.values()
    assert program.native_step_counts[0] >= 2 and program.native_step_counts[1] == 0
    assert any(matmul.PACKED_B in st.prepared.kernel_cache for st in program.steps)
    assert seen and seen[-1] is is_output


# --- float32 sibling groups (npu::MatMulGroup) ---------------------------------------------------------------

def float_qkv_model(m, k, ns):
    """q/k/v float MatMuls on one input, joined by a Concat (as attention joins them): y is the group's product."""
    from onnx import TensorProto, helper
    from tests.npu_testing import make_model

    inits, nodes = {}, []
    for i, n in enumerate(ns):
        inits[f"w{i}"] = RNG.standard_normal((k, n)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"], f"mm{i}"))
    nodes.append(helper.make_node("Concat", ["p0", "p1", "p2"], ["y"], "cat", axis=-1))
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, sum(ns)])], inits)


def group_step(program):
    (i, step), = [(i, s) for i, s in enumerate(program.steps) if s.op == "npu::MatMulGroup"]
    return i, step


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
@pytest.mark.parametrize("swiglu", [False, True])
def test_a_float_group_runs_packed_and_its_bound_step_gives_the_kernels_bits(swiglu):
    from tests.kernels.test_fusion_siblings import _swiglu_model

    m, k = 5, 96
    model = _swiglu_model(m=m, k=k, n=40, float_mm=True) if swiglu else float_qkv_model(m, k, (64, 16, 16))
    program = compiled(model)
    i, step = group_step(program)
    x = RNG.standard_normal((1, m, k)).astype(np.float32)
    first = program(x)
    assert matmul.PACKED_B in step.prepared.kernel_cache
    assert program._bindings[((1, m, k),)][i] is not None  # the group is a native step
    assert all(g.tobytes() == f.tobytes() for g, f in zip(program(x), first))
    assert all(g.tobytes() == f.tobytes() for g, f in zip(python_loop(program, (x,)), first))
    assert program.native_step_counts[1] == 0
    w, rows = step.prepared.consts["w"].astype(np.float64), x.reshape(m, k).astype(np.float64)
    exact = rows @ w
    if swiglu:  # the product's error bound, carried through g * sigmoid(g) * u to float32 rounding
        g, u = exact[:, :40], exact[:, 40:]
        np.testing.assert_allclose(first[0].reshape(m, 40), g / (1 + np.exp(-g)) * u, rtol=1e-4, atol=1e-4)
    else:
        within_bound(first[0].reshape(m, -1), x.reshape(m, k), step.prepared.consts["w"], exact)
    for got, want in zip(first, cpu_run(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
def test_sessions_run_a_float_group_as_one_native_step_and_match_the_cpu_ep():
    model = float_qkv_model(1, 256, (256, 64, 64))
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = RNG.standard_normal((1, 1, 256)).astype(np.float32)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    (program,) = session_of(sess).programs.values()
    i, _ = group_step(program)
    assert next(iter(program._bindings.values()))[i] is not None
    runs, declines = program.native_step_counts
    assert runs >= 2 and declines == 0


# --- products of two runtime operands (float_matmul_batched) ---------------------------------------------------

@pytest.mark.parametrize("batch, m, k, n", [((1, 8), 37, 32, 70), ((2,), 9, 300, 33), ((), 16, 5, 1), ((3,), 8, 0, 4)])
def test_a_batched_product_is_within_the_bound_in_any_layout_and_thread_count(batch, m, k, n):
    a = RNG.standard_normal((*batch, m, k)).astype(np.float32)
    b = RNG.standard_normal((*batch, n, k)).astype(np.float32)
    bt = np.swapaxes(b, -1, -2)  # a transposed view, as attention's K^T
    y = kern().float_matmul_batched(a, bt, threads=2)
    assert y.shape == (*batch, m, n) and y.flags.c_contiguous
    exact = a.astype(np.float64) @ bt.astype(np.float64)
    flat = lambda x, r, c: x.reshape(int(np.prod(batch)), r, c)
    for ai, bi, yi, ei in zip(flat(a, m, k), flat(bt, k, n), flat(y, m, n), flat(exact, m, n)):
        within_bound(yi, ai, bi, ei)
    assert kern().float_matmul_batched(a, np.ascontiguousarray(bt), threads=1).tobytes() == y.tobytes()
    a_view = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)  # rows not unit-stride: copied
    assert kern().float_matmul_batched(a_view, bt).tobytes() == y.tobytes()


def test_a_batched_product_names_operands_that_do_not_fit():
    with pytest.raises(ValueError, match="must share K and batch"):
        kern().float_matmul_batched(np.ones((2, 4, 3), np.float32), np.ones((2, 4, 3), np.float32))
    with pytest.raises(ValueError, match="float32 arrays of one rank"):
        kern().float_matmul_batched(np.ones((4, 3), np.float32), np.ones((2, 3, 4), np.float32))


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
def test_attention_products_of_a_prefill_run_batched_and_the_bound_step_gives_the_kernels_bits():
    from onnx import TensorProto, helper
    from tests.npu_testing import make_model

    model = make_model([helper.make_node("MatMul", ["q", "kt"], ["y"], name="mm")],
                       [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 4, None, 16]),
                        helper.make_tensor_value_info("kt", TensorProto.FLOAT, [1, 4, 16, None])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, None, None])])
    kernel, p = prepared(model, "MatMul")
    q = RNG.standard_normal((1, 4, 33, 16)).astype(np.float32)
    kt = np.swapaxes(RNG.standard_normal((1, 4, 40, 16)).astype(np.float32), -1, -2)
    outs = kernel.run(p, [q, kt])
    assert outs[0].tobytes() == kern().float_matmul_batched(q, kt, threads=runtime.threads(p)).tobytes()
    step = kernel.bind(p, [q, kt], outs)
    from npu_ep.ep import _native as extension
    loop = extension.StepLoop([(kernel.run, p, (0, 1), ((0, 2),), (), step)], 3, (2,), None)
    assert loop((q, kt))[0].tobytes() == outs[0].tobytes() and loop.native_counts == (1, 0)
    np.testing.assert_allclose(outs[0], cpu_run(model, {"q": q, "kt": np.ascontiguousarray(kt)})[0], rtol=1e-5,
                               atol=1e-5)
    one_row = q[:, :, :1]  # a decode step's single query row: numpy's matmul (packing B would cost more)
    assert kernel.run(p, [one_row, kt])[0].tobytes() == np.matmul(one_row, kt).tobytes()


# --- one and two rows: four panels per register tile (their own random stream: the tests above keep their data) ---

# few panels and K past one depth chunk: several chunks summed at once, a narrow panel (N <= 16) without its second
# half, a short last chunk, four full chunks exactly
@pytest.mark.parametrize("m,k,n", [(1, 300, 230), (2, 40, 130), (1, 0, 70), (2, 513, 1000), (1, 3, 1),
                                   (1, 4096, 10), (2, 1300, 20), (1, 1100, 40), (2, 2048, 96), (1, 257, 17)])
def test_one_or_two_rows_give_the_same_bits_as_the_portable_path(isa, m, k, n):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    packed = kern().pack_sgemm_b(b)
    y = kern().float_matmul_packed(a, packed, n, threads=2)
    within_bound(y, a, b, a.astype(np.float64) @ b.astype(np.float64))
    fused = kern().float_matmul_packed(a, packed, n, bias=bias, relu=True)
    assert fused.tobytes() == np.maximum(y + bias, np.float32(0)).tobytes()
    assert portable_product(a, packed, n, isa).tobytes() == y.tobytes()


# --- SwiGLU of the product's halves: 16 lanes on AVX-512 hosts, std::exp elsewhere ---

def test_swiglu_is_within_float_rounding_of_exact_math_on_every_isa_with_edge_values(isa):
    """g * sigmoid(g) * u against float64 math: each path within a few float32 roundings (Cephes' expf is within
    2 ulp; the portable path's std::exp within 1), over a 37-column half (a masked tail). The product is 2 a (B =
    2 I, exact), so a row of a reaches g = +-inf by overflow without NaN, and |g| past exp's range; a NaN row stays
    NaN. g = -inf gives -inf * u, as the reference model's clamped exp does (kernels/ops/matmul_group.py)."""
    rng = np.random.default_rng(29)
    half = 37
    a = rng.standard_normal((3, 2 * half)).astype(np.float32) * 4
    a[0, :5] = [3e38, -3e38, -50.0, 50.0, 0.0]  # g = inf, -inf, -100, 100, 0
    a[2, 0] = np.nan
    two = kern().pack_sgemm_b(2 * np.eye(2 * half, dtype=np.float32))
    got = kern().float_matmul_packed(a, two, 2 * half, swiglu=True)
    y = 2 * a.astype(np.float64)
    y[0, :2] = [np.inf, -np.inf]
    g, u = y[:, :half], y[:, half:]
    with np.errstate(over="ignore", invalid="ignore"):
        want = g / (1.0 + np.exp(np.minimum(-g, 80.0))) * u
    assert np.isnan(got[2]).all() and not np.isnan(got[:2]).any()
    np.testing.assert_allclose(got[:2], want[:2], rtol=4 * 2.0 ** -23, atol=1e-37)


# --- A read in place, a row pitch apart (its own random stream: the tests above keep their data) ---

def _pitched(a: np.ndarray, pitch: int) -> np.ndarray:
    """``a`` [..., M, K] as a view whose rows lie ``pitch`` floats apart, NaN in the gaps (never read)."""
    wide = np.full((*a.shape[:-1], pitch), np.nan, np.float32)
    wide[..., : a.shape[-1]] = a
    return wide[..., : a.shape[-1]]


# rows: WideTile / DeepTile (1, 2), 8-row tiles and their tails, two 128-row tasks; depths: inside one chunk,
# around the 256-deep chunks, four chunks and a tail (a pitch of 1024 floats: rows 4 KB apart); columns: a panel's
# halves and tails
@pytest.mark.parametrize("m,k,n,pitch", [(1, 300, 70, 304), (2, 1025, 40, 1100), (7, 255, 33, 256),
                                         (8, 256, 64, 1024), (9, 257, 31, 300), (17, 513, 97, 1024),
                                         (130, 1000, 65, 1024), (3, 0, 20, 8)])
def test_a_pitched_a_is_read_in_place_with_the_bits_of_a_contiguous_one(isa, m, k, n, pitch):
    """float_matmul_batched takes A's rows where they lie (lda = the row pitch); the gaps between rows hold NaN, so
    a read past a row's K values would show. Special values in A (NaN, +-Inf, -0, a subnormal) land where the
    portable path puts them, at threads 1 and 2."""
    rng = np.random.default_rng(41)
    a = rng.standard_normal((2, m, k)).astype(np.float32)
    if a.size:
        a.flat[rng.choice(a.size, 5, replace=False)] = [np.nan, np.inf, -np.inf, -0.0, 1e-45]
    b = rng.standard_normal((2, k, n)).astype(np.float32)
    view = _pitched(a, pitch)
    assert view.strides[-2] == 4 * pitch
    got = kern().float_matmul_batched(view, b, threads=2)
    assert got.tobytes() == kern().float_matmul_batched(a, b, threads=1).tobytes()
    for i in range(2):
        packed = kern().pack_sgemm_b(b[i])
        assert portable_product(a[i], packed, n, isa).tobytes() == got[i].tobytes()


@pytest.mark.skipif(not AVX512, reason="the packed GEMM is the native float MatMul on AVX-512 hosts only")
def test_a_128x1024x1024_product_on_both_threads_is_within_the_bound_and_the_portable_bits():
    """The benchmark's shape (issue 40): one task per thread of 16 panels each, rows 4 KB apart, four chunks."""
    rng = np.random.default_rng(43)
    a = rng.standard_normal((128, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    packed = kern().pack_sgemm_b(b)
    y = kern().float_matmul_packed(a, packed, 1024, threads=2)
    within_bound(y, a, b, a.astype(np.float64) @ b.astype(np.float64))
    capped = cap_isa("scalar")
    next(capped)
    try:
        portable = kern().float_matmul_packed(a, packed, 1024, threads=1)
    finally:
        capped.close()
    assert portable.tobytes() == y.tobytes()
