"""Differential sweep of com.microsoft QLinearGlobalAveragePool on the native kernels (issue 40):
``qlinear_global_average_pool`` (kernels/native/qlinear_pool.cc) against the reference model
(kernels/ops/qlinear_pool.py: numpy's int32 sum and MLAS requantization), bit for bit: int8 and uint8, NCHW and
channels_last, ranks 3..5, planes around the 32- and 64-byte sum steps and the 64 KB task split, all-low and
all-high images (the int8 bias to unsigned, saturation at both ends), many scales and zero points, parameters fed
at run time, one and two threads, every ISA the sums dispatch to. The bound step is checked against the kernel by
``_sweep``. Sessions show NpuEP ran the node as its bound native step (no Python step) with the CPU EP's integers
exactly (ORT's MLAS computes the same integer sum and float32 requantization)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, assert_session_runs_natively, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4062)
MS = "com.microsoft"
FN = "qlinear_global_average_pool"


@pytest.fixture(params=host_isas(top="avx512"))
def sum_isa(request):
    yield from cap_isa(request.param)


def _bytes(shape, dt) -> np.ndarray:
    return RNG.integers(0, 256, shape).astype(np.uint8).view(dt).reshape(shape)


def _inputs(x, sx, zx, sy, zy, const=True) -> list:
    dt = x.dtype
    return [("x", x, False), ("x_s", np.array(sx, np.float32), const), ("x_z", np.array(zx, dt), const),
            ("y_s", np.array(sy, np.float32), const), ("y_z", np.array(zy, dt), const)]


def _params(dt, rng):
    info = np.iinfo(dt)
    zx, zy = (int(rng.integers(info.min, info.max, endpoint=True)) for _ in range(2))
    return float(10 ** rng.uniform(-2, 0)), zx, float(10 ** rng.uniform(-2, 0)), zy


def _pool(x, params, channels_last=0, threads=1, const=True):
    return check("QLinearGlobalAveragePool", _inputs(x, *params, const=const), FN, domain=MS, threads=threads,
                 channels_last=channels_last)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_plane_sizes_layouts_and_parameters_bit_exact(sum_isa, dt, channels_last):
    rng = np.random.default_rng(5)
    for hw in around(32, 64, 128):
        _pool(_bytes((2, 3, hw), dt), _params(dt, rng), channels_last)
    for shape in ((1, 4, 5, 7), (2, 3, 2, 3, 4), (1, 16, 8, 8)):
        _pool(_bytes(shape, dt), _params(dt, rng), channels_last)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_extreme_images_saturate_both_ends(sum_isa, dt):
    info = np.iinfo(dt)
    for fill in (info.min, info.max):
        x = np.full((1, 3, 9, 9), fill, dt)
        for zy in (info.min, 0, info.max):
            _pool(x, (0.5, 0, 0.01, zy))
            _pool(x, (0.01, 0, 0.5, zy), channels_last=1)


def test_runtime_parameters_task_split_and_threads():
    rng = np.random.default_rng(6)
    _pool(_bytes((2, 5, 7, 7), np.uint8), _params(np.uint8, rng), const=False)
    x, params = _bytes((2, 40, 57, 57), np.int8), _params(np.int8, rng)  # planes across 64 KB tasks
    one, two = _pool(x, params, threads=1), _pool(x, params, threads=2)
    assert one[0].tobytes() == two[0].tobytes()
    x = _bytes((3, 11, 13, 24), np.uint8)
    assert _pool(x, params[:1] + (128,) + params[2:3] + (7,), 1, threads=2)[0].shape == (3, 1, 1, 24)


def test_bad_input_is_named():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"qlinear_global_average_pool: x must be .* got float32\[2,3,4\]"):
        nat.qlinear_global_average_pool(np.zeros((2, 3, 4), np.float32), False, 0, 1.0, 0.0, 1)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_session_runs_the_bound_step_with_cpu_ep_integers(dt, channels_last):
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    zp = 0 if dt == np.int8 else 128
    shape = [1, 14, 14, 64] if channels_last else [1, 64, 14, 14]
    out = [1, 1, 1, 64] if channels_last else [1, 64, 1, 1]
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "x_s", "x_z", "y_s", "y_z"], ["y"], name="the_op",
                            domain=MS, channels_last=channels_last)
    consts = {"x_s": np.array(0.05, np.float32), "x_z": np.array(zp + 3, dt), "y_s": np.array(0.02, np.float32),
              "y_z": np.array(zp - 4, dt)}
    model = make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                       [helper.make_tensor_value_info("y", elem, out)], consts, opset=17, extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": _bytes(tuple(shape), dt)}
    assert_session_runs_natively(sess, model, feeds)
