"""Differential sweep of the native float GEMMs (kernels/native/packed_sgemm*.cc, float_matmul.cc,
sgemm_columns.cc), issue 38.

The packed GEMM's specification is its portable path (packed_sgemm.h: fused multiply-adds in order of k within
chunks of 256, the chunks added in order, then bias and ReLU): the AVX-512 path must give its bits exactly, NaN and
Inf included, at every shape and thread count. Its blocks: panels of 32 columns in two 16-lane masks; tiles of 8
rows (7..1-row tiles for the rest); one or two rows take WideTile (four panels at a time) or, deeper than one chunk
with fewer than four panels, DeepTile (four chunks at a time); A is read in place at its own row pitch; tasks of 128
rows. Against the reference model (numpy's BLAS, another summation order) a product is within twice the
forward error bound of a float32 dot product, K * 2^-24 * sum |a| |b| (Higham 3.1): each side is within one bound
of the exact sum. MatMul / Gemm through their kernels are swept the same way, runtime B (float_matmul_batched) and,
below AVX-512, the two-half sgemm_columns split."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import REF, bound_step_outputs, around, assert_native_ran, native_vs_reference, with_specials
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import host_blas
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_testing import make_model

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(380)
AVX512 = "avx512" in host_isas()
ROWS = [1, 2, 3, 7, 8, 9, 15, 16, 17]   # WideTile / DeepTile (1, 2), 8-row tiles and their 7..1-row tails
COLS = around(16, 32, 64, 128)           # a panel's two 16-lane halves, panels, WideTile's four panels
DEPTHS = [0, 1, 7, 8, 9, 255, 256, 257]  # the 8x8 transpose's blocks, the 256-deep chunks (K = 0: zeros)


def _kern():
    return runtime.native_module()


def _portable(a, packed, n, **kw):
    """The product on the portable path: the specification of every other path's bits."""
    with _capped("scalar"):
        return _kern().float_matmul_packed(a, packed, n, threads=1, **kw)


class _capped:
    def __init__(self, isa: str):
        self._gen = cap_isa(isa)

    def __enter__(self):
        next(self._gen)

    def __exit__(self, *exc):
        self._gen.close()


def _bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {int((~same).sum())} of {got.size} differ, first at " \
                       f"{np.argwhere(~same)[0].tolist()}: {got[~same][0]!r} vs {want[~same][0]!r}"


def _within_bound(got: np.ndarray, want: np.ndarray, a: np.ndarray, b: np.ndarray, what: str) -> None:
    """|got - want| <= 2 * K * 2^-24 * |a| @ |b| (both within one bound of the exact product); NaN / Inf equal."""
    k = a.shape[-1]
    bound = 2 * k * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)], err_msg=what)
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    assert (err <= np.broadcast_to(bound, want.shape)[finite]).all(), f"{what}: error beyond the bound"


def _packed_case(m, k, n, threads=1, bias=False, relu=False, specials=False):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    if specials and a.size:
        a = with_specials(a, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 1e-45, 1e30), fraction=0.01)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    packed = _kern().pack_sgemm_b(b)
    kw = {}
    if bias:
        kw["bias"] = RNG.standard_normal(n).astype(np.float32)
    if relu:
        kw["relu"] = True
    got = _kern().float_matmul_packed(a, packed, n, threads=threads, **kw)
    _bits_equal(got, _portable(a, packed, n, **kw), f"M={m} K={k} N={n} threads={threads} {list(kw)}")
    if not specials and not kw:
        _within_bound(got, a @ b, a, b, f"M={m} K={k} N={n}")


@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_rows_by_columns():
    for m in ROWS:
        for n in COLS:
            _packed_case(m, 33, n, bias=m % 2 == 1, relu=n % 2 == 1)


@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_depths():
    for k in DEPTHS + [511, 512, 513, 1025]:  # 1025: DeepTile's four chunks and a one-deep tail
        for m, n in ((1, 33), (2, 95), (3, 17), (9, 64), (1, 129)):
            _packed_case(m, k, n, bias=k % 2 == 1, relu=True)


