"""com.microsoft DynamicQuantizeLSTM: an LSTM whose two products run on the int8 matrix unit.

What ORT's dynamic quantizer writes for an LSTM (ddddocr's older recognizer has one, bidirectional, hidden 512).
Numerics as ORT's CPU kernel (``rnn_helpers.cc``, ``ComputeGemm`` for 8-bit weights):
- W ``[dirs, input, 4H]`` and R ``[dirs, H, 4H]`` are int8 or uint8 with one zero point per direction (ORT
  requires that, and 0 for int8) and a scale per direction or per column; they stay packed (``matmul_int.pack_b``).
- Each product quantizes its float operand to uint8 on the fly, as DynamicQuantizeLinear does
  (``dynamic_quantize.dynamic_params``): once for X over the first ``max(sequence_lens)`` steps of every batch
  entry, then once per step for the batch's previous h. The int32 sums are exact and become
  ``float32(acc) * (a_scale * w_scale)``; the step's product is added to X's, then the peepholes, then Wb + Rb.
- A finished sequence's row enters the next step's h as 0 when Y is an output (ORT reads h from Y there), else
  as its last h. With more than one batch entry ORT's CPU EP quantizes each thread's rows on their own (its result
  depends on its thread count); this kernel quantizes the whole batch, as ORT does on one thread.
The gate math is the float LSTM's (``recurrent.lstm_direction``; ORT's MLAS sigmoid/tanh are approximations).

Run: the native kernel (``kernels/native/recurrent.cc``, ``qlstm``: QuantizeTensor + Int8MatMul per product),
or with ``kernels=reference`` the numpy model below (exact integer products): the same bits. ``bind`` makes the
native call the step.
Cost: the float LSTM's, with int8 MACs, int8 weight bytes and the two quantization passes on the vector unit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import check_fits, exact_int_matmul, quantize_float
from ..runtime import call_step, native, threads
from ._util import arg
from .dynamic_quantize import dynamic_params
from .matmul_int import centered_b, pack_b
from .recurrent import check_gates, checked_lens, initial_state, lstm_direction, recurrent_cost, stacked_outputs

_F32 = np.dtype(np.float32)
_WEIGHTS = ((1, 8, 9, "W"), (2, 10, 11, "R"))  # (weights, scale, zero point) input indices and name


def _const(node: NodeInfo, i: int) -> np.ndarray | None:
    v = node.input(i)
    return None if v is None or v.missing or not v.is_constant else np.asarray(v.value)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    x = node.input(0)
    if x is None or x.dtype != _F32:
        return f"{op}: DynamicQuantizeLSTM needs float32 X"
    hid = int(node.attr("hidden_size", 0))
    for wi, si, zi, name in _WEIGHTS:
        w, scale, zp = node.input(wi), _const(node, si), _const(node, zi)  # W's bytes arrive at compile time
        if w is None or not w.is_constant or scale is None or zp is None:
            return f"{op}: {name}, its scale and its zero point must be constant initializers (packed at compile time)"
        if w.dtype not in (np.int8, np.uint8) or not w.static or len(w.shape) != 3 or w.shape[2] != 4 * hid:
            return f"{op}: {name} {w.describe()} must be int8/uint8 [dirs, K, 4*hidden_size={4 * hid}]"
        cols = (w.shape[0],) if scale.ndim == 1 else (w.shape[0], 4 * hid)
        if scale.shape != cols or zp.shape != cols:
            return (f"{op}: {name}'s scale {list(scale.shape)} and zero point {list(zp.shape)} must both be "
                    f"[dirs] or [dirs, 4*hidden_size]")
        flat = zp.reshape(w.shape[0], -1)
        if (flat != flat[:, :1]).any() or (w.dtype == np.int8 and flat.any()):
            return f"{op}: {name}'s zero point must be one value per direction (0 for int8), as ORT requires"
        why = check_fits(1, 4 * hid, w.shape[1], "uint8", w.dtype.name, target)
        if why:
            return f"{op}: {why}"
    return check_gates(node, "LSTM")


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    hid = int(node.attr("hidden_size", 0))
    consts: dict[str, np.ndarray] = {}
    for wi, si, zi, name in _WEIGHTS:
        w, scale, zp = _const(node, wi), _const(node, si), _const(node, zi)
        for d in range(w.shape[0]):
            z = np.asarray(zp[d]).reshape(-1)[:1].astype(np.int32)
            for key, value in pack_b(w[d], z).items():
                consts[f"{name}{d}_{key}"] = value
            consts[f"{name}{d}_scale"] = np.ascontiguousarray(np.asarray(scale[d], np.float32).reshape(-1))
    for i in (3, 7):  # B and P when constant
        v = _const(node, i)
        if v is not None:
            consts[f"in{i}"] = np.ascontiguousarray(v, np.float32)
    direction = str(node.attr("direction", "forward"))
    attrs: dict[str, Any] = {"op": "DynamicQuantizeLSTM", "hidden": hid, "direction": direction, "layout": 0,
                             "clip": None if node.attr("clip") is None else float(node.attr("clip")),
                             "dirs": 2 if direction == "bidirectional" else 1,
                             "k": {"W": int(node.input(1).shape[1]), "R": hid},
                             "zero_finished": bool(node.outputs and not node.outputs[0].missing)}
    return Prepared(attrs, consts, target)


def _centered(p: Prepared, name: str, d: int) -> tuple[np.ndarray, int]:
    """The reference model's float32 ``W - zp`` [K, 4H] of one direction, from the packed constants (kernel_cache)."""
    key = ("centered", name, d)
    got = p.kernel_cache.get(key)
    if got is None:
        got = p.kernel_cache[key] = centered_b(p.consts[f"{name}{d}_i8_bp"], p.consts[f"{name}{d}_i8_bzp"],
                                       p.attrs["k"][name], 4 * p.attrs["hidden"])
    return got


