"""Differential sweep of the native per-tensor Q/DQ (kernels/native/quantize.cc) behind QuantizeLinear,
DequantizeLinear and DynamicQuantizeLinear, issue 38: bit-exact against the reference model (the same float32
steps: a division, round half to even, + zero point, clip; NaN to the lowest code), on every level it dispatches to.

quantize.cc's blocks: 64 codes per AVX-512 step through saturating packs, then 16 lanes (the tail masked), tasks
of 2^18 elements (two threads split a tensor only above that). DequantizeLinear for every container dequantize_into
takes (int8, uint8, int16, uint16, int32; int32 values past 2^24 round to float32 as the reference's astype), into
ORT's buffer in a session. Values: ties (x / scale exactly k + 0.5, both parities), saturation at both ends
(quotients inside int32, past it and at +-2^31), NaN, +-Inf, -0.0, huge and subnormal values, zero points at the
types' extremes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _single_op import model as single_node_model, run_ort
from _sweep import around, check, node_model, run_kernel, with_specials
from npu_ep.kernels import runtime
from npu_testing import assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3801)
SIZES = around(16, 32, 64, 128, 192) + [1000]  # the 64-code packs, the 16-lane step and its masked tail
CHUNK = 1 << 18                      # quantize.cc's task size


@pytest.fixture(params=host_isas(top="avx512"))
def q_isa(request):
    yield from cap_isa(request.param)


def _values(n: int, scale: float) -> np.ndarray:
    """Random values over the codes' range and past it, ties k + 0.5 (times scale) and the special values."""
    x = (RNG.uniform(-300, 300, n) * scale).astype(np.float32)
    ties = ((RNG.integers(-200, 200, n) + 0.5) * scale).astype(np.float32)  # scale a power of two: exact
    x[::3] = ties[::3]
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 3e38, -3e38, 1e-45, -1e-45, 1e8, -1e8,
                                         -3e8, 2.68435456e8, -2.68435456e8))


@pytest.mark.parametrize("qtype,zp", [(np.uint8, 0), (np.uint8, 131), (np.uint8, 255), (np.int8, 0), (np.int8, -7),
                                      (np.int8, -128), (np.int8, 127)])
def test_quantize_linear(q_isa, qtype, zp):
    for n in SIZES:
        for scale in (np.float32(0.125), np.float32(0.0371)):
            inputs = [("x", _values(n, float(scale)), False), ("s", np.array(scale, np.float32), True),
                      ("z", np.array(zp, qtype), True)]
            check("QuantizeLinear", inputs, "quantize_tensor", exact=True)


@pytest.mark.parametrize("qtype,zp", [(np.uint8, 0), (np.uint8, 255), (np.int8, -128), (np.int8, 5), (np.int16, 0),
                                      (np.int16, -300), (np.uint16, 40000), (np.int32, 0), (np.int32, 123457)])
def test_dequantize_linear(q_isa, qtype, zp):
    info = np.iinfo(qtype)
    for n in SIZES:
        x = RNG.integers(info.min, info.max + 1, n).astype(qtype)
        x[::5] = info.min
        x[1::5] = info.max
        for scale in (np.float32(0.02), np.float32(3e38)):  # 3e38 * 255: +-Inf, as the reference's float32
            inputs = [("x", x, False), ("s", np.array(scale, np.float32), True), ("z", np.array(zp, qtype), True)]
            check("DequantizeLinear", inputs, "dequantize_into", exact=True)


def test_dynamic_quantize_linear(q_isa):
    """DynamicQuantizeLinear: ORT's range (widened to 0), then the same quantization; tiny, constant, one-sided."""
    for n in SIZES:
        x = RNG.standard_normal(n).astype(np.float32) * 4
        specials = with_specials(x, RNG, values=(np.nan, 3e38, -3e38, 1e-45, -0.0))
        for case in (x, np.abs(x), -np.abs(x), x * 1e-30, np.full(n, 2.5, np.float32), np.where(x > 1, x, -0.0),
                     specials, np.where(x > 0, np.nan, x), np.full(n, np.nan, np.float32)):
            check("DynamicQuantizeLinear", [("x", case.astype(np.float32), False)], "dynamic_quantize", exact=True,
                  n_out=3)


