"""Test helper for the differential sweeps (issue 38): one node run through its kernel twice, on the native
kernels and on the numpy reference model (the specification), with a record of which native functions ran, so a
sweep whose native path silently declined (and compared the reference with itself) fails instead of passing.

Values are compared as the kernel contract says: ``exact`` (the same values, NaN where the reference has NaN; -0.0
and +0.0 are equal, as numpy's own maximum leaves their order unspecified) or within ``rtol``/``atol``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx

from _single_op import model as single_node_model
from npu_ep.ep import _native as extension
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target

REF = Target.load("npu-ref")


class _Recorder:
    """The native kernels module with every function call's name recorded."""

    def __init__(self, module, calls: list[str]):
        self._module, self._calls = module, calls

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        if not callable(value) or isinstance(value, type):
            return value
        calls = self._calls

        def recorded(*args, **kwargs):
            calls.append(name)
            return value(*args, **kwargs)
        return recorded


@contextmanager
def native_calls() -> Iterator[list[str]]:
    """The names of the native kernel functions called inside the block (``runtime.native`` returns a recorder)."""
    runtime.native_module()
    calls: list[str] = []
    saved = runtime._module[0]
    runtime._module[0] = _Recorder(saved, calls)
    try:
        yield calls
    finally:
        runtime._module[0] = saved


def node_model(op: str, inputs, domain: str = "", n_out: int = 1, **attrs) -> onnx.ModelProto:
    """One node (``_single_op.model``'s input specs) with its output types inferred by ONNX."""
    m = single_node_model(op, inputs, n_out=n_out, domain=domain, **attrs)
    return onnx.shape_inference.infer_shapes(m)


def run_kernel(m: onnx.ModelProto, feeds: dict[str, np.ndarray], kernels: str, threads: int = 1,
               bound: list | None = None) -> list[np.ndarray]:
    """The single node of ``m`` through its kernel on ``kernels`` ("native" or "reference"). With ``bound`` (a list),
    also the step the kernel binds for these inputs (what a session's C++ loop runs), run once on them: its
    outputs are appended to ``bound`` (nothing when the kernel binds no step here)."""
    (node,) = nodes_from_model(m)
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, REF)
    runtime.configure([p], kernels, threads)
    args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    with np.errstate(all="ignore"):  # IEEE results without warnings, as a session runs its kernels (ep/program.py)
        outs = list(k.run(p, args))
        if bound is not None and k.bind is not None:
            bound.extend(bound_step_outputs(k, p, args, outs))
    return outs


def bound_step_outputs(kernel, p, args: list, outs: list) -> list[np.ndarray]:
    """The outputs of the native step ``kernel.bind`` makes after a run (as a program's first call), run in a
    one-step loop on the same inputs; [] when it binds none or declines them."""
    step = kernel.bind(p, args, outs)
    if step is None:
        return []
    n_in = len(args)
    loop = extension.StepLoop([(kernel.run, p, tuple(range(n_in)), tuple((i, n_in + i) for i in range(len(outs))), (),
                             step)], n_in + len(outs), tuple(range(n_in, n_in + len(outs))), None)
    got = loop(tuple(args))
    return [np.asarray(g) for g in got] if loop.native_counts == (1, 0) else []


def native_vs_reference(op: str, inputs, *, domain: str = "", threads: int = 1, n_out: int = 1, **attrs):
    """(native outputs, reference outputs, native functions called) of one node; ``inputs`` as ``_single_op``. When
    the kernel binds a native step for these inputs, that step's outputs must be the kernel's native ones bit for
    bit (the session runs the step)."""
    m = node_model(op, inputs, domain=domain, n_out=n_out, **attrs)
    feeds = {s[0]: s[1] for s in inputs if s[1] is not None and not s[2]}
    bound: list = []
    with native_calls() as calls:
        got = run_kernel(m, feeds, "native", threads, bound)
    for i, (b, g) in enumerate(zip(bound, got)):
        assert b.shape == g.shape and b.dtype == g.dtype and b.tobytes() == g.tobytes(), \
            f"{op} {attrs}: the bound step's output {i} is not the kernel's"
    want = run_kernel(m, feeds, "reference")
    return got, want, calls


