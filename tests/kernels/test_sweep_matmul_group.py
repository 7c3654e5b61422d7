"""Differential sweep of a float16 ``npu::MatMulGroup`` of float MatMuls (issue 40): its one product on the packed
GEMM (``float_matmul_packed``: A widened exactly, the float32 product, members' biases and the SwiGLU epilogue,
rounded to float16 once) against the float32 call on the widened A rounded, bit for bit, across row tiles and
tails, panels, halves around the 16-lane SwiGLU vectors, chunks, thread counts and float16 specials; the group's
kernel and its bound step against the reference model (numpy's BLAS product, numpy's SwiGLU, rounded once) within
float16 rounding; a session runs the group with no Python step and the CPU EP's values within float16 rounding."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import host_isas
from _sweep import around, native_calls, with_specials
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options
from tests.kernels.test_bound_native_calls import compiled
from tests.loop_oracle import python_loop

pytestmark = [pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built"),
              pytest.mark.skipif("avx512" not in host_isas(), reason="the packed GEMM's path is AVX-512")]

RNG = np.random.default_rng(4040)
F16 = TensorProto.FLOAT16
HALF_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504.0)


def _kern():
    return runtime.native_module()


def _half_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == np.float16, what
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {int((~same).sum())} of {got.size} differ, first at {np.argwhere(~same)[0].tolist()}"


def test_packed_float16_swiglu_is_the_float32_call_rounded_once():
    for m in (1, 2, 3, 7, 8, 9, 17, 129):  # WideTile rows, 8-row tiles and their tails, two row tasks
        for half in around(16, 32):
            k = (33, 257, 300)[(m + half) % 3]
            a = with_specials(RNG.standard_normal((m, k)).astype(np.float16), RNG, values=HALF_SPECIALS,
                              fraction=0.01)
            packed = _kern().pack_sgemm_b((RNG.standard_normal((k, 2 * half)) / 8).astype(np.float32))
            bias = RNG.standard_normal(2 * half).astype(np.float32)
            for threads in (1, 2):
                for kw in ({}, {"bias": bias}):
                    got = _kern().float_matmul_packed(a, packed, 2 * half, threads=threads, swiglu=True, **kw)
                    want = _kern().float_matmul_packed(a.astype(np.float32), packed, 2 * half, threads=1,
                                                       swiglu=True, **kw)
                    with np.errstate(over="ignore"):  # float16's rounding of a product past its range: inf
                        want = want.astype(np.float16)
                    _half_bits_equal(got, want,
                                     f"M={m} K={k} half={half} threads={threads} {list(kw)}")


def test_packed_float16_rejects_a_quantize_and_writes_into_out():
    a = RNG.standard_normal((3, 40)).astype(np.float16)
    packed = _kern().pack_sgemm_b(RNG.standard_normal((40, 64)).astype(np.float32))
    with pytest.raises(ValueError, match="a float16 product takes no quantize"):
        _kern().float_matmul_packed(a, packed, 64, quantize=(0.1, 0, True))
    out = np.empty((3, 32), np.float16)
    got = _kern().float_matmul_packed(a, packed, 64, swiglu=True, out=out)
    assert got is out
    _half_bits_equal(out, _kern().float_matmul_packed(a.astype(np.float32), packed, 64, swiglu=True)
                     .astype(np.float16), "into out")


def group_model(m, k, ns, *, swiglu, bias=False, dtype=np.float16):
    """float16 (or ``dtype``) MatMuls on one input x: {gate, up} with SwiGLU (ns = (n, n)), or siblings joined by a
    Concat; with ``bias``, each member's Add of a constant (the group's bias)."""
    elem = F16 if dtype == np.float16 else TensorProto.FLOAT
    inits, nodes, outs = {}, [], []
    for i, n in enumerate(ns):
        inits[f"w{i}"] = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}" if bias else f"m{i}"], f"mm{i}"))
        if bias:
            inits[f"b{i}"] = RNG.standard_normal(n).astype(dtype)
            nodes.append(helper.make_node("Add", [f"p{i}", f"b{i}"], [f"m{i}"], f"add{i}"))
        outs.append(f"m{i}")
    if swiglu:
        nodes += [helper.make_node("Sigmoid", ["m0"], ["sig"], "sigmoid"),
                  helper.make_node("Mul", ["m0", "sig"], ["silu"], "mul_silu"),
                  helper.make_node("Mul", ["silu", "m1"], ["y"], "mul_up")]
    else:
        nodes.append(helper.make_node("Concat", outs, ["y"], "cat", axis=-1))
    width = ns[0] if swiglu else sum(ns)
    return make_model(nodes, [helper.make_tensor_value_info("x", elem, [1, m, k])],
                      [helper.make_tensor_value_info("y", elem, [1, m, width])], inits, opset=21)


def _group_step(program):
    (i, step), = [(i, s) for i, s in enumerate(program.steps) if s.op == "npu::MatMulGroup"]
    return i, step


CASES = [(1, 64, (40, 40), True, False), (5, 96, (33, 33), True, True), (17, 257, (16, 16), True, False),
         (2, 40, (64, 16, 16), False, False), (9, 128, (31, 17, 65), False, True), (129, 33, (32, 32), True, True)]


@pytest.mark.parametrize("m, k, ns, swiglu, bias", CASES)
def test_float16_group_kernel_and_bound_step_against_the_reference(m, k, ns, swiglu, bias):
    """The group's kernel runs float_matmul_packed on the float16 A; its bound step gives the kernel's bits (and
    the C++ loop's outputs the Python loop's); both within float16 rounding of the reference model's outputs."""
    model = group_model(m, k, ns, swiglu=swiglu, bias=bias)
    program = compiled(model)
    i, step = _group_step(program)
    x = with_specials((RNG.standard_normal((1, m, k)) / 2).astype(np.float16), RNG, values=(-0.0, 6e-8, 65504.0),
                      fraction=0.01)
    with native_calls() as calls:
        first = program(x)
    assert "float_matmul_packed" in calls, calls
    assert program._bindings[((1, m, k),)][i] is not None, "the float16 group bound no native step"
    again = program(x)
    assert program.native_step_counts[1] == 0
    assert all(g.dtype == np.float16 and g.tobytes() == f.tobytes() for g, f in zip(again, first))
    assert all(g.tobytes() == f.tobytes() for g, f in zip(python_loop(program, (x,)), first))
    p = step.prepared
    runtime.configure([p], "reference", 1)
    with np.errstate(over="ignore"):  # 65504 in A: products past float16's range round to inf, as the kernel's
        want = step.kernel.run(p, [x])
    g, w = first[0], want[0] if swiglu else np.concatenate(want, axis=-1)  # the program's output: the Concat's
    assert g.dtype == w.dtype == np.float16 and g.shape == w.shape
    np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_swiglu_session_runs_the_group_natively_as_the_cpu_ep(dtype):
    """A {gate, up} group with SwiGLU whose result leaves the partition: one bound native step (float32: its result
    written into ORT's buffer), the CPU EP's values within tolerance, on every call."""
    model = group_model(3, 128, (96, 96), swiglu=True, dtype=dtype)  # with Adds, ORT makes each MatMul a Gemm first
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::MatMulGroup"]
    for _ in range(3):
        x = (RNG.standard_normal((1, 3, 128)) / 2).astype(dtype)
        got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
        assert got.dtype == want.dtype == dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=4e-3, atol=4e-3)
    assert python_steps(sess) == []
    assert program.native_step_counts[0] >= 2


