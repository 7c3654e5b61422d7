"""Differential sweep of the native npu::QdqLut table reads (kernels/native/qdq_lut.cc), issue 38, against the
reference model's numpy indexing (kernels/ops/qdq_lut.reference), byte for byte: one input (256 entries), two of
one shape (65536 entries) and a per-channel operand (one 256-entry row per run of ``inner`` elements, either
operand the small one), uint8 and int8 inputs and tables, every byte value in every position.

qdq_lut.cc's blocks: 64 bytes per AVX-512 VBMI step (its tail masked; the table's two halves chosen by bit 7), the
scalar loop elsewhere; tasks of 2^18 elements, a per-channel run cut where a task ends. Sizes cross 64 and its
multiples, runs cross the task boundary. The kernel binds its native call as the step (``_sweep`` checks the step's
bytes against the kernel's); a session of a fused QDQ unit runs it with no Python step and ORT's unoptimized bytes."""

from __future__ import annotations

import numpy as np
import pytest

from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check, kernel_and_bound_step
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3807)
SIZES = around(64, 128, 256)
CHUNK = 1 << 18


@pytest.fixture(params=host_isas(top="avx512"))
def lut_isa(request):
    yield from cap_isa(request.param)


def _bytes(shape, dt) -> np.ndarray:
    """Every byte value first (bit 7 set and clear), then random ones."""
    n = int(np.prod(shape))
    v = np.concatenate([np.arange(256), RNG.integers(0, 256, max(0, n - 256))])[:n]
    return v.astype(np.uint8).view(dt).reshape(shape)


def _table(entries, dt) -> np.ndarray:
    return RNG.integers(0, 256, entries).astype(np.uint8).view(dt)


def _lut(*inputs, table, threads=1):
    specs = [(f"x{i}", v, False) for i, v in enumerate(inputs)] + [("table", table, True)]
    check("QdqLut", specs, "qdq_lut_rows" if len(inputs) == 2 and inputs[0].shape != inputs[1].shape else "qdq_lut",
          exact=True, domain="npu", threads=threads)


@pytest.mark.parametrize("dt_in,dt_table", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8)])
def test_one_input(lut_isa, dt_in, dt_table):
    for n in SIZES:
        _lut(_bytes((n,), dt_in), table=_table(256, dt_table))


def test_two_inputs_of_one_shape(lut_isa):
    for n in (1, 63, 64, 65, 300):
        _lut(_bytes((n,), np.uint8), _bytes((n,), np.int8)[::-1].copy(), table=_table(65536, np.uint8))


def test_per_channel_operand(lut_isa):
    """[N, C, 1, W] with a per-channel ([C, 1, 1], [1, C, 1, 1], [N, C, 1, 1]) or per-tensor operand on either
    side (a shape that is a prefix of the other's, then ones: qdq_lut._inner): runs of W around 64."""
    table = _table(65536, np.int8)
    for hw in (2, 63, 64, 65, 130):  # W = 1: operands of one size, where numpy's broadcast runs instead
        one = _bytes((1, 3, 1, hw), np.uint8)
        two = _bytes((2, 3, 1, hw), np.uint8)
        for big, small in ((one, _bytes((3, 1, 1), np.uint8)), (one, _bytes((1, 3, 1, 1), np.int8)),
                           (two, _bytes((2, 3, 1, 1), np.uint8)), (two, _bytes((1,), np.uint8))):
            _lut(big, small, table=table)
            _lut(small, big, table=table)


def test_tasks_of_2_18_elements(lut_isa):
    _lut(_bytes((CHUNK + 65,), np.uint8), table=_table(256, np.uint8), threads=2)
    big = _bytes((3, (CHUNK + 5) // 3 + 1), np.uint8)  # runs cut by the task boundary
    _lut(big, _bytes((3, 1), np.uint8), table=_table(65536, np.uint8), threads=2)


@pytest.mark.parametrize("form", ["one_input", "two_of_one_shape", "per_channel_a", "per_channel_b"])
def test_the_kernel_binds_its_native_call(form):
    """Each native form is the bound step (what a session's loop runs): the step's bytes are the kernel's."""
    x = _bytes((1, 3, 1, 70), np.uint8)
    inputs = {"one_input": (x,), "two_of_one_shape": (x, _bytes(x.shape, np.int8)),
              "per_channel_a": (x, _bytes((3, 1, 1), np.uint8)), "per_channel_b": (_bytes((3, 1, 1), np.uint8), x)}
    srcs = inputs[form]
    specs = [(f"x{i}", v, False) for i, v in enumerate(srcs)] + [("table", _table(256 ** len(srcs), np.int8), True)]
    got, bound = kernel_and_bound_step("QdqLut", specs, domain="npu")
    assert len(bound) == 1, f"{form}: the kernel bound no native step"
    assert bound[0].tobytes() == got[0].tobytes()


def _qdq_mul_model(shape):
    """DequantizeLinear -> Mul by a constant -> QuantizeLinear on uint8: the unit the qdq_lut pass makes one table."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], name="dq"),
             helper.make_node("Mul", ["xf", "c"], ["yf"], name="mul"),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"], name="q")]
    inits = {"s": np.float32(0.04), "z": np.uint8(128), "c": np.float32(1.5), "ys": np.float32(0.05),
             "yz": np.uint8(100)}
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, list(shape))],
                      [helper.make_tensor_value_info("y", TensorProto.UINT8, list(shape))], inits)


def test_session_runs_the_bound_table_read_with_ort_bytes():
    """NpuEP runs the fused unit (graph assignment), as its bound native step from the second call on (no Python
    step), with the bytes of ORT's CPU EP running the QDQ graph literally (unoptimized: DQ, Mul, Q)."""
    import onnxruntime as ort
    shape = (1, 8, 16, 16)
    model = _qdq_mul_model(shape)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    cpu = ort.InferenceSession(model.SerializeToString(), plain, providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)}
        assert sess.run(None, feeds)[0].tobytes() == cpu.run(None, feeds)[0].tobytes()
    assert "npu::QdqLut" in [s["op"] for s in _steps(sess)]
    assert python_steps(sess) == [], "a step ran its Python kernel instead of a bound native step"


def _steps(sess):
    from npu_ep.tools.bench.ops import _ep_session
    return [{"op": st.op} for program in _ep_session(sess).programs.values() for st in program.steps]
