"""Element-wise kernels vs ORT CPU: arithmetic, comparisons, activations, Where, Cast.

Tolerances: float32 rtol=atol=1e-5, float16 2e-3 (one fp16 rounding of an fp32 result); integers and bools exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import check_against_ort, make_model, rand, run_npu, run_ort
from npu_ep.kernels.registry import kernel_for

BROADCASTS = [((2, 3, 17), (2, 3, 17)), ((4, 1, 33), (7, 1)), ((5,), (3, 1, 5)), ((), (2, 65)), ((1, 130), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("shapes", BROADCASTS)
def test_arithmetic_broadcasts_like_ort(op, dtype, shapes):
    a = rand(shapes[0], dtype, seed=1)
    b = rand(shapes[1], dtype, seed=2)
    if op == "Div":
        b = np.where(b == 0, 3, b).astype(dtype)  # integer division by zero is UB in ORT
    check_against_ort(op, [("a", a, False), ("b", b, False)], [("y", dtype)])


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_constant_operand_is_stashed_at_compile_time(op):
    a = rand((3, 8, 16), np.float32, seed=3)
    w = rand((16,), np.float32, seed=4)
    check_against_ort(op, [("a", a, False), ("w", w, True)], [("y", np.float32)])


def test_integer_div_truncates_toward_zero():
    a = np.array([-7, 7, -7, 7, -1, 0], np.int32)
    b = np.array([2, -2, -2, 2, 3, 5], np.int32)
    check_against_ort("Div", [("a", a, False), ("b", b, False)], [("y", np.int32)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pow_float_and_integer_exponents(dtype):
    a = rand((4, 9), dtype, seed=5, lo=0.1, hi=3.0)
    check_against_ort("Pow", [("a", a, False), ("b", rand((9,), dtype, seed=6, lo=-2, hi=2), False)], [("y", dtype)],
                      tol=(1e-5, 1e-5) if dtype == np.float32 else (3e-3, 3e-3))
    check_against_ort("Pow", [("a", a, False), ("e", np.array(3, np.int64), True)], [("y", dtype)],
                      tol=(1e-5, 1e-5) if dtype == np.float32 else (3e-3, 3e-3))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("exponent", [np.array(2.0, np.float32), np.array([2], np.int64),
                                      np.array([[2.0]], np.float32)])
def test_pow_by_constant_two_is_the_square_bit_for_bit(dtype, exponent):
    """A constant exponent 2 runs as x * x, as ORT's CPU kernel: equal to ORT bit for bit, specials included."""
    from _vector_ortref import make_model, run_npu, run_ort

    a = rand((3, 41), dtype, seed=8, lo=-300, hi=300)
    a.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 1e30 if dtype != np.float16 else 6e4, -1e-30]
    model = make_model("Pow", [("a", a, False), ("e", exponent.astype(exponent.dtype), True)], [("y", dtype)])
    with np.errstate(over="ignore"):  # 1e30 ** 2 is inf (a program call ignores IEEE flags the same way)
        (got,), prepared, _ = run_npu(model, {"a": a})
    assert prepared.attrs["square"]
    (want,) = run_ort(model, {"a": a})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons_give_bools(op, dtype):
    a = rand((3, 1, 7), dtype, seed=7, lo=-2, hi=2).round()
    b = rand((4, 7), dtype, seed=8, lo=-2, hi=2).round()
    check_against_ort(op, [("a", a.astype(dtype), False), ("b", b.astype(dtype), False)], [("y", np.bool_)])


UNARY_RANGES = {"Sqrt": (0.0, 9.0), "Reciprocal": (0.2, 5.0), "Exp": (-8.0, 8.0)}


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Erf", "Sigmoid", "Tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_unary_math(op, dtype):
    lo, hi = UNARY_RANGES.get(op, (-6.0, 6.0))
    x = rand((3, 5, 67), dtype, seed=9, lo=lo, hi=hi)
    check_against_ort(op, [("x", x, False)], [("y", dtype)])