# --- float16 groups of MatMulNBits members (an fp16 int4 LLM's q/k/v projections) -----------------------------

def nbits_group_model(m, k, ns, *, block, level, bias, swiglu=False, dtype=np.float16):
    """MatMulNBits members on one input x (scales of x's dtype, zero points on every other member, a bias on each
    with ``bias``): {gate, up} with SwiGLU, or joined by a Concat as attention joins q/k/v."""
    from npu_ep.quantization import quantize_matmul_nbits

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inits = [], {}
    for i, n in enumerate(ns):
        q = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), block, i % 2 == 1)
        inits.update({f"B{i}": q.B, f"S{i}": q.scales.astype(dtype)})
        ins = ["x", f"B{i}", f"S{i}", "", "", ""]
        if q.zero_points is not None:
            inits[f"Z{i}"] = q.zero_points
            ins[3] = f"Z{i}"
        if bias:
            inits[f"bias{i}"] = RNG.standard_normal(n).astype(dtype)
            ins[5] = f"bias{i}"
        while ins[-1] == "":
            ins.pop()
        nodes.append(helper.make_node("MatMulNBits", ins, [f"p{i}"], f"nb{i}", domain="com.microsoft", K=k, N=n,
                                      bits=4, block_size=block, accuracy_level=level))
    if swiglu:
        nodes += [helper.make_node("Sigmoid", ["p0"], ["sig"], "sigmoid"),
                  helper.make_node("Mul", ["p0", "sig"], ["silu"], "mul_silu"),
                  helper.make_node("Mul", ["silu", "p1"], ["y"], "mul_up")]
    else:
        nodes.append(helper.make_node("Concat", [f"p{i}" for i in range(len(ns))], ["y"], "cat", axis=-1))
    return make_model(nodes, [helper.make_tensor_value_info("x", elem, [1, m, k])],
                      [helper.make_tensor_value_info("y", elem, [1, m, ns[0] if swiglu else sum(ns)])], inits,
                      opset=21, extra_opsets=[("com.microsoft", 1)])