def test_quantize_across_task_chunks(q_isa):
    x = _values(CHUNK + 17, 0.0625)
    inputs = [("x", x, False), ("s", np.array(0.0625, np.float32), True), ("z", np.array(3, np.int8), True)]
    check("QuantizeLinear", inputs, "quantize_tensor", exact=True, threads=2)
    check("DynamicQuantizeLinear", [("x", np.nan_to_num(x, nan=1.0, posinf=5.0, neginf=-5.0), False)],
          "dynamic_quantize", exact=True, threads=2, n_out=3)
    codes = RNG.integers(-128, 128, CHUNK + 17).astype(np.int8)
    check("DequantizeLinear", [("x", codes, False), ("s", np.array(0.07, np.float32), True),
                               ("z", np.array(-9, np.int8), True)], "dequantize_into", exact=True, threads=2)


@pytest.mark.parametrize("qtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
def test_dequantize_around_the_gil_release(qtype):
    """dequantize_into releases the GIL from 64 KB of output (16384 elements) on: the same bits either side; x's
    container is read from its dtype's number, so a byte-swapped x is refused, not read as native."""
    info = np.iinfo(qtype)
    for n in around(16384):
        x = RNG.integers(info.min, info.max + 1, n).astype(qtype)
        check("DequantizeLinear", [("x", x, False), ("s", np.array(0.02, np.float32), True),
                                   ("z", np.array(info.max // 3, qtype), True)], "dequantize_into", exact=True)
    if np.dtype(qtype).itemsize > 1:
        with pytest.raises(ValueError, match="must be int8"):
            runtime.native_module().dequantize_into(np.zeros(4, np.dtype(qtype).newbyteorder()), 0.0, 1.0)


@pytest.mark.slow
def test_quantize_every_size_to_200(q_isa):
    for n in range(1, 200):
        inputs = [("x", _values(n, 0.5), False), ("s", np.array(0.5, np.float32), True),
                  ("z", np.array(n % 256, np.uint8), True)]
        check("QuantizeLinear", inputs, "quantize_tensor", exact=True)


# DynamicQuantizeLinear's range with NaN and infinities, against ORT's CPU EP (qmath.h's GetQuantizationParameter is
# the specification: NaN left out of the range, the zero point 255 when 0 - min / scale is NaN). Both kernels failed
# here: the native path raised "cannot convert float NaN to integer" (the zero point was NaN), the reference gave a
# NaN scale and zero point 0. Fewer than 8 elements: MLAS's min/max runs its scalar loop, which drops every NaN; its
# vector loop (8+ elements) keeps a NaN that a lane loads last, a position-dependent result the model leaves out.
RANGE_CASES = {"nan": [np.nan, 1, -1, 2], "all_nan": [np.nan, np.nan], "minus_inf": [-np.inf, 1, 2],
               "both_inf": [np.inf, -np.inf, 1, 2], "plus_inf": [np.inf, 1, 2, -1],
               "nan_and_minus_inf": [np.nan, -np.inf, 3]}


@pytest.mark.parametrize("case", sorted(RANGE_CASES))
def test_dynamic_quantize_linear_range_with_nan_and_infinities_is_orts(q_isa, case):
    x = np.array(RANGE_CASES[case], np.float32)
    inputs = [("x", x, False)]
    want = run_ort(single_node_model("DynamicQuantizeLinear", inputs, n_out=3), inputs)
    got = check("DynamicQuantizeLinear", inputs, "dynamic_quantize", exact=True, n_out=3)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w, err_msg=case)


def test_dynamic_quantize_linear_with_nan_in_a_session_runs_on_npu_as_the_cpu_ep():
    """7 elements (MLAS's scalar min/max, see above): a NaN left out of the range, and a -Inf minimum's zero point."""
    model = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dql")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 7]),
                        helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                        helper.make_tensor_value_info("z", TensorProto.UINT8, [])], opset=21)
    for row in ([np.nan, 1, -1, 2, 0.5, 3, np.nan], [0.5, -np.inf, 7, np.nan, 1, 2, 3]):
        feeds = {"x": np.array([row], np.float32)}
        want = cpu_run(model, feeds)
        for kernels in ("native", "reference"):
            sess = npu_session(model, {"kernels": kernels}, cpu=False)
            assert set(assignment(sess).values()) == {"NpuEP"}
            for g, w in zip(sess.run(None, feeds), want):
                np.testing.assert_array_equal(g, w, err_msg=f"{kernels} {row}")


@pytest.mark.parametrize("qtype,elem", [(np.int16, TensorProto.INT16), (np.uint16, TensorProto.UINT16),
                                        (np.int32, TensorProto.INT32), (np.int8, TensorProto.INT8)])
def test_dequantize_linear_session_runs_the_bound_step_into_orts_buffer(qtype, elem):
    """NpuEP runs the node as its bound native step (no Python step), with the CPU EP's float32 values exactly."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import session_options
    info = np.iinfo(qtype)
    zp = np.array(0 if qtype == np.int32 else info.min // 3 + info.max // 3 + 1, qtype)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [1, 64, 300])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 300])],
                       {"s": np.array(0.0173, np.float32), "z": zp}, opset=21)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    lo, hi = (-(1 << 30), 1 << 30) if qtype == np.int32 else (info.min, info.max + 1)
    feeds = {"x": RNG.integers(lo, hi, (1, 64, 300)).astype(qtype)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


def test_dynamic_quantize_linear_session_runs_the_bound_step():
    """NpuEP runs the node as its bound native step (no Python step), with the CPU EP's three outputs exactly."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import session_options
    model = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="the_op")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 384])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 128, 384]),
                        helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                        helper.make_tensor_value_info("z", TensorProto.UINT8, [])], opset=21)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    for shift in (0.0, 3.0, -3.0):  # a range across 0, all positive, all negative
        feeds = {"x": (RNG.standard_normal((1, 128, 384)) + shift).astype(np.float32)}
        want = cpu_run(model, feeds)
        for _ in range(2):
            for g, w in zip(sess.run(None, feeds), want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


HALF_BLOCK, HALF_CHUNK = 512, 1 << 15  # quantize.cc's float16 widening block and task size


def _half_values(n: int, scale: float) -> np.ndarray:
    """float16 values over the codes' range and past it, ties k + 0.5 (times a power-of-two scale: exact in float16),
    NaN, +-Inf, -0.0, the largest float16 and a subnormal."""
    with np.errstate(over="ignore"):  # values past float16's range become +-Inf
        x = _values(n, scale).astype(np.float16)
    ties = ((RNG.integers(-200, 200, n) + 0.5) * scale).astype(np.float16)
    x[1::3] = ties[1::3]
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 65504.0, -65504.0, 6e-8, -6e-8))


