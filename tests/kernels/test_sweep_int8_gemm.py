"""Differential sweep of the native int8 GEMM (kernels/native/int8_gemm.cc), issue 38: the exact int32 sums
against int64 numpy math, the requantized bytes against the reference model's ``requantize``, and MatMulInteger /
QLinearMatMul / MatMulIntegerToFloat native against their reference kernels, all bit-exact (integer math; the
float epilogues are the same float32 operations: MatMulIntegerToFloat's int8_matmul_float multiplies and adds in
the reference's order, special scales included), on every instruction-set level the host runs.

int8_gemm.cc's blocks: B packed in blocks of 16 columns x 4 k (K padded to kp, a multiple of 64; A's rows copied
when K is not one), tasks of 32 columns (two blocks, the second one masked or absent); VNNI: tiles of 8 rows, the
last one of 4, 2 or 1 rows (a short tile repeats its last row); AVX2: one row x 16 columns; AMX: 16-row tiles in
pairs. The grids cross each: M = 1..9 and 15..17, N around 16 / 32 / 48, K around 4 / 64 / 128."""

from __future__ import annotations

import numpy as np
import pytest

from _single_op import model as single_node_model, run_ort
from _sweep import around, check
from npu_ep.kernels import runtime
from npu_ep.kernels.ops._matrix import requantize
from npu_ep.kernels.ops.matmul_int import pack_b
from npu_testing import assignment, cpu_run, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3838)
ROWS = list(range(1, 10)) + [15, 16, 17]  # the 8-row tile, the 4 / 2 / 1-row tails, one and two 16-row AMX tiles
COLS = around(16, 32, 48)                 # one / two packed blocks per 32-column task, a masked second block
DEPTHS = around(4, 64, 128)               # k-quads, kp = 64 padding (A copied), A read in place (K = 64, 128)
INT_TYPES = [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8), (np.int8, np.int8)]


def _codes(shape, dt) -> np.ndarray:
    """Random codes with the type's extremes in every row and column (the sums' largest magnitudes)."""
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
    if x.ndim == 2:
        x[::3, ::2] = info.min
        x[1::3, 1::2] = info.max
    return x


def _native_int8(a, azp, b, bzp, threads=1, **requant):
    pk = pack_b(b, bzp)
    return runtime.native_module().int8_matmul(a, np.asarray(azp, np.int32).reshape(-1), pk["i8_bp"], pk["i8_bsum"],
                                               pk["i8_bzp"], b.shape[0], b.shape[1], threads, **requant)


def _exact(a, azp, b, bzp) -> np.ndarray:
    za = np.asarray(azp, np.int64).reshape(-1, 1) if np.size(azp) > 1 else np.int64(azp)
    return ((a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(bzp, np.int64))).astype(np.int32)


def _check_acc(m, k, n, dta, dtb, per_col=True, threads=1, azp=None):
    a, b = _codes((m, k), dta), _codes((k, n), dtb)
    azp = _codes((), dta) if azp is None else azp
    bzp = _codes((n,), dtb) if per_col else _codes((), dtb)
    got = _native_int8(a, azp, b, bzp, threads)
    np.testing.assert_array_equal(got, _exact(a, azp, b, bzp), err_msg=f"M={m} K={k} N={n} {dta}x{dtb}")


@pytest.mark.parametrize("dta,dtb", INT_TYPES)
def test_accumulator_rows_by_columns(isa, dta, dtb):
    for m in ROWS:
        for n in COLS:
            _check_acc(m, 65, n, dta, dtb)


@pytest.mark.parametrize("dta,dtb", INT_TYPES[:2])
def test_accumulator_depths(isa, dta, dtb):
    for k in DEPTHS:
        for m, n in ((1, 17), (3, 33), (5, 16), (9, 49)):
            _check_acc(m, k, n, dta, dtb, per_col=k % 2 == 0)