@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_special_values_and_threads():
    for m, k, n in ((1, 300, 40), (2, 520, 33), (8, 64, 97), (17, 257, 31), (129, 40, 65)):  # 129: two row tasks
        _packed_case(m, k, n, threads=2, bias=True, relu=True, specials=True)
        _packed_case(m, k, n, threads=2, specials=True)


def _gemm_inputs(m, k, n, b_const=True):
    return [("a", RNG.standard_normal((m, k)).astype(np.float32), False),
            ("b", RNG.standard_normal((k, n)).astype(np.float32), b_const)]


def _check_product(op, inputs, native_fn, threads=1, **attrs):
    got, want, calls = native_vs_reference(op, inputs, threads=threads, **attrs)
    what = f"{op} {[s[1].shape for s in inputs]} {attrs}"
    assert_native_ran(calls, native_fn, what)
    a = inputs[0][1].T if attrs.get("transA") else inputs[0][1]
    b = inputs[1][1].T if attrs.get("transB") else inputs[1][1]
    _within_bound(got[0], want[0], a, b, what)


@pytest.mark.skipif(not AVX512, reason="the packed GEMM runs MatMul on AVX-512 hosts")
def test_matmul_and_gemm_ops_with_constant_b():
    for m in (1, 2, 8, 9, 17):
        for n in (15, 32, 33, 129):
            _check_product("MatMul", _gemm_inputs(m, 257, n), "float_matmul_packed")
            inputs = _gemm_inputs(m, 40, n) + [("c", RNG.standard_normal(n).astype(np.float32), True)]
            _check_product("Gemm", inputs, "float_matmul_packed")
    a = RNG.standard_normal((33, 9)).astype(np.float32)
    _check_product("Gemm", [("a", a, False), ("b", RNG.standard_normal((65, 33)).astype(np.float32), True)],
                   "float_matmul_packed", transA=1, transB=1)


@pytest.mark.skipif(not AVX512, reason="float_matmul_batched runs on AVX-512 hosts")
def test_matmul_op_runtime_b_batched():
    for m in (8, 9, 16, 17):
        for n in (1, 31, 33):
            a = RNG.standard_normal((2, m, 70)).astype(np.float32)
            b = RNG.standard_normal((2, 70, n)).astype(np.float32)
            _check_product("MatMul", [("a", a, False), ("b", b, False)], "float_matmul_batched", threads=2)


@pytest.mark.skipif("avx2" not in host_isas(), reason="sgemm_columns is the split of hosts without the packed GEMM")
def test_sgemm_columns_split_below_avx512():
    """A product of 16 M multiply-adds or more, columns cut at N // 2 (an odd N: unequal halves)."""
    if not host_blas.sgemm_address():
        pytest.skip("no CBLAS sgemm in this numpy")
    with _capped("avx2"):
        for m, k, n in ((64, 512, 513), (3, 2048, 2731)):
            inputs = _gemm_inputs(m, k, n)
            assert host_blas.splits(inputs[0][1], inputs[1][1])
            _check_product("MatMul", inputs, "sgemm_columns", threads=2)


@pytest.mark.parametrize("isa_name", [i for i in host_isas() if i in ("scalar", "avx2")])
def test_below_avx512_a_constant_b_binds_numpys_product_with_its_epilogue(isa_name):
    """Without the packed GEMM, a MatMul / Gemm with a constant B binds float_matmul (float_matmul.cc: numpy's own
    product, then bias in place): the reference's bits, NaN and Inf included, in the bound step too (_sweep)."""
    with _capped(isa_name):
        for m, k, n in ((1, 7, 5), (9, 33, 17), (2, 64, 64)):
            a = with_specials(RNG.standard_normal((m, k)).astype(np.float32), RNG, fraction=0.02)
            b = RNG.standard_normal((k, n)).astype(np.float32)
            c = RNG.standard_normal(n).astype(np.float32)
            for op, inputs in (("MatMul", [("a", a, False), ("b", b, True)]),
                               ("Gemm", [("a", a, False), ("b", b, True), ("c", c, True)])):
                got, want, calls = native_vs_reference(op, inputs)
                assert_native_ran(calls, "float_matmul", f"{op} {(m, k, n)}")
                _bits_equal(got[0], want[0], f"{op} {(m, k, n)} on {isa_name}")


