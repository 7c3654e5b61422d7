"""Cast: numpy's astype in the reference; on the native kernels ``cast`` (kernels/native/cast.cc), the same values
between the twelve numeric dtypes, bound as the step for its input shape."""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, Prepared, register
from ..target import Target
from ._util import arg
from .elementwise import check, cost, out_dtype, prepare

_F16 = np.dtype(np.float16)


def _cast_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's astype: float->int truncates toward zero, ->float16 rounds to nearest even, ->bool is x != 0; on the
    native kernels ``cast`` (kernels/native/cast.cc: the same values; None where numpy's result is the platform's)."""
    x = arg(p, inputs, 0)
    dt = out_dtype(p, x)
    nat = runtime.native(p)
    if nat is not None and type(x) is np.ndarray and x.dtype != dt and x.flags.c_contiguous and _castable(x.dtype, dt):
        y = nat.cast(x, dt, None, runtime.threads(p))
        if y is not None:
            return [y]
    return [x.astype(dt, copy=False)]


_NUMERIC_KINDS = "biuf"


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    """Whether ``cast`` converts ``src`` to ``dst``: numeric dtypes in native byte order, not an integer to float16
    (numpy's rounding)."""
    return (src.kind in _NUMERIC_KINDS and dst.kind in _NUMERIC_KINDS and src.isnative and dst.isnative
            and not (dst == _F16 and src.kind in "iu"))


def _cast_bind(p: Prepared, inputs, outs):
    """Cast as one ``cast`` call for this input shape, into ORT's buffer when the result is a partition output; the
    kernel's None (a value numpy converts its own way) runs the Python kernel."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    if (nat is None or not isinstance(x, np.ndarray) or outs[0].dtype == x.dtype
            or not _castable(x.dtype, outs[0].dtype)):
        return None
    where = p.runtime.partition_outputs
    into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.cast, (None, outs[0].dtype, None, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None)], [(-1, None)], None, into)


def _cast_check(node: NodeInfo, target: Target) -> str | None:
    if node.outputs[0].dtype is None:
        return f"{node.describe()}: Cast to a dtype the NPU cannot carry (to={node.attr('to')})"
    return check(node, target)


register(KernelDef("", "Cast", prepare, _cast_run, cost, _cast_check, rank_free=True, bind=_cast_bind))