NBITS_CASES = [(1, 64, (64, 16, 16), 32, 0, False), (7, 128, (96, 32, 32), 16, 4, True),
               (20, 256, (40, 24, 24), 64, 0, True), (3, 96, (32, 32), 32, 4, False)]


@pytest.mark.parametrize("m, k, ns, block, level, bias", NBITS_CASES)
def test_float16_nbits_group_kernel_and_bound_step(m, k, ns, block, level, bias):
    """The group's bound step (BoundNBits.half over the members' packed weights) gives the kernel's bits and the
    Python loop's; within float16 rounding of the reference model (its float32 product rounded once)."""
    model = nbits_group_model(m, k, ns, block=block, level=level, bias=bias)
    program = compiled(model)
    i, step = _group_step(program)
    x = with_specials((RNG.standard_normal((1, m, k)) / 2).astype(np.float16), RNG, values=(-0.0, 6e-8),
                      fraction=0.01)
    first = program(x)
    assert program._bindings[((1, m, k),)][i] is not None, "the float16 MatMulNBits group bound no native step"
    again = program(x)
    assert program.native_step_counts[1] == 0
    assert all(g.dtype == np.float16 and g.tobytes() == f.tobytes() for g, f in zip(again, first))
    assert all(g.tobytes() == f.tobytes() for g, f in zip(python_loop(program, (x,)), first))
    p = step.prepared
    runtime.configure([p], "reference", 1)
    want = np.concatenate(step.kernel.run(p, [x]), axis=-1)
    assert want.dtype == np.float16 and want.shape == first[0].shape
    want32 = want.astype(np.float32)
    np.testing.assert_allclose(first[0].astype(np.float32), want32, rtol=4e-3, atol=4e-3 * np.abs(want32).max())


@pytest.mark.parametrize("level", [0, 4])
def test_float16_nbits_group_session_runs_natively_as_the_cpu_ep(level):
    model = nbits_group_model(5, 128, (64, 32, 32), block=32, level=level, bias=True)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::MatMulGroup", "Concat"]
    x = (RNG.standard_normal((1, 5, 128)) / 2).astype(np.float16)
    want = cpu_run(model, {"x": x})[0].astype(np.float32)
    for _ in range(3):
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=4e-3,
                                   atol=(4 if level == 0 else 16) * 2.0 ** -10 * np.abs(want).max())
    assert python_steps(sess) == []