def _epilogue_model(m: int, k: int, n: int, relu: bool, qtype) -> onnx.ModelProto:
    """MatMul -> Add(bias) [-> Relu] [-> QuantizeLinear to qtype]: the compiler fuses it into one MatMulEpilogue."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], "mm"),
             helper.make_node("Add", ["mm", "bias"], ["y0"], "add")]
    inits = {"w": RNG.standard_normal((k, n)).astype(np.float32), "bias": RNG.standard_normal(n).astype(np.float32)}
    last = "y0"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["y1"], "relu"))
        last = "y1"
    out = TensorProto.FLOAT
    if qtype is not None:
        nodes.append(helper.make_node("QuantizeLinear", [last, "s", "z"], ["y2"], "q"))
        inits.update(s=np.array(0.05, np.float32), z=np.array(-3 if qtype == np.int8 else 7, qtype))
        last, out = "y2", helper.np_dtype_to_tensor_dtype(np.dtype(qtype))
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                      [helper.make_tensor_value_info(last, out, [m, n])], inits, opset=21)


def _fused_native_and_reference(model, x):
    (node,) = fuse_partition(nodes_from_model(model), REF)
    kernel = kernel_for(*node.key)
    outs, bound = {}, []
    for kernels in ("native", "reference"):
        p = kernel.prepare(node, REF)
        runtime.configure([p], kernels, 1)
        with np.errstate(all="ignore"):
            outs[kernels] = kernel.run(p, [x])[0]
            if kernels == "native":
                bound = bound_step_outputs(kernel, p, [x], [outs[kernels]])
    assert bound and bound[0].tobytes() == outs["native"].tobytes(), "the bound step is not the kernel's"
    return outs["native"], outs["reference"]


@pytest.mark.parametrize("isa_name", [i for i in host_isas() if i in ("scalar", "avx2", "avx512")])
def test_fused_bias_relu_quantize_epilogues(isa_name):
    """MatMulEpilogue: + bias, ReLU (NaN stays, -0 becomes +0) and an 8-bit QuantizeLinear (NaN to the lowest code)
    in place after the product. Below AVX-512 the product is numpy's: the reference's bits. On AVX-512 it is the
    packed GEMM's, summed in another order: floats within 1e-5 of the output's scale (two orders of K products
    differ by a few ulps of the largest partial sums, as test_native_norm_matmul_float.py), codes within 1 (a
    product on either side of a rounding boundary); NaN and Inf in x land in the same places (no huge finite
    values here, whose overflow would depend on the order)."""
    with _capped(isa_name):
        for m, k, n in ((1, 7, 5), (9, 33, 17), (3, 300, 64)):
            x = with_specials(RNG.standard_normal((m, k)).astype(np.float32) * 3, RNG,
                              values=(np.nan, np.inf, -np.inf, -0.0), fraction=0.01)
            for relu, qtype in ((True, np.uint8), (False, np.int8), (True, None), (False, None)):
                got, want = _fused_native_and_reference(_epilogue_model(m, k, n, relu, qtype), x)
                what = f"{(m, k, n)} relu={relu} {qtype} on {isa_name}"
                assert got.dtype == want.dtype and got.shape == want.shape, what
                if isa_name != "avx512":
                    _bits_equal(got, want, what) if got.dtype.kind == "f" else np.testing.assert_array_equal(got, want)
                elif got.dtype.kind == "f":
                    finite = np.isfinite(want)
                    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=what)  # NaN, +-Inf
                    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
                    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5 * scale, err_msg=what)
                else:
                    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, what


@pytest.mark.slow
@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_full_grid():
    for m in ROWS + [31, 32, 33, 127, 128, 129]:
        for n in COLS:
            for k in DEPTHS + [513, 1025]:
                _packed_case(m, k, n, threads=1 + (m + n) % 2, bias=k % 2 == 0, relu=n % 3 == 0,
                             specials=m % 3 == 0)


def _half_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == np.float16, what
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {int((~same).sum())} of {got.size} differ"


@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_float16_is_the_float32_product_rounded_once():
    """float_matmul_packed on a float16 A widens it exactly and rounds the float32 result (bias and ReLU applied)
    to float16 once: the bits of the float32 call on A.astype(float32), rounded, across the row tiles and tails,
    panels, chunks, thread counts and special values (float16's max, its smallest subnormal, Inf, NaN)."""
    for m, k, n in ((1, 33, 17), (2, 257, 95), (8, 64, 32), (9, 40, 129), (17, 511, 33), (129, 8, 65)):
        a = RNG.standard_normal((m, k)).astype(np.float16)
        a = with_specials(a, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504.0), fraction=0.01)
        packed = _kern().pack_sgemm_b(RNG.standard_normal((k, n)).astype(np.float32))
        bias = RNG.standard_normal(n).astype(np.float32)
        for threads in (1, 2):
            for kw in ({}, {"bias": bias, "relu": True}):
                got = _kern().float_matmul_packed(a, packed, n, threads=threads, **kw)
                want = _kern().float_matmul_packed(a.astype(np.float32), packed, n, threads=1, **kw)
                _half_bits_equal(got, want.astype(np.float16), f"M={m} K={k} N={n} threads={threads} {list(kw)}")