def test_sigmoid_saturates_without_overflow():
    x = np.array([-1000.0, -90.0, -20.0, 0.0, 20.0, 90.0, 1000.0], np.float32)
    check_against_ort("Sigmoid", [("x", x, False)], [("y", np.float32)])


def test_sigmoid_float64_tails_and_specials():
    x = np.array([-745.0, -709.5, -100.0, -30.0, 0.0, 30.0, 745.0, -np.inf, np.inf], np.float64)
    check_against_ort("Sigmoid", [("x", x, False)], [("y", np.float64)])  # ORT: ~1e-3 relative in the far tail
    got, _, _ = run_npu(make_model("Sigmoid", [("x", x, False)], [("y", np.float64)]), {"x": x})
    assert got[0][4] == 0.5 and got[0][-1] == 1.0 and got[0][-2] < 1e-300


def test_sigmoid_float32_extremes_and_nan():
    x = np.array([-np.inf, -1e30, -88.5, -88.0, -87.0, np.nan, 88.5, np.inf], np.float32)
    with np.errstate(over="raise"):  # exp never overflows (numpy warns on overflow by default)
        (y,), _, _ = run_npu(make_model("Sigmoid", [("x", x, False)], [("y", np.float32)]), {"x": x})
    assert np.all(y[:4] < 1e-38) and y[4] > 0 and np.isnan(y[5]) and np.all(y[6:] == 1.0)


@pytest.mark.parametrize("op,dtype", [("Sigmoid", np.float32), ("Sigmoid", np.float16), ("Exp", np.float32),
                                      ("Neg", np.int64), ("Relu", np.float16), ("Cast", np.int64),
                                      ("Sign", np.float16), ("Sign", np.int32), ("Abs", np.int64)])
def test_unary_0d_input_gives_a_0d_array_also_on_a_second_call(op, dtype):
    x = np.array(1.5).astype(dtype)
    attrs = {"to": 1} if op == "Cast" else None
    out_dtype = np.float32 if op == "Cast" else dtype
    model = make_model(op, [("x", x, False)], [("y", out_dtype)], attrs)
    got, prepared, _ = run_npu(model, {"x": x})
    again = kernel_for("", op).run(prepared, [x])
    want = run_ort(model, {"x": x})[0]
    for g in (got[0], again[0]):
        assert type(g) is np.ndarray and g.shape == () and g.dtype == want.dtype
        np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=2e-3)


def test_binary_0d_inputs_give_a_0d_array():
    a, b = np.array(7, np.int64), np.array(3, np.int64)
    model = make_model("Sub", [("a", a, False), ("b", b, False)], [("y", np.int64)])
    _, prepared, _ = run_npu(model, {"a": a, "b": b})
    (y,) = kernel_for("", "Sub").run(prepared, [a, b])
    assert type(y) is np.ndarray and y.shape == () and y == 4


def test_erf_accuracy_near_zero_and_tails():
    x = np.concatenate([np.linspace(-1e-3, 1e-3, 101), np.linspace(-6, 6, 1001)]).astype(np.float32)
    check_against_ort("Erf", [("x", x, False)], [("y", np.float32)], tol=(1e-6, 2e-7))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_opset20(approximate, dtype):
    x = rand((2, 7, 96), dtype, seed=10, lo=-5, hi=5)
    check_against_ort("Gelu", [("x", x, False)], [("y", dtype)], {"approximate": approximate}, opset=20)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_com_microsoft_gelu(dtype):
    x = rand((2, 7, 96), dtype, seed=11, lo=-5, hi=5)
    check_against_ort("Gelu", [("x", x, False)], [("y", dtype)], domain="com.microsoft")


@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu_with_optional_bias(with_bias):
    x = rand((2, 5, 64), np.float32, seed=12, lo=-5, hi=5)
    inputs = [("x", x, False)] + ([("bias", rand((64,), np.float32, seed=13), True)] if with_bias else [])
    check_against_ort("FastGelu", inputs, [("y", np.float32)], domain="com.microsoft", tol=(1e-5, 2e-5))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_where_broadcasts_three_ways(dtype):
    c = rand((4, 1, 9), np.bool_, seed=14)
    check_against_ort("Where", [("c", c, False), ("a", rand((3, 9), dtype, seed=15), False),
                                ("b", rand((4, 3, 1), dtype, seed=16), False)], [("y", dtype)])