def test_accumulator_per_row_zero_points_and_threads(isa):
    for dta, dtb in INT_TYPES[:2]:
        for m in (1, 2, 5, 8, 9, 17):
            info = np.iinfo(dta)
            azp = RNG.integers(info.min, info.max + 1, m).astype(np.int32)
            for n in (31, 33, 65):
                _check_acc(m, 130, n, dta, dtb, azp=azp, threads=2)


def test_accumulator_extremes(isa):
    """All-extreme codes: |sum| up to K * 255 * 255 with zero points at the other end of the range."""
    for m, k, n in ((1, 4096, 17), (5, 1000, 33), (9, 257, 16)):
        a = np.full((m, k), 255, np.uint8)
        b = np.full((k, n), -128, np.int8)
        np.testing.assert_array_equal(_native_int8(a, 0, b, np.int8(127)), _exact(a, 0, b, 127))
        a8 = np.full((m, k), -128, np.int8)
        np.testing.assert_array_equal(_native_int8(a8, 127, b, np.int8(127)), _exact(a8, 127, b, 127))


def test_int32_sums_wrap_as_ort(isa):
    """K * 255 * 255 past 2^31: the int32 sums wrap (two's complement), as ORT's and the reference's int32 adds."""
    k = 40000
    a = np.full((3, k), 255, np.uint8)
    a[1] = 0
    b = np.full((k, 17), 127, np.int8)
    b[:, 1] = -128
    inputs = [("a", a, False), ("b", b, True), ("az", np.array(0, np.uint8), True),
              ("bz", np.array(-128, np.int8), True)]
    got = check("MatMulInteger", inputs, "int8_matmul", exact=True)[0]
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ (b.astype(np.int64) + 128)).astype(np.int32))
    np.testing.assert_array_equal(got, run_ort(single_node_model("MatMulInteger", inputs), inputs)[0])


@pytest.mark.parametrize("y_signed", [False, True])
def test_requantized_rows_by_columns(isa, y_signed):
    """MLAS requantization: saturation at both ends (large multipliers), ties to even (multiplier 0.5 on odd sums)."""
    yzp = -5 if y_signed else 130
    qtype = "int8" if y_signed else "uint8"
    for m in ROWS:
        for n in (15, 16, 17, 33, 47):
            a, b = _codes((m, 66), np.uint8), _codes((66, n), np.int8)
            acc = _exact(a, 128, b, 0)
            for mult in (np.float32([0.5]), RNG.uniform(1e-5, 1e-3, n).astype(np.float32), np.float32([3.0])):
                y = _native_int8(a, 128, b, np.int8(0), multiplier=mult, y_zero_point=yzp, y_signed=y_signed)
                want = requantize(acc, mult if mult.size > 1 else mult[0], np.float32(yzp), qtype)
                np.testing.assert_array_equal(y, want, err_msg=f"M={m} N={n} mult={mult[:2]}")


def _qlinear_inputs(m, k, n, dta=np.uint8):
    return [("a", _codes((m, k), dta), False), ("as", np.array(0.02, np.float32), True),
            ("az", np.array(3, dta), True), ("b", _codes((k, n), np.int8), True),
            ("bs", RNG.uniform(0.001, 0.02, n).astype(np.float32), True), ("bz", np.zeros(n, np.int8), True),
            ("ys", np.array(0.5, np.float32), True), ("yz", np.array(120, dta), True)]


def test_qlinear_matmul_op(isa):
    for m in (1, 2, 3, 4, 5, 8, 9, 17):
        for n in (16, 17, 33):
            for dta in (np.uint8, np.int8):
                check("QLinearMatMul", _qlinear_inputs(m, 70, n, dta), "int8_matmul", exact=True)


def test_matmul_integer_op_batched(isa):
    for m in (1, 3, 8, 9):
        for n in (15, 32, 49):
            a = _codes((2, m, 64), np.int8)
            inputs = [("a", a, False), ("b", _codes((64, n), np.uint8), True), ("az", np.array(-7, np.int8), True),
                      ("bz", _codes((n,), np.uint8), True)]
            check("MatMulInteger", inputs, "int8_matmul", exact=True)