def kernel_and_bound_step(op: str, inputs, *, domain: str = "", n_out: int = 1, **attrs):
    """(the kernel's native outputs, its bound step's outputs: [] when it binds none) of one node for ``inputs``."""
    m = node_model(op, inputs, domain=domain, n_out=n_out, **attrs)
    feeds = {s[0]: s[1] for s in inputs if s[1] is not None and not s[2]}
    bound: list = []
    return run_kernel(m, feeds, "native", 1, bound), bound


def assert_matches(got, want, *, exact: bool = True, rtol: float = 0.0, atol: float = 0.0, what: str = "") -> None:
    """``got`` equals ``want`` (exact) or is within rtol/atol; NaN exactly where ``want`` has NaN, infinities equal."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs " \
                                                                f"{want.shape} {want.dtype}"
    if exact or want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def assert_native_ran(calls: list[str], name: str, what: str = "") -> None:
    assert name in calls, f"{what}: the native {name} did not run (called: {calls})"


def check(op: str, inputs, native_fn: str, *, exact: bool = True, rtol: float = 0.0, atol: float = 0.0,
          domain: str = "", threads: int = 1, n_out: int = 1, what: str = "", **attrs) -> list[np.ndarray]:
    """One sweep case: the native kernel ``native_fn`` ran and matches the reference; returns the native outputs."""
    got, want, calls = native_vs_reference(op, inputs, domain=domain, threads=threads, n_out=n_out, **attrs)
    label = what or f"{op} {attrs} {[np.shape(s[1]) for s in inputs]}"
    assert_native_ran(calls, native_fn, label)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_matches(g, w, exact=exact, rtol=rtol, atol=atol, what=f"{label} output {i}")
    return got


def around(*multiples: int, low: int = 1) -> list[int]:
    """Sizes just below, at and just above each multiple (a kernel's block boundaries), at least ``low``."""
    return sorted({v for m in multiples for v in (m - 1, m, m + 1) if v >= low})


def with_specials(x: np.ndarray, rng: np.random.Generator, values=(np.nan, np.inf, -np.inf, -0.0, 3.0e38, -3.0e38,
                                                                     1.0e-45, -1.0e-38), fraction: float = 0.05
                  ) -> np.ndarray:
    """A copy of float ``x`` with ``fraction`` of its elements (at least one of each value) set to special values."""
    y = np.array(x, copy=True)
    flat = y.reshape(-1)
    count = max(len(values), int(flat.size * fraction))
    where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    flat[where] = np.resize(np.asarray(values, y.dtype), where.size)
    return y



def ints_with_extremes(shape, dt, rng: np.random.Generator) -> np.ndarray:
    """Integers of ``dt`` over its whole range with the type's extremes planted (every 7th element its minimum, every
    11th from the 4th its maximum): saturating products, zero points at the ends."""
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max + 1, shape).astype(dt)
    x.reshape(-1)[::7] = info.min
    x.reshape(-1)[3::11] = info.max
    return x


def bit_values(shape, dt, rng: np.random.Generator) -> np.ndarray:
    """Values of any plain dtype for kernels that move or select bits without computing (movement, indexing,
    Where): bool at random, integers over their whole range, floats with NaN, +-Inf, -0, a subnormal and a large
    value among them, and for float32 a NaN with a payload (the kernel must copy it, not recompute it)."""
    dt = np.dtype(dt)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) > 0.5)
    if dt.kind == "f":
        x = np.asarray(rng.standard_normal(shape) * 10).astype(dt)
        if x.size:
            tiny = 6.0e-8 if dt == np.float16 else 1.0e-45
            x = with_specials(x, rng, values=(np.nan, np.inf, -np.inf, -0.0, 6.0e4, tiny))
            if dt == np.float32:
                x.reshape(-1)[-1] = np.array([0x7FC12345], np.uint32).view(np.float32)[0]
        return x
    info = np.iinfo(dt)
    return np.asarray(rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True))


def assert_session_runs_natively(sess, model: onnx.ModelProto, feeds: dict[str, np.ndarray], *,
                                 bits: bool = False) -> None:
    """Three calls of ``sess`` (the kernel's run, then the bound step) give the CPU EP's values (with ``bits``: its
    bytes, NaN payloads and -0 included, for kernels that only move values), and no step ran its Python kernel (the
    session must be tagged: ``ep.sessions.tag_session_options``)."""
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import cpu_run

    want = cpu_run(model, feeds)[0]
    for _ in range(3):
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        if bits:
            assert got.tobytes() == want.tobytes(), "the bound step's bytes differ from the CPU EP's"
        else:
            np.testing.assert_array_equal(got, want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