@pytest.mark.parametrize("domain", ["", "com.microsoft"])
@pytest.mark.parametrize("qtype,zp", [(np.uint8, 0), (np.uint8, 131), (np.int8, 0), (np.int8, -7)])
def test_quantize_linear_float16(q_isa, domain, qtype, zp):
    """float16 x with a float16 scale: quantize_half widens x (and the scale) exactly and takes the float32 steps,
    the reference's bits; sizes across the 16 lanes, the 512-element widening block and the 2^15 task."""
    for n in SIZES + around(HALF_BLOCK, 2 * HALF_BLOCK):
        for scale in (np.float16(0.125), np.float16(0.0371), np.float16(1e-5)):  # 1e-5: quotients past int32
            inputs = [("x", _half_values(n, float(scale)), False), ("s", np.array(scale, np.float16), True),
                      ("z", np.array(zp, qtype), True)]
            check("QuantizeLinear", inputs, "quantize_half", exact=True, domain=domain)
    x = _half_values(2 * HALF_CHUNK + 17, 0.0625)
    inputs = [("x", x, False), ("s", np.array(0.0625, np.float16), True), ("z", np.array(zp, qtype), True)]
    one = check("QuantizeLinear", inputs, "quantize_half", exact=True, domain=domain, threads=1)
    two = check("QuantizeLinear", inputs, "quantize_half", exact=True, domain=domain, threads=2)
    assert one[0].tobytes() == two[0].tobytes()


