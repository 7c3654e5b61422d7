"""The executor's test oracle: a compiled program's steps walked in Python, as ``_native.StepLoop`` walks them in
C++ (``ep/native/step_loop.cc``), with every step's Python kernel (never a bound native step).

No call path runs this: every call of a program runs on the native loop, and a signature's first call observes
through it (``Program._observe``). Tests compare the native loop and its bound native steps with this walk: the
same slots, releases, outputs (bit for bit) and failure messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npu_ep.ep.program import Program, _failure


def python_loop(program: Program, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The program's outputs for ``inputs`` (in the program's input order) from its steps' Python kernels, under
    numpy's "ignore all" error state as a call runs them."""
    env: list[Any] = [None] * (program.n_slots + 1)  # the extra last slot stays None: in_slots -1 read it
    env[: len(inputs)] = inputs
    with np.errstate(all="ignore"):
        for step in program.steps:
            args = tuple(env[s] for s in step.in_slots)
            try:
                outs = step.kernel.run(step.prepared, args)
            except Exception as exc:
                raise _failure(step, args, exc) from exc
            for i, slot in enumerate(step.out_slots):
                if slot >= 0:
                    env[slot] = outs[i]
            for slot in step.release:
                env[slot] = None
    return tuple(env[s] for s in program.output_slots)
