"""Differential sweep of the row normalizations (issue 40): ``norm_rows`` (kernels/native/norm.cc) against the reference
model (kernels/ops/norm.py, skip_layernorm.py) for LayerNormalization, SimplifiedLayerNormalization (the RMS kernel
RMSNormalization shares), SkipSimplifiedLayerNormalization and SkipLayerNormalization, float32 and float16, with every
optional output: row widths around the 16 lanes, row counts around the 16384-element task split, one thread and two (the
same bits), any axis, a skip repeating over the batch, runtime parameters, special values (one per row: NaN, +-Inf, -0,
a huge value whose square overflows, denormals), on every ISA level the host runs (SSE2, AVX2 and AVX-512 copies of the
loops, F16C float16 rows at AVX2; AVX-512 LayerNormalization rows and float16 RMS rows in blocks of four rows, checked
byte for byte against the AVX2 rows). SkipSimplified is bit for bit (its sum of squares is sequential, as ORT's); the
others differ from numpy's pairwise sums in summation order only: float32 within rtol 1e-5 / atol 1e-5 (the statistics
too), float16 within 2e-3 (one float16 rounding apart). Sessions show NpuEP ran the node as its bound native step (no
Python step), with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from _isa import cap_isa, host_isas
from _sweep import around, check, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4043)
TASK = 16384  # norm.cc's kTaskElems
MS = "com.microsoft"
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 3.0e38, 1.0e-45, -1.0e-38)


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _x(shape, dt, specials: bool = False, rng: np.random.Generator = RNG) -> np.ndarray:
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(dt)
    if specials and x.size:
        rows = x.reshape(-1, x.shape[-1])
        with np.errstate(over="ignore"):  # 3e38 is Inf in float16: a value the kernel meets
            for r in range(rows.shape[0]):  # one special per row: a row's result does not hinge on summation order
                rows[r, (r * 7) % rows.shape[1]] = SPECIALS[r % len(SPECIALS)]
    return x


def _tol(dt, exact: bool = False) -> dict:
    if exact:
        return {"exact": True}
    return {"exact": False, "rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {"exact": False, "rtol": 2e-3,
                                                                                   "atol": 2e-3}


def _case(op: str, shape, dt, *, axis: int = -1, specials: bool = False, threads: int = 1, const: bool = True,
          skip_shape=None, bias: bool = True, seed: int | None = None):
    """One node's native outputs (all of them) checked against the reference (``seed``: its own values)."""
    rng = RNG if seed is None else np.random.default_rng(seed)
    x = _x(shape, dt, specials, rng)
    d = int(np.prod(shape[axis % len(shape):]))

    def vec(seed: int) -> np.ndarray:
        return np.random.default_rng(seed).uniform(0.5, 1.5, d).astype(dt)
    inputs, attrs, domain = [("x", x, False)], {"epsilon": 1e-5}, ""
    if op.startswith("Skip"):
        domain = MS
        inputs.append(("skip", _x(skip_shape or shape, dt, rng=rng), False))
    norm_shape = (d,) if op.startswith("Skip") else shape[axis % len(shape):]
    inputs.append(("scale", vec(1).reshape(norm_shape), const))
    if op in ("LayerNormalization", "SkipLayerNormalization"):
        inputs.append(("shift", (vec(2) - 1).reshape(norm_shape) if bias else None, const))
    if op.startswith("Skip"):
        inputs.append(("bias", vec(3) - 1 if bias else None, True))
    else:
        attrs["axis"] = axis
    n_out = {"LayerNormalization": 3, "SimplifiedLayerNormalization": 2}.get(op, 4)
    exact = op == "SkipSimplifiedLayerNormalization"
    return check(op, inputs, "norm_rows", domain=domain, threads=threads, n_out=n_out,
                 what=f"{op} {np.dtype(dt).name}{shape} axis={axis} threads={threads}", **_tol(dt, exact), **attrs)