HALF_SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 65504, -65504, 1, -1, 0.5, 1.5, 2.5, -0.5, -2.5, 0.7, 10, -10],
                         np.float16)


@pytest.mark.parametrize("qtype,zp", [(np.uint8, 131), (np.int8, -7), (np.int8, 3), (np.int16, -300)])
@pytest.mark.parametrize("scale", [1.0, 1e-5])
def test_quantize_linear_float16_out_of_int32_is_orts(qtype, zp, scale):
    """ORT's float16 kernel converts the rounded quotient to int32 before adding the zero point: NaN, +-Inf and
    quotients past 2^31 become INT_MIN, so they give the lowest code with a zero point >= 0 and (the addition wraps)
    the highest with a negative one; its float32 kernel gives +Inf the highest. The reference and the native kernel
    follow the float16 kernels (this failed with the float32 rule: +Inf gave 255 where ORT's ONNX-domain kernel
    gives 0); com.microsoft's clamps first."""
    inputs = [("x", HALF_SPECIALS, False), ("s", np.array(scale, np.float16), True), ("z", np.array(zp, qtype), True)]
    for domain in ("", "com.microsoft"):  # com.microsoft's float16 kernel clamps before it converts, as float32
        if domain and qtype == np.int16:
            continue
        want = run_ort(single_node_model("QuantizeLinear", inputs, domain=domain), inputs)[0]
        for kernels in ("native", "reference"):
            got = run_kernel(node_model("QuantizeLinear", inputs, domain=domain), {"x": HALF_SPECIALS}, kernels)[0]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want, err_msg=f"{domain} {kernels}")


@pytest.mark.parametrize("domain", ["", "com.microsoft"])
@pytest.mark.parametrize("dt", [np.float16, np.float32])
def test_quantize_linear_session_runs_the_bound_step(domain, dt):
    """NpuEP runs a float16 or float32 QuantizeLinear as its bound native step (no Python step), its codes written
    into ORT's buffer (the node's result is the partition's output), the CPU EP's codes exactly (ties, saturation,
    NaN, +-Inf among the values)."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import session_options
    elem = TensorProto.FLOAT16 if dt == np.float16 else TensorProto.FLOAT
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="the_op", domain=domain)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [1, 64, 300])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 64, 300])],
                       {"s": np.array(0.0371, dt), "z": np.array(131, np.uint8)}, opset=21,
                       extra_opsets=[(domain, 1)] if domain else [])
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    values = _half_values if dt == np.float16 else _values
    feeds = {"x": values(64 * 300, 0.0371).reshape(1, 64, 300)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


@pytest.mark.parametrize("signed", [False, True])
def test_quantize_tensor_into_out(signed):
    """quantize_tensor writes into out (ORT's buffer in a bound step) the bytes of a new array; a wrong out (dtype,
    size, read-only) is refused."""
    nat = runtime.native_module()
    x = _values(3 * 4099, 0.125).reshape(3, 4099)
    qt = np.int8 if signed else np.uint8
    want = nat.quantize_tensor(x, 0.125, -3 if signed else 7, signed, None, 2)
    out = np.full(x.shape, 99, qt)
    got = nat.quantize_tensor(x, 0.125, -3 if signed else 7, signed, out, 2)
    assert got is out and out.tobytes() == want.tobytes()
    frozen = np.zeros(x.shape, qt)
    frozen.flags.writeable = False
    for bad in (np.zeros(x.shape, np.int8 if not signed else np.uint8), np.zeros(x.size - 1, qt), frozen):
        with pytest.raises(ValueError, match="quantize_tensor: out must be a writeable C-order"):
            nat.quantize_tensor(x, 0.125, 0, signed, bad, 1)