def test_matmul_integer_runtime_zero_point_is_a_step_input(isa):
    """A's zero point at run time (DynamicQuantizeLinear's): the bound int8_matmul step takes it per call (its
    bytes checked against the kernel's by _sweep, and it must bind)."""
    from _sweep import kernel_and_bound_step
    for dta in (np.uint8, np.int8):
        for m, n in ((1, 16), (9, 33)):
            inputs = [("a", _codes((m, 70), dta), False), ("b", _codes((70, n), np.int8), True),
                      ("az", np.array(-3 if dta == np.int8 else 131, dta), False), ("bz", np.array(0, np.int8), True)]
            check("MatMulInteger", inputs, "int8_matmul", exact=True)
            got, bound = kernel_and_bound_step("MatMulInteger", inputs)
            assert len(bound) == 1 and bound[0].tobytes() == got[0].tobytes(), "no bound step for a runtime zero point"


def test_dynamic_quantized_matmul_integer_session_runs_natively():
    """DynamicQuantizeLinear -> MatMulInteger (runtime a_zero_point), as ORT's dynamic quantizer writes a Gemm
    (crnn-int8's classifier): on NpuEP with the CPU EP's exact sums and no Python step."""
    from onnx import TensorProto, helper
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import make_model, session_options
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "b", "xz", "bz"], ["y"], name="mmi")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, 96])],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, [20, 40])],
                       {"b": _codes((96, 40), np.int8), "bz": np.array(0, np.int8)})
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for seed in range(3):
        x = {"x": (np.random.default_rng(seed).standard_normal((20, 96)) + seed).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, x)[0], cpu_run(model, x)[0])
    assert python_steps(sess) == [], "MatMulInteger ran its Python kernel instead of the bound native step"


def test_matmul_integer_to_float_op(isa):
    for m in (1, 2, 7, 16):
        for n in (16, 31, 33):
            inputs = [("a", _codes((m, 65), np.uint8), False), ("b", _codes((65, n), np.int8), True),
                      ("as", np.array(0.03, np.float32), True), ("bs", RNG.uniform(0.01, 0.1, n).astype(np.float32),
                                                                    True),
                      ("az", np.array(129, np.uint8), True), ("bz", np.zeros(n, np.int8), True),
                      ("bias", RNG.standard_normal(n).astype(np.float32), True)]
            check("MatMulIntegerToFloat", inputs, "int8_matmul_float", exact=True, domain="com.microsoft")


def _to_float_inputs(a, n, *, a_scale=0.03, runtime_a=False, per_col=True, bias=True, dtb=np.int8):
    """MatMulIntegerToFloat's inputs over A: B [K, n]; a_scale and a_zero_point constants, or runtime values as
    DynamicQuantizeLinear gives them (``runtime_a``)."""
    k = a.shape[-1]
    bs = RNG.uniform(0.01, 0.1, n).astype(np.float32) if per_col else np.array(0.07, np.float32)
    return [("a", a, False), ("b", _codes((k, n), dtb), True), ("as", np.array(a_scale, np.float32), not runtime_a),
            ("bs", bs, True), ("az", np.array(3, a.dtype), not runtime_a), ("bz", _codes((n,), dtb), True),
            ("bias", RNG.standard_normal(n).astype(np.float32) if bias else None, True)]


@pytest.mark.parametrize("dta,dtb", INT_TYPES)
def test_matmul_integer_to_float_runtime_scale_and_zero_point(isa, dta, dtb):
    """A runtime a_scale / a_zero_point (ORT's dynamic quantization), per-tensor and per-column b_scale, with and
    without the bias, a batched A: int8_matmul_float's float32 multiply and add are the reference's, bit for bit;
    the bound step (checked by _sweep) takes the runtime values per call."""
    for m, n, k in ((1, 16, 64), (5, 33, 70), (9, 17, 4), (16, 48, 129)):
        for runtime_a, per_col, bias in ((True, True, True), (True, False, False), (False, False, True)):
            a = _codes((2, m, k) if m == 5 else (m, k), dta)
            check("MatMulIntegerToFloat", _to_float_inputs(a, n, runtime_a=runtime_a, per_col=per_col, bias=bias,
                                                           dtb=dtb),
                  "int8_matmul_float", exact=True, domain="com.microsoft", what=f"M={m} N={n} K={k} {runtime_a}")