@pytest.mark.skipif(not AVX512, reason="the packed GEMM runs float16 MatMul on AVX-512 hosts")
def test_float16_matmul_and_gemm_bind_the_packed_gemm_with_the_references_bits():
    """A float16 MatMul / Gemm with a constant B is a bound float_matmul_packed step, bit for bit the reference's
    (which widens A, makes the same float32 product and rounds once), special values included."""
    for m in (1, 2, 9, 17):
        for n in (15, 33, 129):
            a = with_specials(RNG.standard_normal((m, 40)).astype(np.float16), RNG,
                              values=(np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504.0), fraction=0.02)
            b = RNG.standard_normal((40, n)).astype(np.float16)
            c = RNG.standard_normal(n).astype(np.float16)
            for op, inputs in (("MatMul", [("a", a, False), ("b", b, True)]),
                               ("Gemm", [("a", a, False), ("b", b, True), ("c", c, True)])):
                got, want, calls = native_vs_reference(op, inputs)
                assert_native_ran(calls, "float_matmul_packed", f"{op} float16 {(m, n)}")
                _half_bits_equal(got[0], want[0], f"{op} float16 {(m, n)}")


@pytest.mark.skipif(not AVX512, reason="the packed GEMM runs float16 MatMul on AVX-512 hosts")
def test_float16_matmul_with_bias_and_relu_runs_on_npu_ep_as_the_cpu_ep():
    """MatMul -> Add -> Relu in float16 through a session: NpuEP runs it (graph assignment) as a bound native step,
    no Python step, within float16 rounding of the CPU EP (ORT's MLAS rounds after its own float32 sum order)."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_testing import assignment, cpu_run, npu_session, session_options

    f16 = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], "mm"),
             helper.make_node("Add", ["mm", "bias"], ["s"], "add"), helper.make_node("Relu", ["s"], ["y"], "relu")]
    inits = {"w": (RNG.standard_normal((96, 80)) / 10).astype(np.float16),
             "bias": RNG.standard_normal(80).astype(np.float16)}
    model = make_model(nodes, [helper.make_tensor_value_info("x", f16, ["m", 96])],
                       [helper.make_tensor_value_info("y", f16, ["m", 80])], inits, opset=21)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    for m in (1, 1, 1, 9, 9, 9, 33, 33, 33, 600, 600, 600):  # 600: a task per 128 rows
        x = RNG.standard_normal((m, 96)).astype(np.float16)
        got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
    assert [st.op for st in program.steps] == ["npu::MatMulEpilogue"]
    assert len(program._bindings) == 4 and all(type(n[0]).__name__ == "CallStep" for n in program._bindings.values())
    assert program.native_step_counts[0] >= 3  # each batch's third call ran the bound step


# --- float_matmul_batched: per batch the packed GEMM's bits on B packed on the call (a large B on two threads) ---

def _batched_spec(a: np.ndarray, b: np.ndarray, **kw) -> np.ndarray:
    """Per batch, the portable path's product on B packed by pack_sgemm_b: the batched product's specification."""
    out = np.empty((*a.shape[:-1], b.shape[-1]), np.float32)
    for idx in np.ndindex(*a.shape[:-2]):
        out[idx] = _portable(a[idx], _kern().pack_sgemm_b(np.ascontiguousarray(b[idx])), b.shape[-1], **kw)
    return out


@pytest.mark.skipif(not AVX512, reason="float_matmul_batched runs on AVX-512 hosts")
def test_batched_is_the_packed_product_per_batch_in_any_layout_with_bias_relu_and_specials():
    """N around the panels and the two threads' panel groups; K * N >= 65536 packs B on both threads; B as it comes
    and as a transposed copy's view (attention's K^T: the strided packing)."""
    rng = np.random.default_rng(381)
    for batch, m, k, n in (((), 8, 33, 31), ((2,), 9, 257, 289), ((), 17, 256, 256), ((1, 2), 16, 300, 225),
                           ((), 130, 512, 161), ((), 3, 0, 40)):
        a = rng.standard_normal((*batch, m, k)).astype(np.float32)
        if a.size:
            a = with_specials(a, rng, values=(np.nan, np.inf, -np.inf, -0.0, 1e-45, 1e30), fraction=0.01)
        b = rng.standard_normal((*batch, k, n)).astype(np.float32)
        b_t = np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)
        bias = rng.standard_normal(n).astype(np.float32)
        for kw in ({}, {"bias": bias, "relu": True}):
            want = _batched_spec(a, b, **kw)
            for b_in in (b, b_t):
                for threads in (1, 2):
                    got = _kern().float_matmul_batched(a, b_in, threads, None, **kw)
                    _bits_equal(got, want, f"{batch} M={m} K={k} N={n} threads={threads} {list(kw)} "
                                           f"B strides {b_in.strides}")


def test_batched_writes_into_out_only_where_it_fits():
    rng = np.random.default_rng(382)
    a = rng.standard_normal((2, 9, 40)).astype(np.float32)
    b = rng.standard_normal((2, 40, 33)).astype(np.float32)
    want = _kern().float_matmul_batched(a, b)
    out = np.full((2, 9, 33), np.nan, np.float32)
    assert _kern().float_matmul_batched(a, b, 1, out) is out and out.tobytes() == want.tobytes()
    read_only = np.empty((2, 9, 33), np.float32)
    read_only.flags.writeable = False
    for wrong in (np.empty((2, 9, 34), np.float32), np.empty((2, 9, 33), np.float64), np.empty((18, 33), np.float32),
                  np.empty((2, 33, 9), np.float32).swapaxes(1, 2), read_only):
        y = _kern().float_matmul_batched(a, b, 1, wrong)
        assert y is not wrong and y.tobytes() == want.tobytes()


@pytest.mark.skipif(not AVX512, reason="float_matmul_batched runs on AVX-512 hosts")
@pytest.mark.parametrize("is_output", [True, False])
def test_a_large_product_of_two_inputs_runs_as_a_bound_step_on_npu_ep(monkeypatch, is_output):
    """x @ w of two session inputs, large enough that host_blas would cut it in two (16 M multiply-adds): a bound
    float_matmul_batched step (no Python step), written into ORT's buffer when it is the partition's output, within
    the dot-product bound of the CPU EP's result, the same bits run after run."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, npu_session, session_options

    nat = _kern()
    seen = []
    real = nat.float_matmul_batched

    def spy(*args, **kw):
        y = real(*args, **kw)
        seen.append(len(args) > 3 and args[3] is not None and y is args[3])
        return y

    monkeypatch.setattr(nat, "float_matmul_batched", spy)
    m, k, n = 64, 512, 520
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if is_output else "t"], "mm")]
    if not is_output:  # a Sigmoid after the product keeps it inside the partition
        nodes.append(helper.make_node("Sigmoid", ["t"], ["y"], "sig"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], {}, opset=21)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)  # products of order 1 into the Sigmoid
    assert host_blas.splits(x, w)
    runs = [sess.run(None, {"x": x, "w": w})[0] for _ in range(3)]
    assert all(r.tobytes() == runs[0].tobytes() for r in runs)
    want = cpu_run(model, {"x": x, "w": w})[0]
    if is_output:
        _within_bound(runs[0], want, x, w, "MatMul of two inputs")
    else:
        np.testing.assert_allclose(runs[0], want, rtol=1e-5, atol=1e-5)
    assert python_steps(sess) == []
    (program,) = session_of(sess).programs.values()
    assert program.native_step_counts[0] >= 2
    assert seen and seen[-1] is is_output