OPS = ["LayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
       "SkipLayerNormalization"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_widths_around_the_lanes(capped_isa, op, dt):
    for d in [1, 2, 7, *around(16, 32), 100]:
        _case(op, (2, 3, d), dt)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_special_values_one_per_row(capped_isa, op, dt):
    _case(op, (1, 21, 40), dt, specials=True)


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_skip_rms_row_blocks(capped_isa, dt):
    """SkipSimplified sums the squares of 16 rows side by side (norm.cc's kSkipRmsBlock; in the lanes, a transposed
    16 x 16 tile at a time, on AVX-512): row counts around the block, widths around the tile and its tail, one special
    value per row, bit for bit."""
    for rows in [1, 2, 15, 16, 17, 31, 33]:
        for d in [1, 15, 16, 17, 33, 384]:
            _case("SkipSimplifiedLayerNormalization", (1, rows, d), dt, specials=True, seed=rows * 1000 + d)


@pytest.mark.parametrize("op", OPS)
def test_task_split_and_threads_same_bits(op):
    d = 100  # 163 rows per task
    for rows in around(TASK // d, 2 * (TASK // d)):
        _case(op, (1, rows, d), np.float32)
    big = (1, 1027, 1024)  # over kMinParallelWork (thread_pool.h): two threads really run
    a = _case(op, big, np.float32, threads=1, seed=7)
    b = _case(op, big, np.float32, threads=2, seed=7)
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.tobytes() == v.tobytes(), f"{op}: output {i} depends on the thread count"


@pytest.mark.skipif("avx512" not in host_isas(), reason="no AVX-512 on this host")
def test_float16_rms_rows_in_avx512_lanes_are_the_avx2_rows_bits():
    """norm.cc's AVX-512 float16 RMS rows (x widened and y rounded in the lanes, no scratch y row) give the bytes of
    the AVX2 copy's widen, compute and round passes: y and inv_std_var, widths around 16 and 32 lanes, one special
    value per row, the BLAS sdot and the kernel's own lanes, one thread and two."""
    from npu_ep.kernels import host_blas
    nat = runtime.native_module()
    for d in [1, 7, *around(16, 32), 100, 384]:
        x = _x((1, 2731 if d == 384 else 23, d), np.float16, specials=True)  # 2731 x 384: over kMinParallelWork
        scale = RNG.uniform(0.5, 1.5, d).astype(np.float32)
        for sdot in {host_blas.sdot_address() or 0, 0}:
            got = {}
            for isa in ("avx2", "avx512"):
                for threads in (1, 2):
                    for _ in cap_isa(isa):
                        y, _, inv, _ = nat.norm_rows(x, None, None, scale, None, 1, d, 1e-5, False, True, False, None,
                                                     threads, sdot)
                    got[isa, threads] = y.tobytes() + inv.tobytes()
            assert len(set(got.values())) == 1, f"d={d} sdot={sdot}: {sorted(k for k in got)} differ"


@pytest.mark.skipif("avx512" not in host_isas(), reason="no AVX-512 on this host")
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_layer_rows_in_avx512_blocks_are_the_avx2_rows_bits(dt):
    """norm.cc's AVX-512 LayerNormalization rows (four rows' lane sums side by side, x widened and y rounded in the
    lanes) give the bytes of the AVX2 copy's rows: y, mean and inv_std_var, row counts around the block of four,
    widths around 16 and 32 lanes and their tails, one special value per row, with and without a shift, one thread
    and two. The RMS rows of float16 (four rows a block, their BLAS dots or the kernel's lanes) likewise."""
    from npu_ep.kernels import host_blas
    nat = runtime.native_module()
    for rows, d in [(r, w) for r in (1, 2, 3, 4, 5, 7, 8, 9) for w in (1, 7, *around(16, 32), 100)] + [(2731, 384)]:
        x = _x((1, rows, d), dt, specials=True, rng=np.random.default_rng(rows * 1000 + d))
        scale = RNG.uniform(0.5, 1.5, d).astype(np.float32)
        shift = RNG.uniform(-0.5, 0.5, d).astype(np.float32)
        calls = [(0, shift, 0), (0, None, 0)]
        if dt == np.float16:
            calls += [(1, None, host_blas.sdot_address() or 0), (1, None, 0)]
        for kind, sh, sdot in calls:
            got = {}
            for isa in ("avx2", "avx512"):
                for threads in (1, 2):
                    for _ in cap_isa(isa):
                        y, mean, inv, _ = nat.norm_rows(x, None, None, scale, sh, kind, d, 1e-5, kind == 0, True,
                                                        False, None, threads, sdot)
                    got[isa, threads] = y.tobytes() + inv.tobytes() + (mean.tobytes() if kind == 0 else b"")
            assert len(set(got.values())) == 1, f"kind {kind} rows={rows} d={d} shift={sh is not None}: differ"


@pytest.mark.parametrize("op", ["LayerNormalization", "SimplifiedLayerNormalization"])
@pytest.mark.parametrize("axis", [0, 1, -2, 2, -3])
def test_any_axis(op, axis):
    _case(op, (3, 4, 5, 6), np.float32, axis=axis)
    _case(op, (3, 4, 5, 6), np.float16, axis=axis)


@pytest.mark.parametrize("op", OPS)
def test_runtime_parameters(op):
    _case(op, (2, 5, 48), np.float32, const=False)
    _case(op, (2, 5, 48), np.float16, const=False)


@pytest.mark.parametrize("op", ["SkipSimplifiedLayerNormalization", "SkipLayerNormalization"])
@pytest.mark.parametrize("skip_shape", [(5, 24), (1, 5, 24)])
def test_skip_repeating_over_the_batch_and_no_bias(op, skip_shape):
    _case(op, (3, 5, 24), np.float32, skip_shape=skip_shape)
    _case(op, (3, 5, 24), np.float16, skip_shape=skip_shape, bias=False)


def test_float16_statistics_output_stays_on_the_reference():
    """A statistics output typed float16 is not what norm_rows writes: the reference kernel answers."""
    x = _x((2, 4, 16), np.float16)
    got, want, calls = native_vs_reference("SimplifiedLayerNormalization",
                                           [("x", x, False), ("g", np.ones(16, np.float16), True)], n_out=2,
                                           epsilon=1e-5, stash_type=1)
    if got[1].dtype == np.float16:
        assert "norm_rows" not in calls
    np.testing.assert_allclose(got[1].astype(np.float32), want[1].astype(np.float32), rtol=2e-3)


def _session_model(op: str, dt, shape):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    d = shape[-1]
    inits = {"g": np.random.default_rng(5).uniform(0.5, 1.5, d).astype(dt),
             "b": np.random.default_rng(6).uniform(-0.5, 0.5, d).astype(dt)}
    ins, outs, opset, extra = ["x"], ["y"], 17, []
    stat = shape[:-1] + [1]
    out_info = [helper.make_tensor_value_info("y", elem, shape)]
    if op == "LayerNormalization":
        ins += ["g", "b"]
        outs += ["mean", "inv"]
        out_info += [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, stat) for n in ("mean", "inv")]
    elif op == "RMSNormalization":
        ins, opset = ["x", "g"], 23
    else:
        ins += ["skip", "g"] + (["b"] if op == "SkipLayerNormalization" else [])
        outs += ["mean", "inv", "sum"]  # every output: ep/step_binding binds no step with an omitted one
        out_info += [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, stat) for n in ("mean", "inv")]
        out_info.append(helper.make_tensor_value_info("sum", elem, shape))
        extra = [(MS, 1)]
    node = helper.make_node(op, ins, outs, name="the_op", domain=MS if extra else "", epsilon=1e-5)
    graph_in = [helper.make_tensor_value_info(n, elem, shape) for n in ins if n in ("x", "skip")]
    return make_model([node], graph_in, out_info, inits, opset=opset, extra_opsets=extra)


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization", "SkipSimplifiedLayerNormalization",
                                "SkipLayerNormalization"])
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op, dt):
    """The CPU EP's values within the sweep's tolerance (SkipSimplified float32: its bits), every output."""
    shape = [2, 16, 96]
    model = _session_model(op, dt, shape)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {n.name: _x(shape, dt) for n in model.graph.input}
    want = cpu_run(model, feeds)
    tol = _tol(dt, exact=op == "SkipSimplifiedLayerNormalization" and dt == np.float32)
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            if tol["exact"]:
                assert g.tobytes() == w.tobytes()
            else:
                np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=tol["rtol"],
                                           atol=tol["atol"])
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
