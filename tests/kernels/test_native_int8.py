"""The native int8 GEMM (kernels/native/int8_gemm.cc) is bit-exact: against exact int64 numpy math for the
int32 accumulator, against the reference model's ``requantize`` for QLinearMatMul's output, on every
instruction-set path this host runs, at any thread count; and through NpuEP sessions the native and the
reference kernels give identical bits (and match ORT's CPU EP, whose int8 GEMM is exact on this data)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep import _native
from npu_ep.kernels.ops._matrix import requantize
from npu_ep.kernels.ops.matmul_int import pack_b
from tests.npu_testing import assignment, cpu_run, make_model, npu_session

NK = _native.kernels
RNG = np.random.default_rng(13)



def _codes(shape, dt):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def _native_acc(a, azp, b, bzp, threads=1, **kw):
    pk = pack_b(b, bzp)
    return NK.int8_matmul(a, np.asarray(azp, np.int32).reshape(-1), pk["i8_bp"], pk["i8_bsum"], pk["i8_bzp"],
                          b.shape[0], b.shape[1], threads, **kw)


def _exact(a, azp, b, bzp):
    za = np.asarray(azp, np.int64).reshape(-1, 1) if np.size(azp) > 1 else np.int64(azp)
    return ((a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(bzp, np.int64))).astype(np.int32)


@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8),
                                     (np.int8, np.uint8)])
# AMX hosts: 16-row tiles in pairs, a lone tile and a tail of rows (70), A read in place (K = 64)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 63, 5), (17, 200, 33), (5, 1000, 7), (32, 64, 16),
                                   (70, 320, 40)])
@pytest.mark.parametrize("per_col", [False, True])
def test_accumulator_bit_exact(isa, dta, dtb, m, k, n, per_col):
    a, b = _codes((m, k), dta), _codes((k, n), dtb)
    azp = _codes((), dta)
    bzp = _codes((n,), dtb) if per_col else _codes((), dtb)
    np.testing.assert_array_equal(_native_acc(a, azp, b, bzp), _exact(a, azp, b, bzp))


def test_per_row_a_zero_point_and_extremes():
    a = np.full((36, 300), 255, np.uint8)  # 36 rows: a pair of AMX tiles and a tail
    a[1::4] = 0
    b = np.full((300, 6), -128, np.int8)
    azp = np.tile(np.array([0, 255, 128, 7], np.int32), 9)
    np.testing.assert_array_equal(_native_acc(a, azp, b, np.int8(127)), _exact(a, azp, b, 127))


@pytest.mark.parametrize("y_signed", [False, True])
@pytest.mark.parametrize("per_col", [False, True])
@pytest.mark.parametrize("m,k,n", [(9, 130, 21), (19, 200, 101), (48, 128, 64)])  # tails; 8x32 tiles, odd rows;
#   48 x 64: two 32-column passes over a pair of AMX tiles and a lone one
def test_requantized_output_bit_exact(isa, y_signed, per_col, m, k, n):
    a, b = _codes((m, k), np.uint8), _codes((k, n), np.int8)
    mult = (RNG.uniform(1e-5, 1e-3, n if per_col else 1)).astype(np.float32)
    yzp = -3 if y_signed else 131
    y = _native_acc(a, 128, b, 0, multiplier=mult, y_zero_point=yzp, y_signed=y_signed)
    want = requantize(_exact(a, 128, b, 0), mult if per_col else mult[0], np.float32(yzp),
                      "int8" if y_signed else "uint8")
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(y, want)


def test_same_bits_at_any_thread_count():
    a, b = _codes((17, 333), np.int8), _codes((333, 101), np.uint8)
    y1 = _native_acc(a, 3, b, 200, threads=1)
    for t in (2, 3):
        np.testing.assert_array_equal(_native_acc(a, 3, b, 200, threads=t), y1)


def _qlinear_model(m, k, n):
    # 7-bit weights: ORT's AVX2 U8S8 kernel (no VNNI) saturates int16 pair sums beyond them (test_matmul_int.py)
    b = RNG.integers(-64, 64, (k, n)).astype(np.int8)
    inits = {"as": np.array(0.02, np.float32), "az": np.array(128, np.uint8), "b": b,
             "bs": np.array(0.01, np.float32), "bz": np.array(0, np.int8), "ys": np.array(2.0, np.float32),
             "yz": np.array(128, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], "qmm")
    return make_model([node], [helper.make_tensor_value_info("x", TensorProto.UINT8, [m, k])],
                      [helper.make_tensor_value_info("y", TensorProto.UINT8, [m, n])], inits, opset=21)


def _integer_model(m, k, n):
    inits = {"b": _codes((k, n), np.uint8), "az": np.array(7, np.int8), "bz": _codes((n,), np.uint8)}
    node = helper.make_node("MatMulInteger", ["x", "b", "az", "bz"], ["y"], "mmi")
    return make_model([node], [helper.make_tensor_value_info("x", TensorProto.INT8, [m, k])],
                      [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])], inits, opset=21)


@pytest.mark.parametrize("build,dt", [(_qlinear_model, np.uint8), (_integer_model, np.int8)])
def test_sessions_native_equals_reference_and_cpu(build, dt):
    model = build(33, 1024, 257)
    x = {"x": _codes((33, 1024), dt)}
    outs = []
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        outs.append(sess.run(None, x)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], cpu_run(model, x)[0])
