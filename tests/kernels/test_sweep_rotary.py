"""Differential sweep of com.microsoft RotaryEmbedding on the native kernels (issue 40): ``rotary_embedding``
(kernels/native/rotary.cc) against the reference model (kernels/ops/rotary.py), bit for bit: float32 and float16
(computed in float32, rounded once), half and interleaved pairs, 4-D [B, N, S, H] and 3-D [B, S, N*H] inputs,
partial rotary (rotary_embedding_dim below the head), position ids per token or one offset, head sizes around the
vector lanes, rows across the task split on one and two threads, special values (NaN, +-Inf, -0.0, huge,
denormal) in x, every ISA the row is compiled for. Positions outside the cache are an IndexError on both paths.
The bound step is checked against the kernel by ``_sweep``. Sessions show NpuEP ran the node as its bound native
step (no Python step) with the CPU EP's values within rtol = atol = 1e-6 (float32) and 1e-3 (float16): ORT's MLAS
rotary may fuse the multiply-add, and its float16 path rounds differently."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import check, native_vs_reference, with_specials
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4063)
MS = "com.microsoft"


@pytest.fixture(params=host_isas(top="avx512"))
def row_isa(request):
    yield from cap_isa(request.param)


def _case(dt, x_shape, half, max_pos, pos, specials=False):
    x = RNG.standard_normal(x_shape).astype(dt)
    if specials:
        x = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 6.0e4, 1.0e-7) if dt == np.float16 else
                          (np.nan, np.inf, -np.inf, -0.0, 3.0e38, 1.0e-45))
    cos = RNG.standard_normal((max_pos, half)).astype(dt)
    sin = RNG.standard_normal((max_pos, half)).astype(dt)
    return [("x", x, False), ("pos", pos, False), ("cos", cos, True), ("sin", sin, True)]


def _rotary(inputs, threads=1, **attrs):
    return check("RotaryEmbedding", inputs, "rotary_embedding", domain=MS, threads=threads, **attrs)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_layouts_heads_and_positions_bit_exact(row_isa, dt, interleaved):
    for h in (2, 8, 30, 32, 34, 64, 128):
        b, n, s = 2, 3, 5
        ids = RNG.integers(0, 40, (b, s)).astype(np.int64)
        _rotary(_case(dt, (b, n, s, h), h // 2, 40, ids, specials=h == 64), interleaved=interleaved)
        _rotary(_case(dt, (b, s, n * h), h // 2, 40, np.array([7], np.int64)), interleaved=interleaved,
                num_heads=n)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_partial_rotary_and_a_wider_cache(dt):
    b, s, n, h = 1, 6, 4, 64
    ids = np.arange(s, dtype=np.int64)[None, :]
    for rdim in (16, 32, 62):
        _rotary(_case(dt, (b, s, n * h), 40, 20, ids), num_heads=n, rotary_embedding_dim=rdim, interleaved=rdim % 4)
    _rotary(_case(dt, (b, n, s, h), 16, 20, ids))  # 4-D: the cache's width sets the rotated channels


def test_task_split_same_bytes_on_two_threads():
    inputs = _case(np.float32, (1, 8, 300, 64), 32, 400, np.arange(300, dtype=np.int64)[None, :])
    one, two = _rotary(inputs, threads=1), _rotary(inputs, threads=2)
    assert one[0].tobytes() == two[0].tobytes()


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_rows_across_tasks_every_layout(row_isa, dt):
    """Tasks of 256 rows (64 channels) starting inside a batch and a head/token run (the row counters' carries),
    4-D and 3-D, ids per token and one offset, partial rotary with specials, on one and two threads."""
    b, n, s, h = 2, 5, 70, 64
    ids = RNG.integers(0, 90, (b, s)).astype(np.int64)
    for threads in (1, 2):
        for interleaved in (0, 1):
            _rotary(_case(dt, (b, n, s, h), 24, 90, ids, specials=True), threads=threads, interleaved=interleaved)
            _rotary(_case(dt, (b, s, n * h), 24, 90, np.array([3], np.int64), specials=True), threads=threads,
                    interleaved=interleaved, num_heads=n, rotary_embedding_dim=2 * 21)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_writes_into_a_given_buffer(row_isa, dt):
    """out (ORT's buffer when the node's result is a partition output) is written and returned as it is, with the
    bits of a new array; a buffer of another dtype or size is refused."""
    nat = runtime.native_module()
    b, n, s, h, half = 1, 3, 9, 48, 20
    x = RNG.standard_normal((b, s, n * h)).astype(dt)
    pos = np.arange(s, dtype=np.int64)[None, :]
    cos, sin = (RNG.standard_normal((16, half)).astype(dt) for _ in range(2))
    want = nat.rotary_embedding(x, pos, cos, sin, n, h, half, True)
    out = np.full(x.shape, 7, dt)
    got = nat.rotary_embedding(x, pos, cos, sin, n, h, half, True, 1, out)
    assert got is out and out.tobytes() == want.tobytes()
    for bad in (np.zeros(x.shape, np.float64 if dt == np.float32 else np.float32), np.zeros(x.size - 1, dt)):
        with pytest.raises(ValueError, match="out must be a writeable C-order"):
            nat.rotary_embedding(x, pos, cos, sin, n, h, half, True, 1, bad)


def test_positions_of_other_layouts_are_converted_as_before():
    """C-order int64 position ids are read as they are; strided ones, int32 ones and a list are converted to the
    same ids; a value that is no array of integers is a TypeError."""
    nat = runtime.native_module()
    b, n, s, h, half = 2, 2, 5, 16, 8
    x = RNG.standard_normal((b, n, s, h)).astype(np.float32)
    pos = RNG.integers(0, 12, (b, s)).astype(np.int64)
    cos, sin = (RNG.standard_normal((12, half)).astype(np.float32) for _ in range(2))
    want = nat.rotary_embedding(x, pos, cos, sin, n, h, half, False)
    wide = np.zeros((b, 2 * s), np.int64)
    wide[:, ::2] = pos
    for other in (wide[:, ::2], pos.astype(np.int32), pos.tolist()):
        assert nat.rotary_embedding(x, other, cos, sin, n, h, half, False).tobytes() == want.tobytes()
    with pytest.raises(TypeError):
        nat.rotary_embedding(x, "positions", cos, sin, n, h, half, False)


def test_positions_outside_the_cache_are_an_index_error():
    inputs = _case(np.float32, (1, 2, 3, 8), 4, 4, np.array([[1, 2, 4]], np.int64))
    with pytest.raises(IndexError, match=r"position ids outside the cos/sin cache \[0, 4\)"):
        native_vs_reference("RotaryEmbedding", inputs, domain=MS)


@pytest.mark.parametrize("dt,elem,tol", [(np.float32, TensorProto.FLOAT, 1e-6),
                                         (np.float16, TensorProto.FLOAT16, 1e-3)])
def test_session_runs_the_bound_step_with_cpu_ep_values(dt, elem, tol):
    b, n, s, h = 1, 4, 32, 64
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="the_op", domain=MS)
    consts = {"cos": RNG.standard_normal((64, h // 2)).astype(dt),
              "sin": RNG.standard_normal((64, h // 2)).astype(dt)}
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [b, n, s, h]),
                                helper.make_tensor_value_info("pos", TensorProto.INT64, [b, s])],
                       [helper.make_tensor_value_info("y", elem, [b, n, s, h])], consts, opset=17,
                       extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": RNG.standard_normal((b, n, s, h)).astype(dt), "pos": np.arange(s, dtype=np.int64)[None, :] + 3}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


def _rotate_reference(x, pos, cos, sin, **attrs):
    """The reference model on a C-order copy of ``x``: what the kernel must give for x in any layout."""
    inputs = [("x", np.ascontiguousarray(x), False), ("pos", pos, False), ("cos", cos, True), ("sin", sin, True)]
    _, (want,), _ = native_vs_reference("RotaryEmbedding", inputs, domain=MS, **attrs)
    return want


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_strided_x_is_read_in_place_with_the_reference_bits(row_isa, dt):
    """x as a column slice of a fused QKV product (a prefill's query and key: rows at the product's pitch), as a
    [B, S, N, H] array transposed to [B, N, S, H], and with channels at a stride of 2 (copied first): the bits of
    the reference on a C-order copy."""
    b, s, n, h, half = 2, 7, 4, 16, 4
    pos = RNG.integers(0, 30, (b, s)).astype(np.int64)
    cos, sin = (RNG.standard_normal((30, half)).astype(dt) for _ in range(2))
    qkv = RNG.standard_normal((b, s, 3 * n * h)).astype(dt)
    attrs = dict(num_heads=n, rotary_embedding_dim=2 * half, interleaved=1)
    geometry = (n, h, half, True)
    for x in (qkv[..., n * h: 2 * n * h], qkv[..., ::3][..., : n * h]):
        assert not x.flags.c_contiguous
        got = runtime.native_module().rotary_embedding(x, pos, cos, sin, *geometry)
        assert got.tobytes() == _rotate_reference(x, pos, cos, sin, **attrs).tobytes()
    x4 = qkv[..., : n * h].reshape(b, s, n, h).transpose(0, 2, 1, 3)
    got = runtime.native_module().rotary_embedding(x4, pos, cos, sin, n, h, half, False)
    assert got.tobytes() == _rotate_reference(x4, pos, cos, sin).tobytes()