NBITS_SWIGLU_CASES = [(1, 64, 16, 32, 0), (2, 128, 17, 16, 4), (7, 96, 33, 32, 0), (16, 256, 32, 64, 0),
                      (20, 128, 31, 32, 4)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m, k, n, block, level", NBITS_SWIGLU_CASES)
def test_nbits_swiglu_group_kernel_and_bound_step(m, k, n, block, level, bias, dtype):
    """A {gate, up} MatMulNBits group with SwiGLU: its kernel and its bound step make one BoundNBits.swiglu call
    (the same bits, the Python loop's too); rows on both sides of the fp32 levels' BLAS panels (16), halves around
    the 16-lane SwiGLU vectors, levels 0 and 4; within the product's bound and SwiGLU's few roundings of the
    reference model (float16: within its rounding)."""
    model = nbits_group_model(m, k, (n, n), block=block, level=level, bias=bias, swiglu=True, dtype=dtype)
    program = compiled(model)
    i, step = _group_step(program)
    x = (RNG.standard_normal((1, m, k)) / 2).astype(dtype)
    first = program(x)
    assert program._bindings[((1, m, k),)][i] is not None, "the SwiGLU MatMulNBits group bound no native step"
    again = program(x)
    assert program.native_step_counts[1] == 0
    assert all(g.dtype == dtype and g.tobytes() == f.tobytes() for g, f in zip(again, first))
    assert all(g.tobytes() == f.tobytes() for g, f in zip(python_loop(program, (x,)), first))
    p = step.prepared
    runtime.configure([p], "reference", 1)
    (want,) = step.kernel.run(p, [x])
    assert want.dtype == dtype and want.shape == first[0].shape == (1, m, n)
    want32 = want.astype(np.float32)
    tol = 4e-3 if dtype == np.float16 else 2e-5
    np.testing.assert_allclose(first[0].astype(np.float32), want32, rtol=tol, atol=tol * np.abs(want32).max())


def test_bound_nbits_swiglu_float16_is_the_float32_call_rounded_once():
    """BoundNBits.swiglu on a float16 A: the float32 call on the widened A rounded once, bit for bit (float16
    specials in A), at one and two threads; swiglu_halves of the product gives both calls' bits; bad arguments
    name themselves."""
    from npu_ep.kernels.ops.matmul_nbits import _native_args, _native_tail

    for m, k, n, level in ((1, 64, 16, 0), (3, 128, 33, 4), (17, 96, 40, 0), (33, 64, 17, 4)):
        model = nbits_group_model(m, k, (n, n), block=32, level=level, bias=True, swiglu=True)
        _, step = _group_step(compiled(model))
        p = step.prepared
        a = with_specials(RNG.standard_normal((m, k)).astype(np.float16), RNG, values=HALF_SPECIALS, fraction=0.01)
        for threads in (1, 2):
            runtime.configure([p], "native", threads)
            bound = _kern().BoundNBits(*_native_args(p, p.consts["ep_bias"]), *_native_tail(p, m), None)
            got = bound.swiglu(a)
            with np.errstate(over="ignore"):
                want = bound.swiglu(a.astype(np.float32)).astype(np.float16)
            _half_bits_equal(got, want, f"M={m} K={k} n={n} level={level} threads={threads}")
            product = bound(a.astype(np.float32))  # the kernel's DMA-counted run: the product, then swiglu_halves
            assert _kern().swiglu_halves(product, True, threads).tobytes() == got.tobytes()
            assert _kern().swiglu_halves(product, False, threads).tobytes() == bound.swiglu(a.astype(np.float32)) \
                .tobytes()
    with pytest.raises(ValueError, match=r"swiglu takes a C-contiguous float32 or float16 x \[M, K=64\]"):
        bound.swiglu(np.zeros((2, 65), np.float32))
    with pytest.raises(ValueError, match=r"swiglu_halves: y must be float32 \[M, N\] with an even N"):
        _kern().swiglu_halves(np.zeros((2, 5), np.float32))


@pytest.mark.parametrize("level", [0, 4])
def test_float16_nbits_swiglu_session_runs_natively_as_the_cpu_ep(level):
    model = nbits_group_model(4, 128, (96, 96), block=32, level=level, bias=True, swiglu=True)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    assert [st.op for st in program.steps] == ["npu::MatMulGroup"]
    x = (RNG.standard_normal((1, 4, 128)) / 2).astype(np.float16)
    want = cpu_run(model, {"x": x})[0].astype(np.float32)
    for _ in range(3):
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=8e-3,
                                   atol=(4 if level == 0 else 16) * 2.0 ** -10 * np.abs(want).max())
    assert python_steps(sess) == []