def test_packed_and_norm_products_borrow_float32_arrays_and_convert_others():
    """float_matmul_packed, float_matmul_batched and norm_matmul_float take their weight arrays as objects (AsArray):
    C-order float32 arrays as they are, others through numpy's safe conversion as pybind11's caster made it (a
    float16 or strided array converted, float64 refused), a TypeError naming the argument where there is none."""
    rng = np.random.default_rng(383)
    a = rng.standard_normal((3, 40)).astype(np.float32)
    b = rng.standard_normal((40, 33)).astype(np.float32)
    bias16 = rng.standard_normal(33).astype(np.float16)
    bias = bias16.astype(np.float32)
    strided = np.repeat(bias, 2)[::2]
    packed = _kern().pack_sgemm_b(b)
    want = _kern().float_matmul_packed(a, packed, 33, bias=bias)
    for other in (bias16, strided):
        assert _kern().float_matmul_packed(a, packed, 33, bias=other).tobytes() == want.tobytes()
        assert _kern().float_matmul_batched(a, b, 1, None, other).tobytes() == \
            _kern().float_matmul_batched(a, b, 1, None, bias).tobytes()
    for bad in (bias.astype(np.float64), object()):
        with pytest.raises(TypeError, match="float_matmul_packed: bias must be an array of float32"):
            _kern().float_matmul_packed(a, packed, 33, bias=bad)
    with pytest.raises(TypeError, match="float_matmul_packed: packed must be an array of float32"):
        _kern().float_matmul_packed(a, object(), 33)
    y = _kern().norm_matmul_float(a, None, packed, 33, None, 1e-6, False, bias, False)
    assert _kern().norm_matmul_float(a.astype(np.float16).astype(np.float32), None, packed, 33, None, 1e-6, False,
                                     bias16, False)[0].tobytes() == \
        _kern().norm_matmul_float(a.astype(np.float16), None, packed, 33, None, 1e-6, False, bias, False)[0].tobytes()
    assert y[0].shape == (3, 33)
    with pytest.raises(TypeError, match="norm_matmul_float: skip must be an array of float32"):
        _kern().norm_matmul_float(a, object(), packed, 33, None, 1e-6, False, None, False)


