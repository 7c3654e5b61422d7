"""Data movement as bound steps: the native Expand copy (``kernels.expand``; Concat's ``concat_into`` is swept in
test_sweep_indexing.py) equals the reference kernel bit for bit over dtypes, broadcasts, tails and layouts; Expand,
Slice, Reshape, Transpose, Concat, Pow and float Div bind for the (shape-derived) operand values they saw and
decline others; and an exporter-style decoder's decode step runs them natively inside a session whose results
match the CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep import _native as extension
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels import runtime
from tests.kernels.test_bound_native_calls import assert_same, compiled, one_step_loop, prepared
from tests.npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(5)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
NAT = runtime.native_module()


def values(shape, dtype):
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    return (RNG.standard_normal(shape) * 50).astype(dtype)


# --- the native copies against the reference kernels ------------------------------------------------------------

EXPANDS = [((1, 2, 1, 7, 5), (1, 2, 4, 7, 5)),  # a decoder's repeat_kv
           ((3, 1), (3, 6)),  # the last axis broadcast: one element runs
           ((1,), (2, 3, 4)),  # a scalar-like value to a new rank
           ((4, 1, 3), (2, 1, 5, 1)),  # bidirectional: the target's 1s keep x's dims
           ((2, 3), (2, 3)),  # nothing to broadcast
           ((2, 3), (1,)),  # a shorter target
           ((1, 0, 3), (4, 0, 3)),  # empty
           ((), (3, 2)),  # 0-d input
           ((5, 1, 1, 9), (5, 3, 2, 9))]  # two broadcast axes in a row


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("x_shape, shape", EXPANDS)
def test_native_expand_equals_the_reference(x_shape, shape, dtype):
    x = values(x_shape, dtype)
    want = np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, shape)))  # the reference kernel's formula
    got = NAT.expand(x, shape)
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


def test_native_expand_reads_a_strided_input_and_names_a_bad_shape():
    x = values((6, 8), np.float32)[:, ::2].T[:, None, :]  # [4, 1, 6], not contiguous
    np.testing.assert_array_equal(NAT.expand(x, (4, 3, 6)), np.broadcast_to(x, (4, 3, 6)))
    with pytest.raises(ValueError, match=r"input shape \[4, 1, 6\] does not broadcast to \[4, 3, 5\]"):
        NAT.expand(x, (4, 3, 5))


# --- the bound steps -----------------------------------------------------------------------------------------

def one_node(op, ins, outs, inits=None, **attrs):
    model = make_model([helper.make_node(op, [i.name for i in ins] + list(inits or {}), [o.name for o in outs],
                                         name="op", **attrs)], ins, outs, inits)
    return prepared(model, op)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_expand_with_a_runtime_shape_binds_for_that_shape_and_declines_another():
    kernel, p = one_node("Expand", [vi("x", F32, [2, 1, 3]), vi("s", I64, [3])], [vi("y", F32, [None, None, None])])
    x, s = values((2, 1, 3), np.float32), np.array([2, 4, 3], np.int64)
    outs, step, loop = one_step_loop(kernel, p, [x, s])
    assert isinstance(step, extension.CallStep)
    assert_same(loop((x, s)), outs)
    other = np.array([2, 5, 3], np.int64)
    assert_same(loop((x, other)), kernel.run(p, [x, other]))  # declined: the kernel ran
    assert loop.native_counts == (1, 1)
    big = np.zeros(9, np.int64)  # a runtime operand larger than a shape: not bound
    assert kernel.bind(p, [x, big], outs) is None


def test_slice_with_runtime_bounds_binds_a_step_for_those_bounds():
    """A strided input's slice is no C-order view: the step copies it natively (kernels.slice_copy), in C order, as
    the kernel does; a C-order view stays a view."""
    kernel, p = one_node("Slice", [vi("x", F32, [4, 6]), vi("st", I64, [1]), vi("en", I64, [1])],
                         [vi("y", F32, [None, None, None])], {"ax": np.array([1], np.int64)})
    x = values((4, 6), np.float32).T.copy().T  # a strided input
    st, en = np.array([1], np.int64), np.array([-1], np.int64)
    outs, step, loop = one_step_loop(kernel, p, [x, st, en, None])
    assert isinstance(step, extension.CallStep)
    got = loop((x, st, en, None))
    assert_same(got, outs)
    assert got[0].flags.c_contiguous and not np.shares_memory(got[0], x)
    row = values((1, 6), np.float32)
    _, _, row_loop = one_step_loop(kernel, p, [row, st, en, None])
    assert np.shares_memory(row_loop((row, st, en, None))[0], row)
    assert_same(loop((x, st, np.array([3], np.int64), None)), kernel.run(p, [x, st, np.array([3]), None]))
    assert loop.native_counts == (1, 1)


def test_transpose_binds_the_native_copy_in_any_layout():
    """A strided input is bound too (the kernel copies it first); the output is C order, as ORT's buffer."""
    kernel, p = one_node("Transpose", [vi("x", F32, [2, 3, 4])], [vi("y", F32, [4, 2, 3])], perm=[2, 0, 1])
    x = values((3, 2, 4), np.float32).transpose(1, 0, 2)
    outs, _step, loop = one_step_loop(kernel, p, [x])
    got = loop((x,))
    assert_same(got, outs)
    assert got[0].flags.c_contiguous and loop.native_counts == (1, 0)