CASTS = [(np.float32, np.float16), (np.float16, np.float32), (np.float32, np.int32), (np.float32, np.int8),
         (np.int64, np.float32), (np.int32, np.int64), (np.int64, np.int32), (np.float32, np.bool_),
         (np.bool_, np.float32), (np.uint8, np.float16)]


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(src, dst):
    x = rand((6, 11), src, seed=17, lo=-100, hi=100) if src != np.uint8 else rand((6, 11), src, seed=17, lo=0, hi=20)
    if np.issubdtype(np.dtype(dst), np.integer) and np.issubdtype(np.dtype(src), np.floating):
        x = np.clip(x, -120, 120).astype(src)  # out-of-range float->int is UB in ORT
    if src == np.float32:
        x[0, :3] = [0.0, -0.0, 0.5]
    from onnx.helper import np_dtype_to_tensor_dtype
    check_against_ort("Cast", [("x", x, False)], [("y", dst)], {"to": np_dtype_to_tensor_dtype(np.dtype(dst))})


def test_cost_transcendentals_cost_more_and_scale_with_elements():
    from _vector_ortref import make_model, run_npu
    x = rand((64, 1024), np.float32)
    costs = {}
    for op in ("Relu", "Exp"):
        _, _, costs[op] = run_npu(make_model(op, [("x", x, False)], [("y", np.float32)]), {"x": x})
    assert costs["Exp"].compute_cycles > costs["Relu"].compute_cycles > 0
    assert costs["Relu"].dma_bytes == 2 * x.nbytes


# --- ops of vision/speech models (issue 13): math, rounding, logic, variadic; also through NpuEP sessions ------
from _ep_single import check_on_ep

MATH_RANGES = {"Log": (0.01, 50.0), "Sin": (-20.0, 20.0), "Cos": (-20.0, 20.0)}


