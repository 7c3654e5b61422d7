"""What a compiled step becomes once a signature's first call has shown its inputs and outputs: a native step that
the program's C++ loop runs without calling the step's Python kernel (``ep/native/native_steps.cc``).

- A shape step: Shape reads its input's dims on every call (``_native.ShapeStep``), whatever the shape, so an input
  that grows every call (a decoder's attention mask, past + 1 long) needs no step bound per length.
- A memoized step: shape plumbing (Size, and what is computed from shapes and constants alone: Gather, Unsqueeze,
  Concat, Equal, Cast, ...) gives the same outputs on every call of a signature. Its outputs are kept (read-only
  copies) and returned while its inputs are what they were: the same dtype and shape for Size, the same bytes for
  the other inputs. Where the kernel's binding or a view also computes the step (below), the memo comes first and
  that step takes the values the memo declines (a length that changes every call). Values computed from the data
  are never memoized, even small ones that repeat (a benchmark feeding the same input would otherwise skip work a
  real caller does).
- A view step: Reshape/Squeeze/Unsqueeze/Flatten, and Identity, on an input of the bound shape is numpy's reshape
  to the bound output shape (a view where the layout allows, else a copy, as the kernels'); a runtime shape or axes
  input (an exporter's Shape -> Concat chain) must hold the value it was bound for (``kernels.runtime.fixed_inputs``).
- A call step: a kernel with a ``bind`` function (``kernels.registry.KernelDef``) names the native kernel call its
  Python ``run`` would make for these shapes (conv, int4 matmuls), and the loop makes that call directly; or a
  step of its own where the call's arguments depend on input values (GroupQueryAttention's lengths:
  ``ep/native/gqa_step.cc``).

Each bound step checks its inputs on every call and declines others (the kernel runs then), so a shape that
depends on data never gets a stale answer. Random ops and Scan are never bound; If and Loop only as their own steps
(``ep/native/control_flow_steps.cc``), never memoized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..kernels.runtime import FIXED_INPUT_BYTES, fixed_inputs
from ..kernels.registry import KernelDef, Prepared

MEMO_OUTPUT_BYTES = 65536  # kept outputs per step (a Range of positions over a long context: 8K int64)
SHAPE_ONLY = frozenset({"Shape", "Size"})  # outputs depend on the input's dtype and shape alone
VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
NEVER = frozenset({"Scan",  # its body may read more than the step's inputs
                   "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                   "Bernoulli", "Dropout"})
NOT_MEMOIZED = frozenset({"If", "Loop"})  # a branch or body may hold a random op: bound only as its kernel's step


def shape_derived_slots(steps: Sequence[Any], n_inputs: int) -> set[int]:
    """The value slots of a program (``ep.program.Step`` list) computed from input shapes and constants alone:
    outputs of Shape/Size, and of deterministic steps whose runtime inputs are all such slots."""
    derived: set[int] = set()
    for st in steps:
        runtime = [s for s in st.in_slots if s >= 0]
        computed = all(s >= n_inputs and s in derived for s in runtime)
        if st.op in SHAPE_ONLY or (st.op not in NEVER | NOT_MEMOIZED and computed):
            derived.update(s for s in st.out_slots if s >= 0)
    return derived


def bind(op: str, kernel: KernelDef, prepared: Prepared, args: Sequence[Any], outs: Sequence[Any],
         native: Any, *, shape_derived: bool) -> Any:
    """The native step for a step of ``op`` ("op_type" for the ONNX domain, else "domain::op_type") that was just
    called with ``args`` and returned ``outs``, or None (it keeps running its kernel): a memoized step where the
    rules above allow one (nothing is cheaper), else the kernel's own binding (a native kernel call), else a view;
    a memo and one of those both, tried in that order.
    ``shape_derived``: the step's runtime inputs all come from shapes and constants (``shape_derived_slots``), so it
    may be memoized. ``native``: the extension."""
    if op in NEVER or not all(isinstance(o, np.ndarray) for o in outs):
        return None
    if op == "Shape" and len(args) == 1:
        return native.ShapeStep(prepared.attrs["start"], prepared.attrs["end"])
    memo = None
    if op in SHAPE_ONLY or (shape_derived and op not in NOT_MEMOIZED):
        memo = _memo(op, args, outs, native)
    general = None if op in SHAPE_ONLY else _general(op, kernel, prepared, args, outs, native)
    if memo is not None and general is not None:
        return native.FirstOfSteps([memo, general])  # the kept values while they repeat, else computed
    return memo if memo is not None else general


def _general(op: str, kernel: KernelDef, prepared: Prepared, args: Sequence[Any], outs: Sequence[np.ndarray],
             native: Any) -> Any:
    """The step that computes the outputs for any input values of the bound shapes: the kernel's own binding,
    else a view; None when there is neither."""
    if kernel.bind is not None:
        step = kernel.bind(prepared, args, outs)
        if step is not None:
            return step
    if op in VIEWS:
        return _view(args, outs, native)
    return None


def _view(args: Sequence[Any], outs: Sequence[np.ndarray], native: Any) -> Any:
    x = args[0] if args else None
    if len(outs) != 1 or not isinstance(x, np.ndarray) or outs[0].dtype != x.dtype or outs[0].size != x.size:
        return None
    fixed = fixed_inputs(args, 1)
    if fixed is None:
        return None
    return native.ViewStep(x.shape, outs[0].shape, len(args), fixed)


def _memo(op: str, args: Sequence[Any], outs: Sequence[np.ndarray], native: Any) -> Any:
    if sum(o.nbytes for o in outs) > MEMO_OUTPUT_BYTES:
        return None
    expected = []
    for a in args:
        if a is None:
            expected.append(None)
        elif not isinstance(a, np.ndarray):
            return None
        elif op in SHAPE_ONLY:
            expected.append(("shape", a.dtype, a.shape))
        elif a.nbytes <= FIXED_INPUT_BYTES:  # compared by value: shapes, indices, conditions
            expected.append(("value", np.array(a, order="C")))  # ascontiguousarray would make a 0-d value 1-d
        else:
            return None
    kept = []
    for o in outs:
        o = np.array(o, copy=True)  # never a view of an input or of ORT's output buffer
        o.flags.writeable = False
        kept.append(o)
    return native.MemoStep(expected, tuple(kept))
