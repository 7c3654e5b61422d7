"""Element-wise tails folded into the float Conv that feeds them: ``Conv -> Mul(s) -> Add(b) -> x * clip(x + 3, 0,
6) / 6 -> Mul(s) -> Add(b)`` (PP-LCNetV3's learnable affine blocks around a hard-swish) runs as one step whose tail
is applied in place to the conv's output, chunk by chunk while it is in cache (``kernels/ops/conv.py``,
``kernels/native/conv_tail.cc``), instead of a numpy step with a fresh feature map per op.

The tail is a list of instructions over one float32 register ``v`` (the conv output) and one saved copy ``s``:
``mul/add/sub/div c`` (``v op c``), ``rsub/rdiv c`` (``c op v``), ``clip lo hi`` (Clip, Relu; Max/Min with a
constant are ``clip c inf``/``clip -inf c``; HardSigmoid is ``mul alpha``, ``add beta``, ``clip 0 1``, as its
kernel computes it), ``sigmoid``, ``erf`` (``float_math.erf_f32``), ``leaky_relu alpha`` (LeakyRelu, PRelu of one
slope; a PRelu of one slope per output channel, the face detectors' and MobileFaceNets' activation, is a
``leaky_relu`` whose constant the kernels take per channel: one such operand per tail), ``save`` (s = v) and
``mul_saved``/``add_saved`` (v = s op v); HardSwish is ``save``, HardSigmoid's three,
``mul_saved``; Gelu (ONNX, com.microsoft; exact or tanh), FastGelu without a bias and Pow by 3 or 0.5 are the
element-wise engine's instruction lists (``kernels/ops/elementwise.py``; ``tanh`` is ``float_math.tanh_f32``).
Each is the float32 operation the absorbed node performs, in the graph's order, so the fused step returns exactly
what the unfused steps return (Max/Min: but for the sign of a zero that ties the constant, as np.clip, not
np.maximum, keeps it); the native sigmoid's exp is within 2 ulp of numpy's. SiLU
(``x * sigmoid(x)``, YOLOv5/v8's activation) is the diamond ``save, sigmoid, mul_saved``; the exporters' exact GELU
``x * (erf(x / sqrt 2) + 1) * 0.5`` is the diamond ``save, div, erf, add, mul_saved`` and a ``mul``.

Rules: a float32 Conv; each absorbed link reads the previous value and a scalar float32 constant (Clip bounds
constant, lo <= hi; a PRelu's slope may be one constant per output channel); every intermediate is read only inside
the chain and is not a graph output. A value read by two nodes continues only as a diamond: one reader starts a
chain of such links that ends in the other reader, a Mul or Add of the value and the chain's result
(``x * clip(x + 3, 0, 6)``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import why_not
from ..target import Target
from ..tail_program import CUBE, GELU_ERF, GELU_TANH, POW_HALF
from ._graph import consumers_of, float_scalar
from ._rules import FusionMiss

_SCALAR_OPS = {"Mul": ("mul", "mul"), "Add": ("add", "add"), "Sub": ("sub", "rsub"), "Div": ("div", "rdiv")}


def channel_slopes(v: ValueInfo, channels: tuple[int, int]) -> np.ndarray | None:
    """A constant float32 PRelu slope with one value per output channel of a conv output (``channels``: its M and
    rank): aligned to the output's last axes, every axis but the channel axis is 1 ([M, 1, 1], [1, M, 1, 1]); flat,
    else None."""
    m, rank = channels
    if v.missing or v.value is None:
        return None
    a = np.asarray(v.value)
    if a.dtype != np.float32 or a.ndim > rank or (1,) * (rank - a.ndim) + a.shape != (1, m) + (1,) * (rank - 2):
        return None
    return a.reshape(-1)


def _engine_link(nd: NodeInfo, x: str, channels: tuple[int, int] | None = None) -> list[tuple] | None:
    """The instructions of an op reading ``x`` whose float32 kernel is the element-wise engine's instruction list
    (Gelu, FastGelu, Pow by 3 or 0.5, LeakyRelu, PRelu of one slope: ``elementwise.ENGINE_KEY`` as their prepare sets
    it), or None. After a conv (``channels``: its M and output rank), a PRelu of one slope per output channel is a
    ``leaky_relu`` whose constant is per channel: its instruction carries the slopes as a fourth item."""
    if nd.op_type == "Gelu" and nd.inputs[0].name == x:
        approximate = str(nd.attr("approximate", "none"))
        return list(GELU_ERF) if approximate == "none" else list(GELU_TANH) if approximate == "tanh" else None
    if nd.op_type == "FastGelu" and nd.domain == "com.microsoft" and nd.inputs[0].name == x and nd.input(1) is None:
        return list(GELU_TANH)
    if nd.domain != "":
        return None
    if nd.op_type == "Pow" and len(nd.inputs) == 2 and nd.inputs[0].name == x and nd.inputs[1].name != x:
        exponent = float_scalar(nd.inputs[1])
        return list(CUBE) if exponent == 3.0 else list(POW_HALF) if exponent == 0.5 else None
    if nd.op_type == "LeakyRelu" and nd.inputs[0].name == x:
        return [("leaky_relu", float(np.float32(nd.attr("alpha", 0.01))), 0.0)]
    if nd.op_type == "PRelu" and nd.inputs[0].name == x and nd.inputs[1].name != x:
        slope = float_scalar(nd.inputs[1])
        if slope is not None:
            return [("leaky_relu", slope, 0.0)]
        slopes = None if channels is None else channel_slopes(nd.inputs[1], channels)
        return None if slopes is None else [("leaky_relu", 0.0, 0.0, slopes)]
    return None


def _link(nd: NodeInfo, x: str, channels: tuple[int, int] | None = None) -> list[tuple] | None:
    """The instruction(s) of a node reading ``x`` and only scalar constants otherwise (after a conv with
    ``channels``, also a per-channel PRelu slope), or None."""
    if len(nd.outputs) != 1 or nd.outputs[0].dtype != np.float32:
        return None
    if nd.domain == "com.microsoft" or nd.op_type in ("Gelu", "Pow", "LeakyRelu", "PRelu"):
        return _engine_link(nd, x, channels)
    if nd.domain != "":
        return None
    if nd.op_type in ("Max", "Min") and len(nd.inputs) == 2:
        other = [v for v in nd.inputs if v.name != x]
        c = float_scalar(other[0]) if len(other) == 1 else None
        if c is None or c != c:  # a NaN constant: Max/Min give NaN, a clip would not
            return None
        return [("clip", c, float("inf")) if nd.op_type == "Max" else ("clip", float("-inf"), c)]
    if nd.op_type == "Erf" and nd.inputs[0].name == x:
        return [("erf", 0.0, 0.0)]
    if nd.op_type in _SCALAR_OPS and len(nd.inputs) == 2:
        a, b = nd.inputs
        if a.name == x and b.name != x and (c := float_scalar(b)) is not None:
            return [(_SCALAR_OPS[nd.op_type][0], c, 0.0)]
        if b.name == x and a.name != x and (c := float_scalar(a)) is not None:
            return [(_SCALAR_OPS[nd.op_type][1], c, 0.0)]
        return None
    if nd.op_type == "Relu" and nd.inputs[0].name == x:
        return [("clip", 0.0, float("inf"))]
    if nd.op_type == "Sigmoid" and nd.inputs[0].name == x:
        return [("sigmoid", 0.0, 0.0)]
    if nd.op_type == "HardSwish" and nd.inputs[0].name == x:  # x * HardSigmoid(x) with alpha 1/6, beta 0.5
        return [("save", 0.0, 0.0), ("mul", float(np.float32(1.0 / 6.0)), 0.0), ("add", 0.5, 0.0),
                ("clip", 0.0, 1.0), ("mul_saved", 0.0, 0.0)]
    if nd.op_type == "HardSigmoid" and nd.inputs[0].name == x:  # x * alpha, + beta, clip to [0, 1]: as its kernel
        alpha, beta = (float(np.float32(nd.attr(k, d))) for k, d in (("alpha", 0.2), ("beta", 0.5)))
        return [("mul", alpha, 0.0), ("add", beta, 0.0), ("clip", 0.0, 1.0)]
    if nd.op_type == "Clip" and nd.inputs[0].name == x:
        if nd.attr("min") is not None or nd.attr("max") is not None:  # opset < 11
            lo, hi = nd.attr("min", float(np.finfo(np.float32).min)), nd.attr("max", float(np.finfo(np.float32).max))
            lo, hi = float(np.float32(lo)), float(np.float32(hi))
        else:
            bounds = [nd.input(i) for i in (1, 2)]
            vals = [None if v is None or v.missing else float_scalar(v) for v in bounds]
            if any(v is not None and not v.missing and c is None for v, c in zip(bounds, vals)):
                return None
            lo = vals[0] if vals[0] is not None else float(np.finfo(np.float32).min)
            hi = vals[1] if vals[1] is not None else float(np.finfo(np.float32).max)
        return [("clip", lo, hi)] if lo <= hi else None
    return None


# the links a conv's tail takes, as a miss names them
_LINKS = ("of a scalar constant (Mul, Add, Sub, Div, Clip, Relu, Max, Min, Sigmoid, HardSigmoid, HardSwish, Erf, "
          "LeakyRelu, one-slope PRelu, Gelu, Pow by 3 or 0.5)")


class _Walker:
    """Walks links and diamonds after a value; ``link`` gives a node's instructions (the standalone chain pass,
    fusion/eltwise_chain.py, passes one that also knows the engine's unary ops)."""

    def __init__(self, nodes: list[NodeInfo], users: dict[str, list[int]], taken: set[int], link=None,
                 group: str = "conv's tail", links: str = _LINKS):
        self.nodes, self.users, self.taken = nodes, users, taken
        self.group, self.links = group, links  # how a miss names the fused group and the links it takes
        self.channels: tuple[int, int] | None = None  # the conv's M and output rank (per-channel PRelu slopes)
        self.link = link or (lambda nd, x: _link(nd, x, self.channels))

    def readers(self, v: ValueInfo) -> list[int] | None:
        """The nodes reading an intermediate, or None when it cannot be absorbed: a graph output, a node reading it
        twice, or a reader already absorbed into another tail."""
        r = self.users.get(v.name, [])
        if v.is_graph_output or len(set(r)) != len(r) or any(i in self.taken for i in r):
            return None
        return r

    def step(self, v: ValueInfo) -> tuple[list, list[int], ValueInfo] | None:
        """(instructions, absorbed node indices, new value) for one link or diamond after ``v``, or None."""
        r = self.readers(v)
        if r is None:
            return None
        if len(r) == 1:
            ins = self.link(self.nodes[r[0]], v.name)
            return (ins, r, self.nodes[r[0]].outputs[0]) if ins else None
        if len(r) == 2:
            for start, join in ((r[0], r[1]), (r[1], r[0])):
                got = self._diamond(v, start, join)
                if got is not None:
                    return got
        return None

    def why_stuck(self, v: ValueInfo) -> str:
        """Why ``step(v)`` found no link (built only for a declined candidate)."""
        r = self.users.get(v.name, [])
        if v.is_graph_output:
            return f"its output '{v.name}' is a graph output"
        if len(set(r)) != len(r):
            return f"a node reads its output '{v.name}' twice"
        if any(i in self.taken for i in r):
            return f"a reader of its output '{v.name}' is already in another {self.group}"
        if len(r) == 1:
            nd = self.nodes[r[0]]
            if nd.op_type == "PRelu" and nd.domain == "" and self.channels is not None and len(nd.inputs) == 2:
                slope = nd.inputs[1]
                return (f"its output '{v.name}' is read by PRelu '{nd.name}' whose slope {list(slope.shape or [])} is "
                        f"neither one value nor one per output channel ([{self.channels[0]}, 1, ...] aligned to the "
                        f"conv's rank-{self.channels[1]} output), or not a float32 constant")
            return f"its output '{v.name}' is read by {nd.op_type} '{nd.name}', not a float32 link {self.links}"
        if len(r) == 2:
            names = " and ".join(f"{self.nodes[i].op_type} '{self.nodes[i].name}'" for i in r)
            return f"its output '{v.name}' is read by {names}, which form no x * f(x) or x + f(x) diamond"
        return f"its output '{v.name}' has {len(r)} readers, not one (or two in a diamond)"

    def _diamond(self, v: ValueInfo, start: int, join: int):
        j = self.nodes[join]
        if j.domain != "" or j.op_type not in ("Mul", "Add") or len(j.inputs) != 2 or j.outputs[0].dtype != np.float32:
            return None
        other = [u for u in j.inputs if u.name != v.name]
        if len(other) != 1:
            return None
        ins, absorbed, cur, i = [("save", 0.0, 0.0)], [], v, start
        while True:
            link = self.link(self.nodes[i], cur.name)
            if not link or any(t[0] == "save" for t in link):  # one saved copy: a HardSwish inside a diamond
                return None
            ins += link
            absorbed.append(i)
            cur = self.nodes[i].outputs[0]
            r = self.readers(cur)
            if r is None or len(r) != 1:
                return None
            if r[0] == join:
                break
            i = r[0]
        if cur.name != other[0].name:
            return None
        ins.append(("mul_saved" if j.op_type == "Mul" else "add_saved", 0.0, 0.0))
        return ins, [*absorbed, join], j.outputs[0]