def test_concat_binds_one_copy_with_its_constant_in_place():
    kernel, p = one_node("Concat", [vi("a", F32, [2, 3]), vi("b", F32, [2, 3])], [vi("y", F32, [2, 8])],
                         {"c": values((2, 2), np.float32)}, axis=1)
    a, b = values((2, 3), np.float32), values((3, 2), np.float32).T
    outs, _step, loop = one_step_loop(kernel, p, [a, b, None])
    assert_same(loop((a, b, None)), outs)
    assert loop((a, b.copy(), None))[0].shape == (2, 8) and loop.native_counts == (2, 0)


@pytest.mark.parametrize("square", [True, False])
def test_pow_binds_its_ufunc_and_equals_the_kernel(square):
    inits = {"e": np.array(2.0 if square else 0.7, np.float32)}
    kernel, p = one_node("Pow", [vi("x", F32, [3, 5])], [vi("y", F32, [3, 5])], inits)
    x = np.abs(values((3, 5), np.float32))
    x[0, :3] = [np.inf, 0.0, np.nan]
    with np.errstate(all="ignore"):
        outs, step, loop = one_step_loop(kernel, p, [x, None])
        assert isinstance(step, extension.CallStep)
        assert_same(loop((x, None)), outs)
        half = x.astype(np.float16)  # computed in float32: not bound
        assert kernel.bind(p, [half, None], kernel.run(p, [half, None])) is None


def test_float_div_binds_np_divide_and_integer_div_binds_the_truncating_kernel():
    kernel, p = one_node("Div", [vi("x", F32, [4, 5]), vi("d", F32, [4, 1])], [vi("y", F32, [4, 5])])
    x, d = values((4, 5), np.float32), values((4, 1), np.float32)
    d[0] = 0.0
    with np.errstate(all="ignore"):
        outs, _step, loop = one_step_loop(kernel, p, [x, d])
        assert_same(loop((x, d)), outs)
    kernel, p = one_node("Div", [vi("x", I64, [4])], [vi("y", I64, [4])], {"d": np.array(-3, np.int64)})
    xi = np.array([7, -7, 6, -6], np.int64)
    outs, _step, loop = one_step_loop(kernel, p, [xi, None])  # truncating division: div_int, not numpy's floor
    assert_same(loop((xi,)), outs)
    np.testing.assert_array_equal(outs[0], np.array([-2, 2, -2, 2], np.int64))


def test_reshape_with_a_shape_derived_target_binds_a_view_for_that_target():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Slice", ["s", "zero", "two"], ["lead"], name="lead"),
             helper.make_node("Concat", ["lead", "minus1"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    model = make_model(nodes, [vi("x", F32, ["a", "b", 4, 2])], [vi("y", F32, [None, None, None])],
                       {"zero": np.array([0], np.int64), "two": np.array([2], np.int64),
                        "minus1": np.array([-1], np.int64)})
    program = compiled(model)
    for shape in ((2, 3, 4, 2), (2, 3, 4, 2), (5, 1, 4, 2), (2, 3, 4, 2)):
        x = values(shape, np.float32)
        (y,) = program(x)
        np.testing.assert_array_equal(y, cpu_run(model, {"x": x})[0])
    natives = program._bindings[((2, 3, 4, 2),)]
    kinds = {st.op: type(n).__name__ for st, n in zip(program.steps, natives)}
    # shape plumbing stays memoized: Shape reads the dims, Concat's memo comes first (then its kernel's step)
    assert kinds == {"Shape": "ShapeStep", "Slice": "FirstOfSteps", "Concat": "FirstOfSteps", "Reshape": "ViewStep"}


# --- an exporter-style decoder in a session --------------------------------------------------------------------

def test_an_exported_decoders_decode_step_runs_its_data_movement_natively(tmp_path):
    """The tiny Llama as torch exports it (no rewrite: repeat_kv Expand, rotate_half Slice/Neg/Concat, the KV
    Concat, the Q/K/V Transposes): a decode step's movement and element-wise steps are bound, the session matches
    the CPU EP, and NpuEP ran every node."""
    from npu_ep.models.tiny_llama import build_tiny_llama
    from npu_ep.tools.generation import Generator

    model = build_tiny_llama(tmp_path / "tiny.onnx")
    so = session_options()
    tag_session_options(so)
    sess = npu_session(str(model), cpu=False, so=so)
    gen = Generator(sess, max_kv_len=64)
    ref = Generator(str(model), providers=["CPUExecutionProvider"], max_kv_len=64)
    got, want = gen.generate([1, 5, 9, 2], 6), ref.generate([1, 5, 9, 2], 6)
    assert got.tokens == want.tokens
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=2e-5 * float(np.abs(want.logits).max()))
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    decode = next(natives for sig, natives in program._bindings.items() if sig[0] == (1, 1))
    unbound = [st.op for st, n in zip(program.steps, decode) if n is None]
    for op in ("Expand", "Concat", "Slice", "Transpose", "Neg", "Pow", "Div"):
        assert op not in unbound, f"{op} runs its Python kernel in the decode step"
    runs, declines = program.native_step_counts
    assert runs > 0 and declines == 0
