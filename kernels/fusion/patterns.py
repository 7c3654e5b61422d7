"""onnxscript pattern pieces shared by the in-partition fusions (``kernels/fusion``) and the offline rewriter
(``rewriter/``): one spelling of each op chain, so a family is matched in one idiom whichever side rewrites it.

Each function takes the pattern builder ``op`` and the pattern variables, and names the intermediate values a check
reads (``_outputs``), as onnxscript's ``RewriteRuleClassBase.pattern`` methods do.
"""

from __future__ import annotations

from typing import Any


def rotate_half(op: Any, x: Any) -> Any:
    """Hugging Face's ``rotate_half(x)``: ``Concat(Neg(x[..., h/2:]), x[..., :h/2])``; binds ``hi``, ``lo`` (the two
    Slices' outputs) and ``rotated`` (the Concat's)."""
    hi = op.Slice(x, _allow_other_inputs=True, _outputs=["hi"])
    lo = op.Slice(x, _allow_other_inputs=True, _outputs=["lo"])
    return op.Concat(op.Neg(hi, _outputs=["neg"]), lo, _outputs=["rotated"])


def rotary(op: Any, x: Any, cos: Any, sin: Any, rotated: Any) -> Any:
    """The rotary embedding as exporters write it: ``x * cos + rotated * sin``; binds ``x_cos`` and ``rot_sin``."""
    return op.Add(op.Mul(x, cos, _outputs=["x_cos"]), op.Mul(rotated, sin, _outputs=["rot_sin"]))


ANY_AXES = "any"  # rms_root: ReduceMean's axes as an attribute or as a second input, whichever the graph has
RMS_FORMS = ("div", "div_one", "reciprocal")  # x / root, x * Div(1, root), x * Reciprocal(root)


def rms_root(op: Any, x: Any, two: Any, eps: Any, axes: Any = ANY_AXES) -> Any:
    """``Sqrt(ReduceMean(Pow(x, two)) + eps)``, an RMS norm's denominator; binds ``mean`` and ``root``. ``axes``: a
    pattern variable for ReduceMean's axes input, None for axes as an attribute (one input), or ``ANY_AXES``."""
    square = op.Pow(x, two)
    if axes is ANY_AXES:
        mean = op.ReduceMean(square, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["mean"])
    elif axes is None:
        mean = op.ReduceMean(square, _allow_other_attributes=True, _outputs=["mean"])
    else:
        mean = op.ReduceMean(square, axes, _allow_other_attributes=True, _outputs=["mean"])
    return op.Sqrt(op.Add(mean, eps), _outputs=["root"])


def rms_norm(op: Any, x: Any, two: Any, eps: Any, gamma: Any, form: str, one: Any = None,
             axes: Any = ANY_AXES) -> Any:
    """``gamma * normalized`` where ``normalized`` is x divided by ``rms_root`` in one of ``RMS_FORMS`` (``one``: the
    constant of ``div_one``); binds ``scaled`` (the normalized x) and, but for ``div``, ``inv`` (1 / root)."""
    root = rms_root(op, x, two, eps, axes)
    if form == "div":
        scaled = op.Div(x, root, _outputs=["scaled"])
    else:
        inv = op.Div(one, root, _outputs=["inv"]) if form == "div_one" else op.Reciprocal(root, _outputs=["inv"])
        scaled = op.Mul(x, inv, _outputs=["scaled"])
    return op.Mul(gamma, scaled)


def repeat_kv(op: Any, x: Any, tag: str, grow: str = "expand") -> Any:
    """The exporters' repeat_kv of a KV head tensor: ``Reshape(Expand | Tile(Unsqueeze(x)))``; binds ``{tag}_5d``,
    ``{tag}_grown`` and ``{tag}_rep``. ``grow``: "expand" or "tile"."""
    x5 = op.Unsqueeze(x, _allow_other_inputs=True, _outputs=[f"{tag}_5d"])
    grown = op.Expand(x5, _allow_other_inputs=True, _outputs=[f"{tag}_grown"]) if grow == "expand" \
        else op.Tile(x5, _allow_other_inputs=True, _outputs=[f"{tag}_grown"])
    return op.Reshape(grown, _allow_other_inputs=True, _outputs=[f"{tag}_rep"])


def scaled(op: Any, scores: Any, scale: Any, scale_op: str) -> Any:
    """Attention scores times (``mul``) or over (``div``) a scale, or as they are (``none``)."""
    if scale_op == "none":
        return scores
    return op.Mul(scores, scale) if scale_op == "mul" else op.Div(scores, scale)


def masked_softmax(op: Any, scores: Any, mask: Any, mask_op: str, nan_guard: bool, zero: Any) -> Any:
    """``Softmax(scores + mask | Where(mask, scores, fill) | scores)`` (``mask_op``: add, where, none), then with
    ``nan_guard`` the exporters' ``Where(IsNaN(p), zero, p)``; binds ``probs`` (the Softmax output). ``zero``: the
    pattern for the guard's replacement value (and for the Where mask's fill)."""
    if mask_op == "add":
        scores = op.Add(scores, mask)
    elif mask_op == "where":
        scores = op.Where(mask, scores, zero)
    probs = op.Softmax(scores, _outputs=["probs"])
    return op.Where(op.IsNaN(probs), zero, probs) if nan_guard else probs


def dq(op: Any, x: Any, scale: Any, name: str) -> Any:
    """``DequantizeLinear(x, scale[, zero_point])`` of any attributes; binds its output as ``name``."""
    return op.DequantizeLinear(x, scale, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=[name])


def q(op: Any, v: Any, scale: Any, name: str) -> Any:
    """``QuantizeLinear(v, scale[, zero_point])`` of any attributes; binds its output as ``name``."""
    return op.QuantizeLinear(v, scale, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=[name])


def qdq_matmul(op: Any, a: Any, sa: Any, b: Any, sb: Any, sy: Any) -> Any:
    """The QDQ node unit ``Q(MatMul(DQ(a), DQ(b)))``; binds ``da``, ``db``, ``mm`` and ``y``."""
    return q(op, op.MatMul(dq(op, a, sa, "da"), dq(op, b, sb, "db"), _outputs=["mm"]), sy, "y")


def qdq_conv(op: Any, x: Any, sx: Any, w: Any, sw: Any, sy: Any, bq: Any = None, sb: Any = None, *,
             with_bias: bool = False) -> Any:
    """The QDQ node unit ``Q(Conv(DQ(x), DQ(w)[, DQ(bias)]))``; binds ``dx``, ``dw``, ``dbias``, ``conv`` and
    ``y``."""
    inputs = [dq(op, x, sx, "dx"), dq(op, w, sw, "dw")]
    if with_bias:
        inputs.append(dq(op, bq, sb, "dbias"))
    return q(op, op.Conv(*inputs, _allow_other_attributes=True, _outputs=["conv"]), sy, "y")


def qdq_moved(op: Any, op_type: str, x: Any, s1: Any, s2: Any) -> Any:
    """``Q(op_type(DQ(x), ...))``: a QDQ unit around an op that moves or selects elements; binds ``deq``, ``moved``
    and ``y``."""
    v = getattr(op, op_type)(dq(op, x, s1, "deq"), _allow_other_inputs=True, _allow_other_attributes=True,
                             _outputs=["moved"])
    return q(op, v, s2, "y")
