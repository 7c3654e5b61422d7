"""Differential sweep of the channel normalizations (issue 40): ``norm_channels`` (kernels/native/norm.cc) against the
reference model (kernels/ops/norm_channel.py) for BatchNormalization (inference, folded: x * a + b, bit for bit),
InstanceNormalization and GroupNormalization (statistics summed in 16 lanes where numpy sums pairwise: float32 within
rtol 1e-5 / atol 1e-5, float16 within 2e-3, one float16 rounding), float32 and float16: planes around the 16 lanes,
groups around the 16384-element task split, one thread and two (the same bits), ranks 2 to 5, constant and runtime per-
channel parameters, special values (one per group: NaN, +-Inf, -0, huge, denormals), on every ISA level the host runs
(SSE2, AVX2 and AVX-512 copies of the loops, F16C float16 rows at AVX2). Sessions show NpuEP ran the node as its bound
native step (no Python step), with the CPU EP's values (float32 within 1e-4, BatchNorm's folding rounds differently from
ORT's; float16 3e-3)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from _isa import cap_isa, host_isas
from _sweep import around, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4044)
TASK = 16384  # norm.cc's kTaskElems
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 3.0e38, 1.0e-45, -1.0e-38)
OPS = ["BatchNormalization", "InstanceNormalization", "GroupNormalization"]


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _x(shape, dt, groups: int, specials: bool, rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(dt)
    if specials and x.size:
        runs = x.reshape(shape[0] * groups, -1)
        with np.errstate(over="ignore"):  # 3e38 is Inf in float16: a value the kernel meets
            for r in range(runs.shape[0]):  # one per group: a group's result does not hinge on summation order
                runs[r, (r * 5) % runs.shape[1]] = SPECIALS[r % len(SPECIALS)]
    return x


def _case(op: str, shape, dt, *, groups: int = 2, specials: bool = False, threads: int = 1, const: bool = True,
          seed: int | None = None, per_group: bool = False) -> list[np.ndarray]:
    """One node checked against the reference (``per_group``: GroupNormalization-18's scale/bias per group)."""
    rng = RNG if seed is None else np.random.default_rng(seed)
    c = shape[1]
    g = {"BatchNormalization": c, "InstanceNormalization": c}.get(op, groups)
    x = _x(shape, dt, g, specials, rng)
    n_par = g if per_group else c
    inputs = [("x", x, False), ("scale", rng.uniform(0.5, 1.5, n_par).astype(dt), const),
              ("bias", rng.uniform(-0.5, 0.5, n_par).astype(dt), const)]
    attrs: dict = {"epsilon": 1e-5}
    if op == "BatchNormalization":
        inputs += [("mean", rng.uniform(-0.5, 0.5, c).astype(dt), True),
                   ("var", rng.uniform(0.5, 2, c).astype(dt), True)]
    if op == "GroupNormalization":
        attrs["num_groups"] = groups
    tol = ({"exact": True} if op == "BatchNormalization" else
           {"exact": False, "rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {"exact": False, "rtol": 2e-3,
                                                                                  "atol": 2e-3})
    return check(op, inputs, "norm_channels", threads=threads, what=f"{op} {np.dtype(dt).name}{shape} g={g}",
                 **tol, **attrs)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_planes_around_the_lanes(capped_isa, op, dt):
    for hw in [1, 3, *around(16, 32), 100]:
        _case(op, (2, 4, hw), dt)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_special_values_one_per_group(capped_isa, op, dt):
    _case(op, (2, 6, 5, 7), dt, groups=3, specials=True)


@pytest.mark.parametrize("op", OPS)
def test_task_split_and_threads_same_bits(op):
    for hw in around(TASK // 4, TASK // 2):  # 4 channels of a group, or planes of hw per task
        _case(op, (2, 8, hw), np.float32, groups=2)
    big = (2, 16, 180, 185)  # over kMinParallelWork (thread_pool.h): two threads really run
    a = _case(op, big, np.float32, groups=4, threads=1, seed=9)
    b = _case(op, big, np.float32, groups=4, threads=2, seed=9)
    assert a[0].tobytes() == b[0].tobytes(), f"{op}: the result depends on the thread count"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(3, 8), (2, 4, 6), (1, 4, 3, 5, 2)])
def test_ranks(op, shape):
    _case(op, shape, np.float32, groups=4 if op == "GroupNormalization" else 2)
    _case(op, shape, np.float16, groups=2)


@pytest.mark.parametrize("op", ["InstanceNormalization", "GroupNormalization"])
def test_runtime_parameters(op):
    _case(op, (2, 6, 9, 9), np.float32, groups=3, const=False)
    _case(op, (2, 6, 9, 9), np.float16, groups=3, const=False)


def test_group_norm_parameters_per_group():
    _case("GroupNormalization", (2, 6, 9, 9), np.float32, groups=3, per_group=True)
    _case("GroupNormalization", (2, 6, 9, 9), np.float16, groups=3, per_group=True)


def _session_model(op: str, dt, shape, opset: int):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    c, rng = shape[1], np.random.default_rng(5)
    inits = {"s": rng.uniform(0.5, 1.5, c).astype(dt), "b": rng.uniform(-0.5, 0.5, c).astype(dt)}
    attrs: dict = {"epsilon": 1e-5}
    if op == "BatchNormalization":
        inits |= {"m": rng.uniform(-0.5, 0.5, c).astype(dt), "v": rng.uniform(0.5, 2, c).astype(dt)}
    if op == "GroupNormalization":
        attrs["num_groups"] = 3
    node = helper.make_node(op, ["x", *inits], ["y"], name="the_op", **attrs)
    return make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                      [helper.make_tensor_value_info("y", elem, shape)], inits, opset=opset)


@pytest.mark.parametrize("op,opset", [("BatchNormalization", 15), ("InstanceNormalization", 17),
                                      ("GroupNormalization", 21)])
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op, opset, dt):
    shape = [2, 6, 20, 24]
    model = _session_model(op, dt, shape, opset)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": (RNG.standard_normal(shape) * 2).astype(dt)}
    want = cpu_run(model, feeds)[0]
    tol = 1e-4 if dt == np.float32 else 3e-3
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