@pytest.mark.parametrize("a_scale", [np.inf, -0.5, 1e-45, 3e38])
def test_matmul_integer_to_float_special_scales(isa, a_scale):
    """An infinite scale (inf * 0 = NaN, +-inf), a negative one (-0.0 for zero sums), a subnormal and an
    overflowing one: IEEE float32 operations, so NaN, infinities and signed zeros are the reference's."""
    a = _codes((9, 66), np.uint8)
    a[0] = 3  # a row of zero-point codes: zero sums
    with np.errstate(all="ignore"):
        check("MatMulIntegerToFloat", _to_float_inputs(a, 33, a_scale=a_scale), "int8_matmul_float", exact=True,
              domain="com.microsoft")


def test_matmul_integer_to_float_empty_inner_dimension(isa):
    a = np.zeros((3, 0), np.uint8)
    got = check("MatMulIntegerToFloat", _to_float_inputs(a, 17), "int8_matmul_float", exact=True,
                domain="com.microsoft")[0]
    assert got.shape == (3, 17)


def _dynamic_matmul_model(m: int, k: int, n: int, relu: bool):
    """DynamicQuantizeLinear -> MatMulIntegerToFloat (runtime a_scale / a_zero_point) [-> Add bias -> Relu: the
    epilogue fusion's bias and ReLU], as ORT's dynamic quantizer writes a MatMul."""
    from onnx import TensorProto, helper
    from npu_testing import make_model
    inits = {"b": _codes((k, n), np.int8), "bs": RNG.uniform(0.01, 0.1, n).astype(np.float32),
             "bz": np.zeros(n, np.int8), "bias": RNG.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulIntegerToFloat", ["xq", "b", "xs", "bs", "xz", "bz"], ["mm"], name="mm",
                              domain="com.microsoft")]
    out = "mm"
    if relu:
        nodes += [helper.make_node("Add", ["mm", "bias"], ["added"], name="add"),
                  helper.make_node("Relu", ["added"], ["y"], name="relu")]
        out = "y"
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                      [helper.make_tensor_value_info(out, TensorProto.FLOAT, [m, n])], inits,
                      extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("relu", [False, True])