def _tail_attrs(tail: list[tuple]) -> dict:
    """The fused conv's tail attributes: ``conv_tail`` [[code, a, b], ...], and for an instruction carrying
    per-channel slopes, its index (``conv_tail_channel_at``) and the slopes (``conv_tail_channel_slopes``)."""
    attrs: dict = {"conv_tail": [list(t[:3]) for t in tail]}
    for k, t in enumerate(tail):
        if len(t) > 3:
            attrs.update(conv_tail_channel_at=k, conv_tail_channel_slopes=[float(v) for v in t[3]])
    return attrs


def fuse_conv_tails(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None
                    ) -> list[NodeInfo]:
    """Return the node list with element-wise tails folded into the float Convs that feed them; each float Conv
    that keeps no tail goes to ``misses`` with the reason."""
    users = consumers_of(nodes)
    taken: set[int] = set()
    replace: dict[int, NodeInfo] = {}
    walker = _Walker(nodes, users, taken)
    for i, conv in enumerate(nodes):
        x = conv.input(0)
        if conv.key != ("", "Conv") or x is None or x.dtype != np.float32 or "conv_tail" in conv.attrs:
            continue
        w = conv.input(1)
        walker.channels = (int(w.shape[0]), len(w.shape)) if w is not None and w.shape else None
        tail, absorbed, cur = [], [], conv.outputs[0]
        while (got := walker.step(cur)) is not None:
            ins, idx, nxt = got
            if sum(len(t) > 3 for t in tail + ins) > 1:  # the kernels take one per-channel operand
                break
            tail += ins
            absorbed += idx
            taken.update(idx)
            cur = nxt
        if not tail:
            if misses is not None:
                misses.append(FusionMiss("conv_tail", conv.name, conv.op_type, walker.why_stuck(conv.outputs[0])))
            continue
        fused = dataclasses.replace(conv, name=f"{conv.name}+tail", outputs=(cur,),
                                    attrs={**conv.attrs, **_tail_attrs(tail),
                                           "fused_nodes": [conv.name, *(nodes[j].name for j in absorbed)]})
        if (why := why_not(fused, target)) is not None:
            taken.difference_update(absorbed)
            if misses is not None:
                misses.append(FusionMiss("conv_tail", conv.name, conv.op_type, f"the target rejects {why}"))
            continue
        replace[i] = fused
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in taken]
