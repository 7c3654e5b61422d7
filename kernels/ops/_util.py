"""Helpers shared by kernel modules: reading constant-or-runtime inputs, shapes, dtype sizes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..node import NodeInfo
from ..registry import Prepared


_KEYS = tuple(f"in{i}" for i in range(64))  # consts keys of inputs, built once (``arg`` is on every kernel call)


def _key(i: int) -> str:
    return _KEYS[i] if i < len(_KEYS) else f"in{i}"


def stash_constants(node: NodeInfo, consts: dict[str, np.ndarray] | None = None,
                    only: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Copy every constant input of ``node`` (or those of indices ``only``: a kernel that re-lays its weights out
    keeps its constant data input this way) into a consts dict under the key ``in{i}``."""
    consts = {} if consts is None else consts
    for i, v in enumerate(node.inputs):
        if not v.missing and v.value is not None and (only is None or i in only):
            consts[_key(i)] = np.asarray(v.value, order="C")  # ascontiguousarray would make 0-d values 1-d
    return consts


def arg(p: Prepared, inputs: Sequence[np.ndarray | None], i: int) -> np.ndarray | None:
    """Input ``i`` at run time: the runtime array, else the compile-time constant, else None (omitted)."""
    if i < len(inputs) and inputs[i] is not None:
        return inputs[i]
    return p.consts.get(_KEYS[i] if i < 64 else f"in{i}")


def nbytes(shape: tuple[int, ...] | None, itemsize: int) -> int:
    return int(np.prod(shape, dtype=np.int64)) * itemsize if shape is not None else 0