def test_matmul_integer_to_float_session_runs_the_bound_step(relu):
    """ORT's dynamic-quantized MatMul (and with a fused bias + ReLU epilogue) runs on NpuEP (graph assignment) as
    bound native steps, no Python kernel, with the CPU EP's values: exact sums, then float32 scale and bias; ORT's
    MLAS output processor rounds its scale-and-bias differently in the last place (rtol 1e-6); the reference
    model's session gives the same bits."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import session_options
    model = _dynamic_matmul_model(24, 96, 40, relu)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    reference = npu_session(model, {"kernels": "reference"})  # the specification: the same bits
    assert set(assignment(sess).values()) == {"NpuEP"}
    for seed in range(3):
        x = {"x": np.random.default_rng(seed).standard_normal((24, 96)).astype(np.float32)}
        got = sess.run(None, x)[0]
        np.testing.assert_allclose(got, cpu_run(model, x)[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got, reference.run(None, x)[0])
    assert python_steps(sess) == [], "a step ran its Python kernel instead of a bound native step"


@pytest.mark.slow
@pytest.mark.parametrize("dta,dtb", INT_TYPES)
def test_accumulator_full_grid(isa, dta, dtb):
    for m in ROWS + [31, 32, 33, 40]:
        for n in COLS:
            for k in DEPTHS:
                _check_acc(m, k, n, dta, dtb, per_col=(m + n) % 2 == 0, threads=1 + m % 2)


# An infinite requantization multiplier (y_scale 0, or a_scale * b_scale overflowing) makes a zero sum's product NaN:
# MLAS's clip (maxps(v, lo) returns lo for a NaN) gives the lowest code, as the VNNI path did; the scalar and AVX2
# paths and the reference model cast the NaN to int (0 for int8, where ORT gives -128).
INFINITE_MULTIPLIERS = {"y_scale_0": (1.0, 0.0), "overflow": (1e30, 1e-30)}


def _qlinear_int8(a_scale: float, y_scale: float, y_zero_point: int = 5):
    a = np.array([[0, 1, -1, 0, 127, 0, 2]], np.int8).repeat(9, 0)  # 9 rows: an 8-row tile and a 1-row tail
    return [("a", a, False), ("as", np.array(a_scale, np.float32), True), ("az", np.array(0, np.int8), True),
            ("b", np.eye(7, 17, dtype=np.int8), True), ("bs", np.array(a_scale, np.float32), True),
            ("bz", np.array(0, np.int8), True), ("ys", np.array(y_scale, np.float32), True),
            ("yz", np.array(y_zero_point, np.int8), True)]


@pytest.mark.parametrize("case", sorted(INFINITE_MULTIPLIERS))
def test_requantized_nan_products_give_the_lowest_code_as_ort(isa, case):
    inputs = _qlinear_int8(*INFINITE_MULTIPLIERS[case])
    want = run_ort(single_node_model("QLinearMatMul", inputs), inputs)[0]
    with np.errstate(all="ignore"):
        got = check("QLinearMatMul", inputs, "int8_matmul", exact=True)[0]
    np.testing.assert_array_equal(got, want)
    assert (got[:, 0] == -128).all()


def test_requantized_nan_products_in_a_session_run_on_npu_as_the_cpu_ep():
    model = single_node_model("QLinearMatMul", _qlinear_int8(1.0, 0.0))
    a = _qlinear_int8(1.0, 0.0)[0][1]
    want = cpu_run(model, {"a": a})
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        np.testing.assert_array_equal(sess.run(None, {"a": a})[0], want[0], err_msg=kernels)


# K = 0 (an empty inner dimension): every sum is 0 (numpy's matmul; ORT's CPU EP leaves its output unwritten there,
# uninitialized values from 9 x 33 on, so exact math is the specification). The native path raised: _native_int
# reshaped A with -1 (ambiguous for a size-0 A), and pack_b padded K to 64 where the kernel's layout has kp = 0.
def _empty_depth_inputs(op: str, m: int, n: int) -> list:
    a = np.zeros((m, 0), np.uint8)
    b = np.zeros((0, n), np.int8)
    if op == "MatMulInteger":
        return [("a", a, False), ("b", b, True), ("az", np.array(3, np.uint8), True),
                ("bz", np.array(1, np.int8), True)]
    return [("a", a, False), ("as", np.array(0.1, np.float32), True), ("az", np.array(3, np.uint8), True),
            ("b", b, True), ("bs", np.array(0.2, np.float32), True), ("bz", np.array(1, np.int8), True),
            ("ys", np.array(0.5, np.float32), True), ("yz", np.array(131, np.uint8), True)]


def _empty_depth_result(op: str, m: int, n: int) -> np.ndarray:
    return np.zeros((m, n), np.int32) if op == "MatMulInteger" else np.full((m, n), 131, np.uint8)


@pytest.mark.parametrize("op", ["MatMulInteger", "QLinearMatMul"])
def test_an_empty_inner_dimension_gives_zero_sums(isa, op):
    for m, n in ((1, 1), (3, 17), (9, 33)):
        got = check(op, _empty_depth_inputs(op, m, n), "int8_matmul", exact=True)[0]
        np.testing.assert_array_equal(got, _empty_depth_result(op, m, n), err_msg=f"{op} M={m} N={n}")


def test_an_empty_inner_dimension_in_a_session_runs_on_npu():
    inputs = _empty_depth_inputs("QLinearMatMul", 9, 33)
    model = single_node_model("QLinearMatMul", inputs)
    want = _empty_depth_result("QLinearMatMul", 9, 33)
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        np.testing.assert_array_equal(sess.run(None, {"a": inputs[0][1]})[0], want, err_msg=kernels)


def test_int8_matmul_borrows_or_converts_its_arrays(isa):
    """``int8_matmul`` takes its arrays as objects (a bound step's call: borrowed, no numpy conversion per call): the
    exact integer product across the row tiles, column blocks and depths, an 8-bit zero point widened as pybind11's
    caster widened it (the same bytes as int32), per-row zero points and requantization; out: written and returned
    when it fits, else a new array; a wrong array named in the error."""
    nat = runtime.native_module()
    for m in (1, 2, 5, 8, 9, 17):
        for n, k in ((15, 4), (16, 64), (33, 70), (48, 128)):
            a, b, bzp = _codes((m, k), np.uint8), _codes((k, n), np.int8), _codes((n,), np.int8)
            pk = pack_b(b, bzp)
            consts = (pk["i8_bp"], pk["i8_bsum"], pk["i8_bzp"], k, n)
            for azp in (np.array([131], np.int32), np.array([131], np.uint8), _codes((m,), np.uint8).astype(np.int32)):
                exact = (a.astype(np.int64) - azp.astype(np.int64).reshape(-1, 1)) @ (b.astype(np.int64) - bzp)
                got = nat.int8_matmul(a, azp, *consts)
                assert got.dtype == np.int32 and np.array_equal(got, exact), (m, n, k, azp.dtype)
                mult = RNG.uniform(1e-4, 1e-2, n).astype(np.float32)
                want = nat.int8_matmul(a, azp.astype(np.int32), *consts, 1, mult, 7, True)
                out = np.full((m, n), 99, np.int8)
                got = nat.int8_matmul(a, azp, *consts, 1, mult, 7, True, None, False, out)
                assert got is out and got.tobytes() == want.tobytes(), (m, n, k, "requantized")
    a, b = _codes((3, 64), np.int8), _codes((64, 16), np.int8)
    pk = pack_b(b, np.int8(0))
    args = (a, np.array([0], np.int32), pk["i8_bp"], pk["i8_bsum"], pk["i8_bzp"], 64, 16)
    for bad in (np.zeros((3, 16), np.int64), np.zeros((3, 17), np.int32)):
        got = nat.int8_matmul(*args, 1, None, 0, False, None, False, bad)
        assert got is not bad and got.tobytes() == nat.int8_matmul(*args).tobytes()
    with pytest.raises(TypeError, match="bp"):
        nat.int8_matmul(a, args[1], "bytes", *args[3:])
    with pytest.raises(ValueError, match="uint8 or int8"):
        nat.int8_matmul(a.astype(np.int16), *args[1:])


@pytest.mark.parametrize("dta", [np.uint8, np.int8])
def test_products_split_over_threads_give_the_exact_sums(isa, dta):
    """Products past the one-thread threshold run their tasks on helper threads, which read the caller's prepared A'
    rows and zero-point terms (the caller's own buffers): the exact sums, the same on one thread and two."""
    m, k, n = 128, 384, 384
    a, b = _codes((m, k), dta), _codes((k, n), np.int8)
    azp, bzp = _codes((), dta), _codes((n,), np.int8)
    want = _exact(a, azp, b, bzp)
    for threads in (2, 1, 2):
        np.testing.assert_array_equal(_native_int8(a, azp, b, bzp, threads), want, err_msg=f"threads={threads}")
    mult = RNG.uniform(1e-5, 1e-4, n).astype(np.float32)
    one, two = (_native_int8(a, azp, b, bzp, t, multiplier=mult, y_zero_point=3) for t in (1, 2))
    assert one.tobytes() == two.tobytes()
