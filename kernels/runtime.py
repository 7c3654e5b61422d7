"""The runtime seam between a compiled program and its kernels, and the one module that loads the extension.

A kernel learns what the program says about its step from ``p.runtime``, a ``StepRuntime`` (``kernels.registry``)
the Program creates per step: which implementation runs (the native kernels of the extension or the numpy
reference model) on how many host threads, ORT's output buffers, DMA counting, sub-programs and constant shapes.
The helpers below read it.

The kernel choice is a run-time property of a session (provider options ``kernels`` and ``host_threads``), not
part of the compiled program: both implementations read the same prepared constants (packed weights), so a cached
context serves either. ``ep.entry_points`` stamps every step of an adopted program with ``configure``, which reaches the
sub-programs (If branches, Loop/Scan bodies) their steps hold; a sub-program loaded later copies its owner's
setting (``kernels.subprograms.program``). A Prepared that was never stamped (kernel tests, benchmarks) runs
native on one thread.

The extension (``npu_ep.ep._native``) is the ORT plugin library too, so it lives in ``ep/``; this module imports it
inside a function, on first use, because ``ep`` imports ``kernels`` (a module-level import would be a circle) and
because the reference kernels must still run where the extension is not built. Every other module reaches the
extension through ``extension()`` and ``native_module()`` (``tests/test_layers.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

import numpy as np

from . import subprograms
from .registry import KERNEL_CHOICES, Prepared, StepRuntime

__all__ = ["KERNEL_CHOICES", "StepRuntime"]

_module: list[ModuleType | None] = []  # [the extension's kernels submodule, the extension] once imported

AVX512_ISAS = ("avx512", "avx512_vnni", "amx_int8")  # the extension's ISA levels (its ``isa()``) with AVX-512F


def _load() -> None:
    try:
        from ..ep import _native
    except ImportError:  # extension not built: the reference kernels still run
        _native = None
    _module[:] = [getattr(_native, "kernels", None), _native]


def native_module() -> ModuleType | None:
    """The extension's ``kernels`` submodule (imported on first use: ``ep`` imports ``kernels``), None if absent."""
    if not _module:
        _load()
    return _module[0]


def host_has_avx512() -> bool:
    """Whether the native kernels dispatch to their AVX-512 rows on this host (at the ISA cap tests may set)."""
    nat = native_module()
    return nat is not None and nat.isa() in AVX512_ISAS


def extension() -> ModuleType | None:
    """The extension module itself (its native step classes), None if it is not built."""
    if not _module:
        _load()
    return _module[1]