@pytest.mark.parametrize("op", ["Sin", "Cos", "Log", "Floor", "Ceil", "Round"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_math_and_rounding_on_both_targets(op, dtype):
    lo, hi = MATH_RANGES.get(op, (-6.0, 6.0))
    x = rand((3, 5, 41), dtype, seed=20, lo=lo, hi=hi)
    if op in ("Floor", "Ceil", "Round"):
        x.reshape(-1)[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -0.0, 3.0]  # Round: half to even
    check_on_ep(op, [("x", x, False)], [("y", dtype)], targets=("npu-ref", "npu-edge"))


def test_log_of_zero_and_negative_without_warnings():
    x = np.array([0.0, -1.0, 1.0, np.inf], np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        check_on_ep("Log", [("x", x, False)], [("y", np.float32)])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_binary_broadcasts(op):
    check_on_ep(op, [("a", rand((4, 1, 9), np.bool_, seed=21), False), ("b", rand((3, 9), np.bool_, seed=22), False)],
                [("y", np.bool_)], targets=("npu-ref", "npu-edge"))


def test_not_and_isnan():
    check_on_ep("Not", [("a", rand((5, 7), np.bool_, seed=23), False)], [("y", np.bool_)])
    x = np.array([[np.nan, 0.0, np.inf, -np.inf, 1.0]], np.float16)
    check_on_ep("IsNaN", [("x", x, False)], [("y", np.bool_)], targets=("npu-ref", "npu-edge"))


@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_variadic_broadcasts(op, n, dtype):
    shapes = [(2, 1, 7), (3, 1), (7,)][:n]
    inputs = [(f"x{i}", rand(s, dtype, seed=30 + i), i == 2) for i, s in enumerate(shapes)]
    check_on_ep(op, inputs, [("y", dtype)], targets=("npu-ref", "npu-edge"))


@pytest.mark.parametrize("op", ["Min", "Max"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_min_max_integers(op, dtype):
    check_on_ep(op, [("a", rand((4, 9), dtype, seed=24, lo=0, hi=9), False),
                     ("b", rand((9,), dtype, seed=25, lo=0, hi=9), False)], [("y", dtype)])


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_min_max_nan_propagates_like_ort(op):
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 1.0, np.nan], np.float32)
    check_on_ep(op, [("a", a, False), ("b", b, False)], [("y", np.float32)])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("const_divisor", [False, True])
def test_integer_div_by_zero_fails_the_run_as_ort(dtype, const_divisor):
    """ORT's CPU Div fails the run with "Integer division by zero"; NpuEP ran the node (graph assignment) and fails
    the same run naming the node, where numpy alone would give 0 (issue 38 item 4); Mod likewise (below)."""
    from npu_testing import assignment, npu_session

    a = np.array([5, -7, 8], dtype)
    b = np.array([2, 0, 3], dtype)
    model = make_model("Div", [("a", a, False), ("b", b, const_divisor)], [("y", dtype)])
    feeds = {"a": a} if const_divisor else {"a": a, "b": b}
    with pytest.raises(Exception, match="Integer division by zero"):
        run_ort(model, feeds)
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    with pytest.raises(Exception, match=r"Div_0.*Integer division by zero"):
        sess.run(None, feeds)
    if not const_divisor:  # the same session divides by non-zero divisors again, as ORT's
        ok = {"a": a, "b": np.array([2, -3, 3], dtype)}
        np.testing.assert_array_equal(sess.run(None, ok)[0], run_ort(model, ok)[0])


@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_abs_neg_sign_bit_exact_on_both_targets(op, dtype):
    """Integer shape math (T5's relative positions) on NpuEP, bit-exact with ORT: INT_MIN wraps under Abs and Neg
    as ORT's C++ does (issue 38 item 28)."""
    info = np.iinfo(dtype)
    x = np.concatenate([np.array([info.min, info.min + 1, -1, 0, 1, info.max], dtype), rand((3, 7), dtype).ravel()])
    check_on_ep(op, [("x", x.reshape(3, 9), False)], [("y", dtype)], targets=("npu-ref", "npu-edge"))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_mod_bit_exact_with_both_signs(fmod, dtype):
    """Mod of integers (exported attention's head split is int64 Mod): fmod=0 takes the divisor's sign, fmod=1 the
    dividend's, bit-exact with ORT on both targets, NpuEP proven to run it (it was declined: split graphs)."""
    a = np.array([[7, -7, 7, -7, 0, 5], [13, -13, 1, -1, 9, -9]], dtype)
    b = np.array([[3, 3, -3, -3, 4, 5], [-4, -4, 7, 7, -3, 3]], dtype)
    check_on_ep("Mod", [("a", a, False), ("b", b, False)], [("y", dtype)], {"fmod": fmod},
                targets=("npu-ref", "npu-edge"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_mod_is_fmod_with_specials_as_ort(dtype):
    a = np.array([[5.5, -5.5, 0.0, -0.0, np.inf, np.nan], [1e-3, 3.0, 7.0, -7.0, 2.5, 1.0]], dtype)
    b = np.array([[2.0, 2.0, 3.0, 3.0, 2.0, 1.0], [1.0, np.inf, 0.0, 2.0, -2.0, np.nan]], dtype)
    check_on_ep("Mod", [("a", a, False), ("b", b, False)], [("y", dtype)], {"fmod": 1})


def test_mod_of_floats_without_fmod_is_declined_and_integer_mod_by_zero_fails_as_ort():
    from _ep_single import declined_by
    from npu_testing import assignment, npu_session

    f = np.ones((2, 3), np.float32)
    assert "fmod=1" in declined_by("Mod", [("a", f, False), ("b", f, False)], [("y", np.float32)], target="npu-ref")
    a, b = np.array([5, -7, 8], np.int64), np.array([2, 0, 3], np.int64)
    model = make_model("Mod", [("a", a, False), ("b", b, False)], [("y", np.int64)])
    with pytest.raises(Exception, match="Integer modulo by zero"):
        run_ort(model, {"a": a, "b": b})
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    with pytest.raises(Exception, match="Integer modulo by zero"):
        sess.run(None, {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_sign_of_specials_as_ort(dtype):
    """-0.0 gives +0.0; NaN stays NaN in float32 and gives 0 in float16, as ORT's two kernels do."""
    x = np.array([[np.nan, -np.nan, -0.0, 0.0], [-np.inf, np.inf, -1e-7, 3.0]], dtype)
    (want,) = check_on_ep("Sign", [("x", x, False)], [("y", dtype)])
    from npu_testing import npu_session

    got = npu_session(make_model("Sign", [("x", x, False)], [("y", dtype)]), {"target": "npu-ref"}).run(None, {"x": x})
    np.testing.assert_array_equal(np.signbit(got[0]), np.signbit(want))


def _t5_relative_position_buckets():
    """T5's bidirectional relative-position bucket (exported): int64 Sub/Abs/Less/Min/Where around a float Log,
    then the bias table's Gather; Neg/Sign re-derive the bucket to cover those ops too."""
    from onnx import TensorProto, helper

    from npu_testing import make_model as graph

    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    n = helper.make_node
    nodes = [n("Unsqueeze", ["pos", "ax1"], ["ctx"], name="ctx"), n("Unsqueeze", ["pos", "ax0"], ["mem"], name="mem"),
             n("Sub", ["mem", "ctx"], ["rel"], name="rel"), n("Greater", ["rel", "zero"], ["after"], name="after"),
             n("Cast", ["after"], ["after_i"], to=i64, name="after_i"),
             n("Mul", ["after_i", "half"], ["side"], name="side"), n("Abs", ["rel"], ["dist"], name="abs"),
             n("Less", ["dist", "exact"], ["small"], name="small"),
             n("Cast", ["dist"], ["dist_f"], to=f32, name="dist_f"),
             n("Div", ["dist_f", "exact_f"], ["ratio"], name="ratio"), n("Log", ["ratio"], ["log"], name="log"),
             n("Div", ["log", "log_span"], ["frac"], name="frac"), n("Mul", ["frac", "n_large"], ["far"], name="far"),
             n("Cast", ["far"], ["far_i"], to=i64, name="far_i"), n("Add", ["far_i", "exact"], ["large"], name="large"),
             n("Min", ["large", "last"], ["capped"], name="min"),
             n("Where", ["small", "dist", "capped"], ["bucket0"], name="where"),
             n("Add", ["bucket0", "side"], ["bucket1"], name="bucket"), n("Neg", ["bucket1"], ["neg"], name="neg"),
             n("Sign", ["neg"], ["sign"], name="sign"), n("Mul", ["sign", "neg"], ["bucket"], name="unsign"),
             n("Gather", ["table", "bucket"], ["bias"], axis=0, name="gather"),
             n("Transpose", ["bias"], ["y"], perm=[2, 0, 1], name="heads_first")]
    consts = {"ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64), "zero": np.array(0, np.int64),
              "half": np.array(16, np.int64), "exact": np.array(8, np.int64), "exact_f": np.array(8, np.float32),
              "log_span": np.array(np.log(128 / 8), np.float32), "n_large": np.array(8, np.float32),
              "last": np.array(15, np.int64), "table": rand((32, 4), np.float32, seed=5)}
    return graph(nodes, [helper.make_tensor_value_info("pos", i64, ["S"])],
                 [helper.make_tensor_value_info("y", f32, [4, "S", "S"])], consts)


def test_t5_relative_position_buckets_run_in_one_partition():
    """Abs/Neg/Sign on int64 were declined and split this into 3 partitions around CPU nodes (issue 38 item 28)."""
    from npu_testing import assignment, cpu_run, npu_partitions, npu_session

    model = _t5_relative_position_buckets()
    sess = npu_session(model, {"target": "npu-ref"})
    assert set(assignment(sess).values()) == {"NpuEP"}
    assert len(npu_partitions(sess)) == 1
    for s in (40, 7):
        feeds = {"pos": np.arange(s, dtype=np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
