"""com.microsoft QLinearGlobalAveragePool: int8/uint8 NCHW (or channels_last NHWC) images to one value per channel.

As ORT 1.31's x86-64 MLAS kernel (bit-exact): an exact int32 sum per channel over the image, biased by
``-x_zp * image_size``, then MLAS requantization (``_matrix.requantize``) with the float32 multiplier
``x_scale / (y_scale * float32(image_size))``: multiply, clamp to the output range, round half to even, add y_zp.
ORT refuses multipliers outside [2^-32, 256) and images of 2^24 elements or more; so does the check here.
On the native kernels the op is ``qlinear_global_average_pool`` (kernels/native/qlinear_pool.cc), the same integers
bit for bit, bound as the step for its input shape; scales and zero points fed at run time are held to the bound
values.

Cost: ``_vector.stream_cost`` over the input elements (one add each) plus the per-channel requantization.
"""

from __future__ import annotations

import math

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import requantize
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost
from .qlinear_binary import check_quant_params, scalar


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"qtype": node.input(0).dtype.name, "channels_last": int(node.attr("channels_last", 0)),
             "in_itemsizes": [itemsize_of(v) for v in node.inputs]}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype not in (np.int8, np.uint8):
        return f"{node.describe()}: QLinearGlobalAveragePool needs int8 or uint8 data"
    if x.shape is not None and len(x.shape) < 3:
        return f"{node.describe()}: input {x.describe()} needs rank >= 3 (N, C and at least one spatial dim)"
    return check_quant_params(node, ((1, 2), (3, 4)))


def _params(p: Prepared, inputs, shape: tuple[int, ...]) -> tuple[int, np.float32, np.float32, np.float32]:
    """(image size, multiplier, x_zp, y_zp) for an input of ``shape``; a ValueError where ORT refuses them."""
    sx, zx, sy, zy = (scalar(p, inputs, i) for i in (1, 2, 3, 4))
    spatial = range(1, len(shape) - 1) if p.attrs["channels_last"] else range(2, len(shape))
    image = math.prod(shape[i] for i in spatial)
    multiplier = np.float32(sx / np.float32(sy * np.float32(image)))
    if image >= 1 << 24 or not 2.0 ** -32 <= multiplier < 256.0:
        raise ValueError(f"QLinearGlobalAveragePool: parameters out of range (image size {image}, "
                         f"multiplier {multiplier}), as ORT refuses them")
    return image, multiplier, zx, zy


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    image, multiplier, zx, zy = _params(p, inputs, x.shape)
    nat = runtime.native(p)
    if nat is not None and x.flags.c_contiguous:
        return [nat.qlinear_global_average_pool(x, bool(p.attrs["channels_last"]), int(zx), multiplier, zy,
                                                runtime.threads(p))]
    spatial = tuple(range(1, x.ndim - 1)) if p.attrs["channels_last"] else tuple(range(2, x.ndim))
    acc = x.sum(axis=spatial, dtype=np.int32, keepdims=True) - np.int32(int(zx) * image)
    return [requantize(acc, multiplier, np.float32(zy), p.attrs["qtype"])]


def _bind(p: Prepared, inputs, outs):
    """The pool as one native call for this input shape; scales and zero points fed at run time are held to these
    values (declined where ORT refuses them: the Python kernel raises)."""
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or fixed is None or not isinstance(x, np.ndarray) or x.dtype not in (np.int8, np.uint8):
        return None
    try:
        _, multiplier, zx, zy = _params(p, inputs, x.shape)
    except ValueError:
        return None
    args = (None, bool(p.attrs["channels_last"]), int(zx), multiplier, zy, runtime.threads(p))
    return runtime.call_step(p, nat.qlinear_global_average_pool, args, [(0, 0, x.dtype, x.shape, None)],
                             [(-1, None)], fixed=fixed)


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    x = shapes[0]
    channels = x[0] * (x[-1] if p.attrs["channels_last"] else x[1]) if x else 0
    return stream_cost(p, n + 3 * channels, b_in, channels, 1.0)


register(KernelDef("com.microsoft", "QLinearGlobalAveragePool", _prepare, _run, _cost, _check, bind=_bind))