def ort_output(p: Prepared, index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """ORT's own buffer for output ``index`` of this step when it is an output of the partition being computed
    (``ep.program.Program.mark_partition_outputs``), as a writeable ``shape`` array of ``dtype``, so the kernel
    writes it in place and the bridge copies nothing; else None. Valid only during this call: never keep it."""
    where = p.runtime.partition_outputs
    if not where or index not in where:
        return None
    ext = extension()
    view = None if ext is None else ext.partition_output(where[index], shape)
    return view if view is not None and view.dtype == dtype else None


def guard(p: Prepared) -> tuple[np.ndarray, int]:
    """A native step's guard (``_native.CallStep``, ``GqaStep``): (counter, generation) of ``p``'s ``StepRuntime``;
    the step declines once the program changes what ``p``'s step runs under (kernel choice, threads, partition
    outputs, DMA counting) and the counter moves on."""
    return (p.runtime.counter, p.runtime.generation)


def call_step(p: Prepared, fn, args: tuple, inputs: list, outputs: list, guards: list | None = None,
              ort_outputs: list | None = None, fixed: list | None = None, keywords: tuple[str, ...] = ()):
    """A native step calling ``fn(*args)`` with this step's inputs put in, for a kernel's ``bind`` (see
    ``_native.CallStep`` for ``inputs``/``outputs``/``fixed``); it declines once ``p``'s runtime record changes
    (``guard``), and once any of ``guards`` (more ``guard(...)`` of nested Prepareds) fails. ``keywords``: the names
    the last arguments are passed by (a ufunc's ``("out",)``: no Python wrapper between the loop and the ufunc).
    None without the extension."""
    ext = extension()
    if ext is None:
        return None
    return ext.CallStep(fn, tuple(args), list(inputs), list(outputs), [guard(p), *(guards or [])],
                        list(ort_outputs or []), list(fixed or []), tuple(keywords))


def branch_step(p: Prepared, branches: list[tuple[Any, list[int]]]):
    """If's native step (``_native.BranchStep``): per branch (then, else) the sub-program's ``native_call`` and the
    If input each program input is, or (None, the If input each output is) for a branch that only forwards; it
    declines once ``p``'s runtime record changes. None without the extension."""
    ext = extension()
    if ext is None:
        return None
    return ext.BranchStep(tuple(branches), [guard(p)])


def loop_step(p: Prepared, body: Any, n_carried: int, outer: list[int]):
    """Loop's native step (``_native.LoopStep``): the body program's ``native_call`` run per iteration with the
    iteration, the condition, ``n_carried`` values and the Loop inputs at ``outer``; it declines once ``p``'s
    runtime record changes. None without the extension."""
    ext = extension()
    if ext is None:
        return None
    return ext.LoopStep(body, n_carried, outer, [guard(p)])


FIXED_INPUT_BYTES = 64  # a runtime shape, axes or starts/ends a bound step may hold to its bound value


def fixed_inputs(inputs, first: int) -> list | None:
    """The runtime inputs from ``first`` on as a bound step's ``fixed`` list [(input index, value)]: small values
    (shapes, axes, slice bounds computed from shapes) the step is bound for and checks on every call, declining
    others; None when one is larger than ``FIXED_INPUT_BYTES`` (a data value: the step stays unbound)."""
    fixed = []
    for i in range(first, len(inputs)):
        v = inputs[i]
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or v.nbytes > FIXED_INPUT_BYTES:
            return None
        fixed.append((i, np.array(v, order="C")))  # a copy; ascontiguousarray would make a 0-d value 1-d
    return fixed


def borrowed_from_ort(arr: np.ndarray) -> bool:
    """Whether ``arr`` is (a view of) a constant initializer that ORT owns and keeps for the session (read in place,
    see ``ep/native/execution_provider.h``)."""
    ext = extension()
    owner = getattr(ext, "ORT_INITIALIZER", None)
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return owner is not None and base is owner


def configure(prepared: Iterable[Prepared], kernels: str, threads: int) -> None:
    """Stamp prepared kernels with the session's choice (``kernels`` in KERNEL_CHOICES, host threads >= 1)."""
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels={kernels!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    threads = max(1, int(threads))
    for p in prepared:
        p.runtime.kernels, p.runtime.threads = kernels, threads
        for program in subprograms.loaded_programs(p):  # If branches, Loop/Scan bodies: their owner's setting
            configure((st.prepared for st in program.steps), kernels, threads)


def copy_runtime(src: Prepared, dst: Prepared) -> None:
    """Give a nested Prepared (fused ops run an inner kernel) its owner's kernel choice and threads (not its
    partition outputs: the inner kernel's outputs are not the step's). Called on every run of the owner: the
    record's guarded assignment is only made when the setting differs."""
    have, want = dst.runtime, src.runtime
    if have.kernels != want.kernels or have.threads != want.threads:
        have.kernels, have.threads = want.kernels, want.threads


def native(p: Prepared) -> ModuleType | None:
    """The native kernel module when ``p`` runs native kernels, else None (reference model)."""
    return native_module() if p.runtime.kernels == "native" else None


def threads(p: Prepared) -> int:
    return p.runtime.threads


def counting_dma(p: Prepared) -> bool:
    """Whether the program asks ``p``'s matrix kernel to run its tile plan and count DMA (``ops._matrix``)."""
    return p.runtime.dma_counts is not None
