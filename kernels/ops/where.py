"""Where: numpy's where in the reference; on the native kernels ``where_select`` (kernels/native/where.cc), which
copies x's or y's bits by a nonzero condition byte, bound as the step for its input shapes."""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..registry import KernelDef, Prepared, register
from ._util import arg
from .elementwise import check, cost, prepare

_BOOL = np.dtype(np.bool_)


def _native_where(values: list) -> bool:
    """Whether ``where_select`` takes these operands: a bool condition, values of one plain dtype (its result is
    numpy's where's, bits copied)."""
    c, x, y = values
    return (isinstance(c, np.ndarray) and isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
            and c.dtype == _BOOL and x.dtype == y.dtype and x.dtype.kind in "biuf" and x.itemsize in (1, 2, 4, 8))


def _where_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's where; on the native kernels ``where_select`` (kernels/native/where.cc) for C-order operands."""
    c, x, y = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    nat = runtime.native(p)
    if (nat is not None and _native_where([c, x, y]) and c.flags.c_contiguous and x.flags.c_contiguous
            and y.flags.c_contiguous):
        return [nat.where_select(c, x, y, None, runtime.threads(p))]
    return [np.where(c, x, y)]


def _where_bind(p: Prepared, inputs, outs):
    """Where as one ``where_select`` call for these input shapes, constants held in place, into ORT's buffer when
    the result is a partition output."""
    values = [arg(p, inputs, i) for i in range(3)]
    nat = runtime.native(p)
    if nat is None or not _native_where(values):
        return None
    given = [i < len(inputs) and inputs[i] is not None for i in range(3)]
    live = [(i, i, v.dtype, v.shape, None) for i, v in enumerate(values) if given[i]]
    if not live:
        return None
    held = [None if given[i] else np.array(v, order="C") for i, v in enumerate(values)]  # 0-d stays 0-d
    where = p.runtime.partition_outputs
    into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.where_select, (*held, None, runtime.threads(p)), live, [(-1, None)], None, into)


register(KernelDef("", "Where", prepare, _where_run, cost, check, rank_free=True, bind=_where_bind))
