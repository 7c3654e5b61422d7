"""Recurrent ops: LSTM, GRU and RNN (opset 7/14): forward, reverse or bidirectional, optional bias, initial states,
peepholes (LSTM) and ``sequence_lens``, ``clip``, ``layout`` 0/1, ``linear_before_reset`` (GRU).

Only the default activations (LSTM: Sigmoid, Tanh, Tanh; GRU: Sigmoid, Tanh; RNN: Tanh) and LSTM ``input_forget=0``
are taken; other values are declined with a reason. Float32 only (ORT's CPU kernels are float/double). The native
kernels (``kernels/native/recurrent.cc``) run all three with one time loop, every direction and layout in one call,
bound as the step (``_bind``); the functions here are their specification.

Numerics as ORT's CPU kernels: the input projection ``X @ W^T + Wb + Rb`` is one matmul over all time steps, then
each step adds ``H @ R^T``; ``clip`` bounds every gate's pre-activation to [-clip, clip]. With ``sequence_lens``,
batch entry b runs its first L_b steps (the reverse direction runs steps L_b-1 .. 0); Y is 0 past L_b and Y_h/Y_c
are the states after the last valid step (zeros for an empty sequence, as ORT).

Cost: the input projection on the matrix unit, then per time step one [batch, H] x [H, gates*H] matmul padded to
native tiles (the recurrence serializes the steps) and the gate math on the vector unit; weights are read once
when they fit half the SRAM, else R is re-read every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cost import dma_cycles
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import memo_per_shape
from ..target import Target
from ..runtime import call_step, native, threads
from ._util import arg, stash_constants
from ._vector import transcendental

_F32 = np.dtype(np.float32)
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DIRECTIONS = ("forward", "reverse", "bidirectional")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow warnings (exp's argument clamped at 88, where fp32 saturates anyway)."""
    return 1.0 / (1.0 + np.exp(np.minimum(-x, np.float32(88.0))))


def _clip(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, np.float32(-clip), np.float32(clip))


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs: dict[str, Any] = {"op": node.op_type, "hidden": int(node.attr("hidden_size", 0)),
                             "direction": str(node.attr("direction", "forward")),
                             "layout": int(node.attr("layout", 0)),
                             "clip": None if node.attr("clip") is None else float(node.attr("clip")),
                             "linear_before_reset": int(node.attr("linear_before_reset", 0))}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    x = node.input(0)
    if x is None or x.dtype != _F32:
        return f"{op}: {node.op_type} needs float32 input (ORT's CPU kernels are float/double)"
    if not target.matrix.get("float_compute", {}).get("float32"):
        return (f"{op}: {node.op_type}'s gate matmuls are float32 and target {target.name} has no float matrix mode "
                "(float_compute)")
    return check_gates(node)


def check_gates(node: NodeInfo, op_type: str | None = None) -> str | None:
    """The attributes and inputs every recurrent kernel here shares (``op_type``: the gates' op, LSTM for
    DynamicQuantizeLSTM); None when they are taken."""
    op, op_type = node.describe(), op_type or node.op_type
    acts = node.attr("activations")
    if acts is None and "activations" in node.attrs:  # present, but the plugin graph view does not read STRINGS
        return f"{op}: activations attribute present but unreadable through ORT's graph view (may not be the defaults)"
    if acts is not None:
        names = [a.decode() if isinstance(a, bytes) else str(a) for a in acts]
        want = _DEFAULT_ACTS[op_type]
        n_dirs = 2 if str(node.attr("direction", "forward")) == "bidirectional" else 1
        if op_type == "RNN" and n_dirs == 1 and len(names) == 2:
            names = names[:1]  # the schema's default is two entries (ORT writes it into every RNN); ORT reads the first
        if [n.lower() for n in names] != [w.lower() for w in want * n_dirs]:
            return f"{op}: activations {names} (only the defaults {want} per direction)"
    if node.attr("activation_alpha") is not None or node.attr("activation_beta") is not None:
        return f"{op}: activation_alpha/activation_beta given (only the default activations)"
    if op_type == "LSTM" and int(node.attr("input_forget", 0)) != 0:
        return f"{op}: input_forget={node.attr('input_forget')} (coupled input/forget gates) not supported"
    if str(node.attr("direction", "forward")) not in _DIRECTIONS:
        return f"{op}: direction {node.attr('direction')!r} unknown"
    if int(node.attr("layout", 0)) not in (0, 1):
        return f"{op}: layout {node.attr('layout')} unknown"
    if int(node.attr("hidden_size", 0)) <= 0:
        return f"{op}: hidden_size attribute missing"
    lens = node.input(4)
    if lens is not None and lens.dtype != np.dtype(np.int32):
        return f"{op}: sequence_lens must be int32"
    return None


