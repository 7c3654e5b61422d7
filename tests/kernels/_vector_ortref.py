"""Shared harness for the vector/normalization/movement/LLM kernel tests (no tests of its own).

One single-node ONNX model drives both sides: ORT's CPU EP gives the reference, and the NPU kernel is driven the
way the EP compiler drives it: ``nodes_from_model`` -> ``check`` -> ``prepare`` -> (attrs JSON round trip, as a
loaded context binary would) -> ``run`` with ``None`` for constants/omitted inputs -> ``cost``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from npu_ep.dtypes import onnx_elem_type
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.registry import OpCost, Prepared, kernel_for
from npu_ep.kernels.target import Target

# Per-dtype float tolerances (rtol, atol) used by every comparison unless a test states its own.
TOL = {np.dtype(np.float32): (1e-5, 1e-5), np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float64): (1e-10, 1e-12)}

Input = tuple[str, np.ndarray, bool] | None  # (name, value, is_constant) or None for an omitted optional input


def make_model(op: str, inputs: Sequence[Input], outputs: Sequence[tuple], attrs: Mapping[str, Any] | None = None,
               *, domain: str = "", opset: int = 21) -> onnx.ModelProto:
    """A one-node model; constant inputs become initializers, outputs are ``(name, numpy dtype[, shape])``
    (a shape only where ONNX shape inference cannot know it, e.g. contrib ops)."""
    g_inputs, inits, names = [], [], []
    for spec in inputs:
        if spec is None:
            names.append("")
            continue
        name, value, const = spec
        names.append(name)
        if const:
            inits.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            g_inputs.append(helper.make_tensor_value_info(name, onnx_elem_type(value.dtype), list(value.shape)))
    while names and names[-1] == "":
        names.pop()
    outs = [helper.make_tensor_value_info(o[0], onnx_elem_type(np.dtype(o[1])), o[2] if len(o) > 2 else None)
            for o in outputs if o[0]]
    node = helper.make_node(op, names, [o[0] for o in outputs], domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "single_op", g_inputs, outs, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def feeds_of(inputs: Sequence[Input]) -> dict[str, np.ndarray]:
    return {s[0]: s[1] for s in inputs if s is not None and not s[2]}


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def run_npu(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], target: str = "npu-ref"
            ) -> tuple[list[np.ndarray], Prepared, OpCost]:
    """Drive the registered kernel like the EP does; returns (outputs, prepared, cost for these shapes)."""
    tgt = Target.load(target)
    node = nodes_from_model(model)[0]
    kernel = kernel_for(node.domain, node.op_type)
    assert kernel is not None, f"no kernel for {node.key}"
    reason = kernel.check(node, tgt)
    assert reason is None, reason
    prepared = kernel.prepare(node, tgt)
    loaded = Prepared(json.loads(json.dumps(prepared.attrs)), dict(prepared.consts), tgt)
    for v in loaded.consts.values():
        assert isinstance(v, np.ndarray)
    runtime = []
    for v in node.inputs:
        arr = feeds.get(v.name) if not v.missing else None
        if arr is not None:
            arr = arr.view()
            arr.flags.writeable = False  # kernels must never write into their inputs
        runtime.append(arr)
    outs = [np.asarray(o) for o in kernel.run(loaded, runtime)]
    shapes = [None if v.missing else (feeds[v.name].shape if v.name in feeds else tuple(v.value.shape))
              for v in node.inputs]
    cost = kernel.cost(loaded, shapes)
    assert cost.cycles >= 0 and cost.dma_bytes >= 0
    return outs, loaded, cost


def assert_close(got: np.ndarray, want: np.ndarray, tol: tuple[float, float] | None = None, what: str = "") -> None:
    assert got.shape == want.shape, f"{what} shape {got.shape} != ORT {want.shape}"
    assert got.dtype == want.dtype, f"{what} dtype {got.dtype} != ORT {want.dtype}"
    if np.issubdtype(want.dtype, np.floating):
        rtol, atol = tol or TOL[want.dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_against_ort(op: str, inputs: Sequence[Input], outputs: Sequence[tuple[str, Any]],
                      attrs: Mapping[str, Any] | None = None, *, domain: str = "", opset: int = 21,
                      tol: tuple[float, float] | None = None, target: str = "npu-ref", skip_outputs: Sequence[int] = ()
                      ) -> tuple[list[np.ndarray], OpCost]:
    """Build, run on ORT CPU and on the kernel, compare every output (except ``skip_outputs``)."""
    model = make_model(op, inputs, outputs, attrs, domain=domain, opset=opset)
    feeds = feeds_of(inputs)
    want = run_ort(model, feeds)
    got, _, cost = run_npu(model, feeds, target)
    present = [i for i, o in enumerate(outputs) if o[0]]
    assert len(got) >= len(outputs), f"{op}: {len(got)} outputs for {len(outputs)} declared"
    got = [got[i] for i in present]
    for i, (g, w) in zip(present, zip(got, want)):
        if i not in skip_outputs:
            assert_close(g, w, tol, f"{op} output {i}")
    return got, cost


def rand(shape: Sequence[int], dtype: Any = np.float32, seed: int = 0, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, int(lo) * 10), min(info.max, int(hi) * 10) + 1, size=shape).astype(dt)
    return rng.uniform(lo, hi, size=shape).astype(dt)


def rotary_cache(half: int, dtype: Any = np.float32, max_pos: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [max_pos, half] of the usual 10000-based rotary frequencies."""
    ang = np.arange(max_pos)[:, None] / (10000 ** (np.arange(half) / half))[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def gqa_inputs(b, s, n, nkv, h, past=None, seqlens=None, total=None, packed=False, rotary=None, dtype=np.float32,
               seed=0, rotary_dim=None, position_ids=None, runtime_caches=False, max_pos=1024, **attrs
               ) -> tuple[list, dict[str, Any]]:
    """(inputs, attributes) of one com.microsoft GroupQueryAttention node: ``past`` is the past buffer length P
    (None: no past inputs); seqlens_k default to a full past (P + S - 1), total to max(seqlens) + 1; ``rotary``
    ("half"/"interleaved") adds cos/sin caches, ``rotary_dim`` < h narrows them (partial rotary), ``position_ids``
    [B, S] is the optional input 9; ``runtime_caches`` feeds cos/sin as graph inputs instead of initializers."""
    seqlens = [s - 1 + (past or 0)] * b if seqlens is None else seqlens
    total = max(seqlens) + 1 if total is None else total
    if packed:
        inputs = [("q", rand((b, s, (n + 2 * nkv) * h), dtype, seed), False), None, None]
    else:
        inputs = [("q", rand((b, s, n * h), dtype, seed), False), ("k", rand((b, s, nkv * h), dtype, seed + 1), False),
                  ("v", rand((b, s, nkv * h), dtype, seed + 2), False)]
    if past is not None:
        inputs += [("pk", rand((b, nkv, past, h), dtype, seed + 3), False),
                   ("pv", rand((b, nkv, past, h), dtype, seed + 4), False)]
    else:
        inputs += [None, None]
    inputs += [("seqlens_k", np.array(seqlens, np.int32), False), ("total", np.array(total, np.int32), False)]
    a = {"num_heads": n, "kv_num_heads": nkv, **attrs}
    if rotary is not None:
        cos, sin = rotary_cache((rotary_dim or h) // 2, dtype, max_pos)
        inputs += [("cos", cos, not runtime_caches), ("sin", sin, not runtime_caches)]
        a.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
        if position_ids is not None:
            inputs += [("position_ids", np.asarray(position_ids, np.int64).reshape(b, s), False)]
    return inputs, a