@pytest.mark.skipif(not AVX512, reason="the packed GEMM's vector path is AVX-512")
def test_packed_float16_by_row_blocks_is_the_float32_product_rounded_once():
    """From two 128-row blocks per thread on, a float16 product runs a task per block (widen, multiply, round):
    the same bits as the float32 call on the widened A, rounded once; M around the blocks and the switch (256 rows
    on one thread, 512 on two), a 3-D A, special values, bias and ReLU."""
    rng = np.random.default_rng(384)
    for shape, n in (((255, 40), 33), ((256, 40), 33), ((257, 257), 95), ((383, 9), 17), ((1, 511, 33), 32),
                     ((2, 256, 64), 65), ((641, 40), 31)):
        a = with_specials(rng.standard_normal(shape).astype(np.float16), rng,
                          values=(np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504.0), fraction=0.01)
        packed = _kern().pack_sgemm_b(rng.standard_normal((shape[-1], n)).astype(np.float32))
        bias = rng.standard_normal(n).astype(np.float32)
        for kw in ({}, {"bias": bias, "relu": True}):
            want = _kern().float_matmul_packed(a.astype(np.float32), packed, n, threads=1, **kw)
            with np.errstate(over="ignore"):
                want = want.astype(np.float16)
            for threads in (1, 2):
                out = np.empty(want.shape, np.float16)
                got = _kern().float_matmul_packed(a, packed, n, threads=threads, out=out, **kw)
                assert got is out
                _half_bits_equal(got, want, f"{shape} N={n} threads={threads} {list(kw)}")