def _steps(lens: np.ndarray, seq: int, reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per step s and batch b: the time index processed and whether it is valid (s < L_b)."""
    s = np.arange(seq)[:, None]
    valid = s < lens[None, :]
    t = (lens[None, :] - 1 - s) if reverse else np.broadcast_to(s, valid.shape)
    return np.where(valid, t, 0), valid


def lstm_direction(xw: np.ndarray, recur: Callable[[np.ndarray], np.ndarray], p: np.ndarray | None, h: np.ndarray,
                   c: np.ndarray, lens: np.ndarray, reverse: bool, clip: float | None, bias: np.ndarray | None = None,
                   zero_finished: bool = False):
    """One direction (gate order i, o, f, c). ``xw`` [seq, batch, 4H] = X @ W^T, plus Wb + Rb unless ``bias`` is
    given; ``recur(h)`` is the step's [batch, 4H] product with R. DynamicQuantizeLSTM passes ``bias`` (added after
    the product and the peepholes, ORT's order there) and ``zero_finished``: ORT's quantized kernel reads the
    previous h from Y, where a finished sequence's row is 0, and that row enters the step's quantization range."""
    seq, batch, _ = xw.shape
    hid = h.shape[-1]
    y = np.zeros((seq, batch, hid), _F32)
    pi, po, pf = (p[:hid], p[hid:2 * hid], p[2 * hid:]) if p is not None else (None, None, None)
    t_idx, valid = _steps(lens, seq, reverse)
    cols = np.arange(batch)
    for s in range(seq):
        ok = valid[s][:, None]
        h_in = np.where((s - 1 < lens)[:, None], h, np.float32(0)) if zero_finished and s else h
        g = xw[t_idx[s], cols] + recur(h_in)
        gi, go, gf, gc = g[:, :hid], g[:, hid:2 * hid], g[:, 2 * hid:3 * hid], g[:, 3 * hid:]
        if pi is not None:
            gi, gf = gi + pi * c, gf + pf * c
        if bias is not None:
            gi, gf, gc = gi + bias[:hid], gf + bias[2 * hid:3 * hid], gc + bias[3 * hid:]
        i, f = _sigmoid(_clip(gi, clip)), _sigmoid(_clip(gf, clip))
        c_new = f * c + i * np.tanh(_clip(gc, clip))
        if po is not None:
            go = go + po * c_new
        if bias is not None:
            go = go + bias[hid:2 * hid]
        h_new = _sigmoid(_clip(go, clip)) * np.tanh(c_new)
        c, h = np.where(ok, c_new, c), np.where(ok, h_new, h)
        y[t_idx[s], cols] = np.where(ok, h_new, y[t_idx[s], cols])
    return y, h, c


def _gru_direction(xw: np.ndarray, r: np.ndarray, rb: np.ndarray, h: np.ndarray, lens: np.ndarray, reverse: bool,
                   clip: float | None, linear_before_reset: bool):
    """One direction. ``xw`` [seq, batch, 3H] = X @ W^T + Wb, plus Rb for z and r (gate order z, r, h)."""
    seq, batch, _ = xw.shape
    hid = h.shape[-1]
    y = np.zeros((seq, batch, hid), _F32)
    rzr = np.ascontiguousarray(r[:2 * hid].T)
    rh = np.ascontiguousarray(r[2 * hid:].T)
    rbh = rb[2 * hid:]
    t_idx, valid = _steps(lens, seq, reverse)
    cols = np.arange(batch)
    for s in range(seq):
        ok = valid[s][:, None]
        x = xw[t_idx[s], cols]
        zr = x[:, :2 * hid] + h @ rzr
        z, rr = _sigmoid(_clip(zr[:, :hid], clip)), _sigmoid(_clip(zr[:, hid:], clip))
        if linear_before_reset:
            gh = x[:, 2 * hid:] + rr * (h @ rh + rbh)
        else:
            gh = x[:, 2 * hid:] + (rr * h) @ rh + rbh
        h_new = (1.0 - z) * np.tanh(_clip(gh, clip)) + z * h
        h = np.where(ok, h_new, h)
        y[t_idx[s], cols] = np.where(ok, h_new, y[t_idx[s], cols])
    return y, h


def _rnn_direction(xw: np.ndarray, r: np.ndarray, h: np.ndarray, lens: np.ndarray, reverse: bool,
                   clip: float | None):
    """One direction (Tanh). ``xw`` [seq, batch, H] = X @ W^T + Wb + Rb."""
    seq, batch, _ = xw.shape
    y = np.zeros((seq, batch, h.shape[-1]), _F32)
    rt = np.ascontiguousarray(r.T)
    t_idx, valid = _steps(lens, seq, reverse)
    cols = np.arange(batch)
    for s in range(seq):
        ok = valid[s][:, None]
        h_new = np.tanh(_clip(xw[t_idx[s], cols] + h @ rt, clip))
        h = np.where(ok, h_new, h)
        y[t_idx[s], cols] = np.where(ok, h_new, y[t_idx[s], cols])
    return y, h


def initial_state(v: np.ndarray | None, dirs: int, batch: int, hid: int, layout: int) -> np.ndarray:
    """An initial state as [dirs, batch, H] float32 (zeros when omitted)."""
    if v is None:
        return np.zeros((dirs, batch, hid), _F32)
    return np.asarray(v.transpose(1, 0, 2) if layout else v, _F32)


def _f32(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v, _F32)


def _packed(mod, m: np.ndarray) -> np.ndarray:
    """``m`` [n, k] transposed and packed for the native products (``pack_sgemm_b``)."""
    return mod.pack_sgemm_b(_f32(m.T))


def _lstm_weights(mod, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, peep: np.ndarray | None,
                  hid: int) -> tuple:
    """``mod.lstm``'s weights: per direction W^T and R^T packed, Wb + Rb, the peepholes."""
    dirs = w.shape[0]
    bias = np.zeros((dirs, 4 * hid), _F32) if b is None else b[:, :4 * hid] + b[:, 4 * hid:]
    return ([_packed(mod, w[d]) for d in range(dirs)], [_packed(mod, r[d]) for d in range(dirs)], _f32(bias),
            None if peep is None else _f32(peep))


def _gru_weights(mod, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, hid: int) -> tuple:
    """``mod.gru``'s weights: per direction W^T, R_zr^T and R_h^T packed, the input product's bias (Wb + Rb for z
    and r, Wb for h: the reference's) and Rb for h."""
    dirs = w.shape[0]
    b = np.zeros((dirs, 6 * hid), _F32) if b is None else b
    wb, rb = b[:, :3 * hid], b[:, 3 * hid:]
    bias = np.concatenate([wb[:, :2 * hid] + rb[:, :2 * hid], wb[:, 2 * hid:]], axis=1)
    return ([_packed(mod, w[d]) for d in range(dirs)], [_packed(mod, r[d, :2 * hid]) for d in range(dirs)],
            [_packed(mod, r[d, 2 * hid:]) for d in range(dirs)], _f32(bias), _f32(rb[:, 2 * hid:]))


def _rnn_weights(mod, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, hid: int) -> tuple:
    """``mod.rnn``'s weights: per direction W^T and R^T packed, Wb + Rb."""
    dirs = w.shape[0]
    bias = np.zeros((dirs, hid), _F32) if b is None else b[:, :hid] + b[:, hid:]
    return [_packed(mod, w[d]) for d in range(dirs)], [_packed(mod, r[d]) for d in range(dirs)], _f32(bias)


def _native_weights(mod, p: Prepared, inputs) -> tuple:
    """The op's weights as its native kernel takes them; made once per Prepared when they are constants (the usual
    case), else per call."""
    found = p.kernel_cache.get("native_weights")
    if found is not None:
        return found
    op, hid = p.attrs["op"], p.attrs["hidden"]
    w, r, b = (arg(p, inputs, i) for i in (1, 2, 3))
    if op == "LSTM":
        found = _lstm_weights(mod, w, r, b, arg(p, inputs, 7), hid)
    else:
        found = (_gru_weights if op == "GRU" else _rnn_weights)(mod, w, r, b, hid)
    used = (1, 2, 3, 7) if op == "LSTM" else (1, 2, 3)
    if all(f"in{i}" in p.consts or arg(p, inputs, i) is None for i in used):
        p.kernel_cache["native_weights"] = found
    return found


def _full_lens(batch: int, seq: int) -> np.ndarray:
    return np.full(batch, seq, np.int64)


def _zero_state(dirs: int, batch: int, hid: int, layout: int) -> np.ndarray:
    return np.zeros((batch, dirs, hid) if layout else (dirs, batch, hid), _F32)


def _native_args(mod, p: Prepared, inputs) -> tuple[Callable, list]:
    """The native kernel of the op (``kernels/native/recurrent.cc``: every direction, and layout 1, in one call)
    and its arguments for these inputs: omitted sequence_lens / initial states as the same arrays for every call of
    a shape (every sequence full, zeros)."""
    a = p.attrs
    op, hid, layout = a["op"], a["hidden"], a["layout"]
    x = arg(p, inputs, 0)
    seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    weights = _native_weights(mod, p, inputs)
    dirs = len(weights[0])
    lens = arg(p, inputs, 4)
    lens = memo_per_shape(p, "full_lens", (batch, seq), _full_lens, batch, seq) if lens is None else lens
    zeros = memo_per_shape(p, "zero_state", (batch, layout), _zero_state, dirs, batch, hid, layout)
    h0, c0 = (zeros if v is None else _f32(v) for v in (arg(p, inputs, 5), arg(p, inputs, 6)))
    reverse = a["direction"] == "reverse"
    if op == "LSTM":
        wt, rt, bias, peep = weights
        return mod.lstm, [_f32(x), wt, rt, bias, peep, h0, c0, lens, reverse, a["clip"], threads(p), layout]
    if op == "GRU":
        wt, rzt, rht, bias, rbh = weights
        return mod.gru, [_f32(x), wt, rzt, rht, bias, rbh, h0, lens, reverse, a["clip"], bool(a["linear_before_reset"]),
                         threads(p), layout]
    wt, rt, bias = weights
    return mod.rnn, [_f32(x), wt, rt, bias, h0, lens, reverse, a["clip"], threads(p), layout]


# where each runtime input goes among the native kernel's arguments: (input index, argument index)
_ARG_OF_INPUT = {"LSTM": ((0, 0), (4, 7), (5, 5), (6, 6)), "GRU": ((0, 0), (4, 7), (5, 6)),
                 "RNN": ((0, 0), (4, 5), (5, 4))}


def _native_run(mod, p: Prepared, inputs) -> list[np.ndarray]:
    fn, args = _native_args(mod, p, inputs)
    return list(fn(*args))


def _bind(p: Prepared, inputs, outs):
    """The whole op as one native step (``_native_args``' call), constant weights packed once: X, sequence_lens and
    the initial states put in per call when they come at run time (float32 / int32, C order: others decline, and
    the kernel runs)."""
    mod = native(p)
    op = p.attrs["op"]
    if mod is None or not hasattr(mod, op.lower()) or p.kernel_cache.get("native_weights") is None:
        return None  # runtime weights: packed per call by the kernel
    live = []
    for i, at in _ARG_OF_INPUT[op]:
        v = inputs[i] if i < len(inputs) else None
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or v.dtype != (np.int32 if i == 4 else _F32) or not v.flags.c_contiguous:
            return None
        live.append((at, i, v.dtype, v.shape, None))
    if not live or live[0][1] != 0:
        return None
    _, args = _native_args(mod, p, inputs)
    for at, *_ in live:
        args[at] = None  # put in per call
    fn = getattr(mod, op.lower())
    # layout 0 writes the partition's results into ORT's buffers (the out_* arguments after layout)
    where = p.runtime.partition_outputs or {}
    into = [] if p.attrs["layout"] else [(len(args) + k, where[k], list(o.shape))
                                          for k, o in enumerate(outs) if k in where]
    args += [None] * len(outs)
    return call_step(p, fn, tuple(args), live, [(i, list(o.shape)) for i, o in enumerate(outs)], None, into)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    mod = native(p)
    if mod is not None and hasattr(mod, p.attrs["op"].lower()):
        return _native_run(mod, p, inputs)
    return _reference(p, inputs)


def _reference(p: Prepared, inputs) -> list[np.ndarray]:
    """The numpy reference model (the specification of the native kernel)."""
    a = p.attrs
    op, hid, layout, clip = a["op"], a["hidden"], a["layout"], a["clip"]
    x = arg(p, inputs, 0)
    w, r, b = arg(p, inputs, 1), arg(p, inputs, 2), arg(p, inputs, 3)
    xs = x.transpose(1, 0, 2) if layout else x  # [seq, batch, input]
    seq, batch = xs.shape[0], xs.shape[1]
    dirs = w.shape[0]
    gates = _GATES[op]
    lens = checked_lens(arg(p, inputs, 4), op, seq, batch)
    h0 = initial_state(arg(p, inputs, 5), dirs, batch, hid, layout)
    c0 = initial_state(arg(p, inputs, 6), dirs, batch, hid, layout) if op == "LSTM" else None
    peep = arg(p, inputs, 7) if op == "LSTM" else None
    bias = np.zeros((dirs, 2 * gates * hid), _F32) if b is None else b.astype(_F32, copy=False)
    flat = xs.reshape(seq * batch, xs.shape[2]).astype(_F32, copy=False)  # no -1: seq or batch may be 0
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = a["direction"] == "reverse" or d == 1
        wb, rb = bias[d, :gates * hid], bias[d, gates * hid:]
        if op == "LSTM":
            xw = (flat @ w[d].T + (wb + rb)).reshape(seq, batch, gates * hid)
            rt = np.ascontiguousarray(r[d].T)
            y, h, c = lstm_direction(xw, lambda hp: hp @ rt,  # noqa: B023 - called in this iteration only
                                     None if peep is None else peep[d], h0[d], c0[d], lens,
                                     reverse, clip)
            cs.append(c)
        elif op == "GRU":
            zr_bias = np.concatenate([wb[:2 * hid] + rb[:2 * hid], wb[2 * hid:]])
            xw = (flat @ w[d].T + zr_bias).reshape(seq, batch, gates * hid)
            y, h = _gru_direction(xw, r[d], rb, h0[d], lens, reverse, clip, bool(a["linear_before_reset"]))
        else:
            xw = (flat @ w[d].T + (wb + rb)).reshape(seq, batch, hid)
            y, h = _rnn_direction(xw, r[d], h0[d], lens, reverse, clip)
        ys.append(y)
        hs.append(h)
    return stacked_outputs(ys, hs, cs if op == "LSTM" else None, lens, layout)


def checked_lens(lens_in: np.ndarray | None, op: str, seq: int, batch: int) -> np.ndarray:
    """``sequence_lens`` as int64 (every sequence full when omitted); a clear error for values ORT rejects."""
    lens = np.full(batch, seq, np.int64) if lens_in is None else lens_in.astype(np.int64)
    if lens.shape != (batch,) or (batch and (lens.min() < 0 or lens.max() > seq)):
        raise ValueError(f"{op}: sequence_lens {lens.tolist()} must be {batch} values in [0, {seq}]")
    return lens


def stacked_outputs(ys: list, hs: list, cs: list | None, lens: np.ndarray, layout: int) -> list[np.ndarray]:
    """Y [seq, dirs, batch, H] and the final states [dirs, batch, H] from the directions' results (``layout`` 1:
    batch first); ORT zeroes the final states of an empty sequence (its initial states ignored)."""
    y = np.stack(ys, axis=1)
    states = [np.stack(hs)] + ([np.stack(cs)] if cs is not None else [])
    if lens.size and lens.min() == 0:
        states = [np.where((lens == 0)[None, :, None], np.float32(0), st) for st in states]
    if layout:
        y = y.transpose(2, 0, 1, 3)
        states = [s.transpose(1, 0, 2) for s in states]
    return [np.ascontiguousarray(y)] + [np.ascontiguousarray(s) for s in states]


def recurrent_cost(p: Prepared, shapes, gates: int, mode: str = "float32", weight_bytes: int = 4,
                   quantize_passes: int = 0) -> OpCost:
    """The input projection on the matrix unit in ``mode``, then per time step one [batch, H] x [H, gates*H]
    product padded to native tiles and the gate math (plus ``quantize_passes`` over each product's operand) on the
    vector unit; weights are read once when they fit half the SRAM, else R is re-read every step."""
    t = p.target
    a = p.attrs
    hid = a["hidden"]
    x = shapes[0]
    seq, batch = (x[1], x[0]) if a["layout"] else (x[0], x[1])
    n_in = x[2]
    dirs = 2 if a["direction"] == "bidirectional" else 1
    tm, tn, tk = t.tile
    rate = t.mac_rate(mode) if t.has_mode(mode) else 1.0
    native = lambda m, n, k: math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk) * tm * tn * tk
    matrix = dirs * (native(seq * batch, gates * hid, n_in) + seq * native(batch, gates * hid, hid)) / rate
    lanes = int(t.vector["lanes"])
    vector = dirs * seq * math.ceil(batch * gates * hid / lanes) * (4.0 + 2.0 * transcendental(t))
    vector += dirs * quantize_passes * (math.ceil(seq * batch * n_in / lanes) + seq * math.ceil(batch * hid / lanes))
    w_bytes = dirs * gates * hid * ((n_in + hid) * weight_bytes + 8)  # + Wb and Rb in float32
    io_bytes = (seq * batch * n_in + seq * dirs * batch * hid + 3 * dirs * batch * hid) * 4
    r_bytes = gates * hid * hid * weight_bytes
    resident = w_bytes <= t.sram_bytes // 2
    moved = w_bytes + io_bytes + (0 if resident else dirs * (seq - 1) * r_bytes)
    dma = dma_cycles(t, moved, transfers=2 + (0 if resident else dirs * seq))
    macs = dirs * seq * batch * gates * hid * (n_in + hid)
    cycles = matrix + vector + dma  # the recurrence serializes the steps: no overlap is assumed
    return OpCost(compute_cycles=matrix + vector, dma_cycles=dma, cycles=cycles, dma_bytes=moved,
                  sram_peak=min(w_bytes, t.sram_bytes // 2), macs=macs,
                  utilization=macs / (cycles * rate) if cycles else 0.0, unit="matrix")


def _cost(p: Prepared, shapes) -> OpCost:
    return recurrent_cost(p, shapes, _GATES[p.attrs["op"]])


# rank_free: the schema fixes every rank (X 3, states 3, Y 4) and the kernel reads the sizes from the arrays; ORT's
# inference loses X's rank behind exporters' Unsqueeze of a runtime-shaped tensor (Silero VAD)
register(KernelDef("", "LSTM", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
register(KernelDef("", "GRU", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
register(KernelDef("", "RNN", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