def _product(p: Prepared, a: np.ndarray, name: str, d: int) -> np.ndarray:
    """``a`` [M, K] quantized to uint8 as DynamicQuantizeLinear does, times the direction's 8-bit weights."""
    wc, bound = _centered(p, name, d)
    scale, zp = dynamic_params(a)
    q = quantize_float(a, scale, zp, "uint8").astype(np.float32) - zp
    acc = exact_int_matmul(q, wc, 255, bound, int(p.target.tile[2]) if p.target is not None else 64)
    return acc.astype(np.float32) * (scale * p.consts[f"{name}{d}_scale"])


def _inputs(p: Prepared, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                          np.ndarray | None]:
    """X [seq, batch, I], sequence lengths, h0, c0 [dirs, batch, H], B and P (float32, or None)."""
    a = p.attrs
    x = arg(p, inputs, 0)
    seq, batch = x.shape[0], x.shape[1]
    lens = checked_lens(arg(p, inputs, 4), "DynamicQuantizeLSTM", seq, batch)
    h0 = initial_state(arg(p, inputs, 5), a["dirs"], batch, a["hidden"], 0)
    c0 = initial_state(arg(p, inputs, 6), a["dirs"], batch, a["hidden"], 0)
    b, peep = arg(p, inputs, 3), arg(p, inputs, 7)
    return (np.ascontiguousarray(x, _F32), lens, h0, c0, None if b is None else np.asarray(b, _F32),
            None if peep is None else np.asarray(peep, _F32))


def _reference(p: Prepared, inputs) -> list[np.ndarray]:
    """The numpy reference model (the specification of the native kernel)."""
    a = p.attrs
    hid = a["hidden"]
    x, lens, h0, c0, b, peep = _inputs(p, inputs)
    seq, batch = x.shape[0], x.shape[1]
    steps = int(lens.max()) if batch else 0
    ys, hs, cs = [], [], []
    for d in range(a["dirs"]):
        xw = np.zeros((seq, batch, 4 * hid), _F32)
        if steps:
            xw[:steps] = _product(p, x[:steps].reshape(steps * batch, -1), "W", d).reshape(steps, batch, -1)
        bias = np.zeros(4 * hid, _F32) if b is None else b[d, :4 * hid] + b[d, 4 * hid:]
        y, h, c = lstm_direction(xw, lambda hp, d=d: _product(p, hp, "R", d), None if peep is None else peep[d],
                                 h0[d], c0[d], lens, a["direction"] == "reverse" or d == 1, a["clip"], bias,
                                 a["zero_finished"])
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return stacked_outputs(ys, hs, cs, lens, 0)


def _native_weights(p: Prepared, b: np.ndarray | None) -> tuple[list, list, np.ndarray]:
    """Per direction (bp, bsum, bzp, scale) of W and of R, and Wb + Rb [dirs, 4H]; made once when B is constant."""
    found = p.kernel_cache.get("qlstm_weights")
    if found is not None:
        return found
    a = p.attrs
    hid = a["hidden"]
    packs = [[tuple(p.consts[f"{name}{d}_{k}"] for k in ("i8_bp", "i8_bsum", "i8_bzp", "scale"))
              for d in range(a["dirs"])] for name in ("W", "R")]
    bias = (np.zeros((a["dirs"], 4 * hid), _F32) if b is None
            else np.ascontiguousarray(b[:, :4 * hid] + b[:, 4 * hid:]))
    found = (packs[0], packs[1], bias)
    if b is None or "in3" in p.consts:
        p.kernel_cache["qlstm_weights"] = found
    return found


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    mod = native(p)
    if mod is None or not hasattr(mod, "qlstm"):
        return _reference(p, inputs)
    a = p.attrs
    x, lens, h0, c0, b, peep = _inputs(p, inputs)
    w, r, bias = _native_weights(p, b)
    y, yh, yc = mod.qlstm(x, w, r, bias, None if peep is None else np.ascontiguousarray(peep), np.ascontiguousarray(h0),
                          np.ascontiguousarray(c0), lens, a["direction"] == "reverse", a["clip"], a["zero_finished"],
                          threads(p))
    return [y, yh, yc]


def _bind(p: Prepared, inputs, outs):
    """The whole op as one ``qlstm`` step, as ``_run`` calls it: the packed weights and a constant B and P bound in,
    omitted sequence_lens / initial states as arrays made for this shape, and X, sequence_lens (int32) and the
    initial states put in per call (float32 / int32, C order: others decline, and the kernel runs)."""
    mod = native(p)
    weights = p.kernel_cache.get("qlstm_weights")
    x = inputs[0] if inputs else None
    if mod is None or not hasattr(mod, "qlstm") or weights is None or not isinstance(x, np.ndarray):
        return None
    if any(i < len(inputs) and inputs[i] is not None for i in (3, 7)):
        return None  # a runtime B or P: the kernel reads it per call
    live = []
    for i, at in ((0, 0), (4, 7), (5, 5), (6, 6)):  # X, sequence_lens, initial h and c: qlstm's arguments
        v = inputs[i] if i < len(inputs) else None
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or v.dtype != (np.int32 if i == 4 else _F32) or not v.flags.c_contiguous:
            return None
        live.append((at, i, v.dtype, v.shape, None))
    a = p.attrs
    _, lens, h0, c0, _, peep = _inputs(p, inputs)
    w, r, bias = weights
    args = [None, w, r, bias, None if peep is None else np.ascontiguousarray(peep), np.ascontiguousarray(h0),
            np.ascontiguousarray(c0), lens, a["direction"] == "reverse", a["clip"], a["zero_finished"], threads(p)]
    for at, *_ in live:
        args[at] = None  # put in per call
    return call_step(p, mod.qlstm, tuple(args), live, [(i, list(o.shape)) for i, o in enumerate(outs)])


def _cost(p: Prepared, shapes) -> OpCost:
    return recurrent_cost(p, shapes, gates=4, mode="int8", weight_bytes=1, quantize_passes=2)


register(KernelDef("com.microsoft", "DynamicQuantizeLSTM", _prepare, _run, _cost, _check, rank_free=True,
                   bind=_bind))
