"""The kernel registry: ``(domain, op_type) -> KernelDef``, plain data (tinygrad/XNNPACK-partitioner style).

A kernel has four functions:

- ``check(node, target) -> str | None``: kernel-specific reason to decline (attribute values, shape limits); the
  generic rules (op listed by the target, dtypes, rank, static shapes) live in ``support.why_not``.
- ``prepare(node, target) -> Prepared``: compile time. Receives constant inputs as ``node.inputs[i].value`` and
  must copy everything ``run`` needs into ``Prepared.consts`` (re-laid out for the NPU: packed weights, folded
  scales) and ``Prepared.attrs`` (JSON-serializable: attributes, tile plan). A compiled program stores only these,
  so loading a context binary never calls ``prepare`` again.
- ``run(prepared, inputs) -> list[np.ndarray]``: run time. ``inputs`` is aligned with ``node.inputs``: a numpy
  array for every runtime input, ``None`` for omitted optional inputs AND for inputs that were constant at
  compile time (their data is in ``prepared.consts``). Inputs are read-only views: never write into them.
- ``cost(prepared, in_shapes) -> OpCost``: the cost model for one execution with these concrete input shapes.

At run time a kernel reads what the program says about its step from ``prepared.runtime``, a ``StepRuntime``
(kernel choice and threads, ORT's output buffers, DMA counting, loaded sub-programs, constant input shapes);
``prepared.kernel_cache`` holds only the kernel's own caches.

``rank_free``: the kernel needs no input's rank at compile time (it reads ranks from the runtime arrays: element-wise,
movement, reductions with runtime axis normalization), so inputs of unknown rank are claimed; kernels that plan by
rank (matmul tiles, convolution windows) leave it False and ``support.why_not`` declines unknown ranks for them.

Adding an op = one ``register(KernelDef(...))`` in a module under ``kernels/ops/``, one row in
``kernels/kernel_table.py`` (which module holds it: the registry imports those modules), one entry in the target
files, one test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .kernel_table import KERNEL_MODULES
from .node import NodeInfo

if TYPE_CHECKING:
    from .target import Target

Shape = tuple[int, ...]


@dataclasses.dataclass
class OpCost:
    """Emulated cost of one op execution. Cycles at the target clock; bytes moved between DRAM and SRAM."""

    compute_cycles: float = 0.0
    dma_cycles: float = 0.0
    cycles: float = 0.0  # total after compute/DMA overlap (double buffering)
    dma_bytes: int = 0
    sram_peak: int = 0
    macs: int = 0
    utilization: float = 0.0  # achieved MACs / (cycles * peak MACs per cycle); 0 for vector ops
    unit: str = "vector"  # "matrix" | "vector" | "dma"
    mode: str = ""  # the matrix unit's mode (float32/float16/int8/int4) of a "matrix" op


KERNEL_CHOICES = ("native", "reference")
# StepRuntime fields a bound native step depends on: changing one bumps the record's generation
_GUARDED = frozenset({"kernels", "threads", "partition_outputs", "dma_counts", "kv_state"})


@dataclasses.dataclass(eq=False)
class StepRuntime:
    """What the program tells one step at run time: the typed seam between ``ep.program`` and a kernel (never
    serialized). The Program creates one per step (``Program.__init__``); a Prepared outside a program (kernel
    tests, benchmarks) has a default one: native kernels on one thread.

    A native step bound for the step (``kernels.runtime.call_step``) holds the generation it was bound under and
    declines once it changes: every assignment that changes a field of ``_GUARDED`` bumps it, so another kernel
    choice, DMA counting or other partition outputs reach the C++ loop, which reads the counter in place (one load
    per call, ``ep/native/native_steps.h: Guards``), not Python state."""

    kernels: str = "native"  # one of KERNEL_CHOICES: the native kernels or the numpy reference model
    threads: int = 1  # host threads a kernel may use
    # step output index -> ORT output index, for the outputs of a partition ORT calls (written in place)
    partition_outputs: dict[int, int] | None = None
    # a list asks the matrix kernels to run their tile plan and append (plan, DMA bytes) per call (``ops._matrix``)
    dma_counts: list | None = None
    # the shapes of the node's constant inputs (input index -> shape): they are not runtime arguments
    const_shapes: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # sub-programs (If branches, Loop/Scan bodies) loaded from the step's attributes: key -> program
    subprograms: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the session's stateful KV (kernels.ops._kv_state.KvState, set by ep.kv_state.enable): GroupQueryAttention
    # keeps each sequence's K/V between runs
    kv_state: Any = None
    # the generation, bumped on every change of a guarded field: an int64 array of one element, so C++ reads it
    counter: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1, np.int64), repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _GUARDED and "counter" in self.__dict__:
            old = self.__dict__.get(name)
            if old is not value and (type(old) is not type(value) or old != value):
                self.counter[0] += 1
        object.__setattr__(self, name, value)

    @property
    def generation(self) -> int:
        return int(self.counter[0])


@dataclasses.dataclass
class Prepared:
    attrs: dict[str, Any]
    consts: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    target: Target | None = None  # re-attached after loading a context binary, never serialized
    # run-time, not serialized: the kernel's own caches; what is kept per input shape goes through
    # kernels.shape_memo (bounded)
    kernel_cache: dict[Any, Any] = dataclasses.field(default_factory=dict)
    # Constants the compiler computes from a node's initializers (accuracy_level 4's int4 tiles) are as large as
    # the weights; where the initializers are ORT's own, read in place, a cache entry stores the recipe and
    # references to the initializers instead of the bytes (``ep.program_io``).
    derived: list[DerivedConsts] = dataclasses.field(default_factory=list)
    runtime: StepRuntime = dataclasses.field(default_factory=StepRuntime)  # the program's word to this step


@dataclasses.dataclass(frozen=True)
class DerivedConsts:
    recipe: str                             # a name in RECIPES
    consts: dict[str, str]                  # each role the recipe outputs -> the Prepared's constant name
    sources: dict[str, np.ndarray | None]   # the recipe's input role -> initializer (or None)
    params: dict[str, int]

    def prefixed(self, prefix: str) -> DerivedConsts:
        """The same recipe for constants stored under ``prefix`` (a fused kernel holding this one's)."""
        return dataclasses.replace(self, consts={role: prefix + name for role, name in self.consts.items()})


# recipe name -> fn(sources, params) -> {role: array}; raises ValueError on sources or params that do not fit
RECIPES: dict[str, Callable[[dict[str, np.ndarray | None], dict[str, int]], dict[str, np.ndarray]]] = {}


def _no_check(node: NodeInfo, target: Target) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class KernelDef:
    domain: str
    op_type: str
    prepare: Callable[[NodeInfo, Target], Prepared]
    run: Callable[[Prepared, Sequence[np.ndarray | None]], Sequence[np.ndarray]]
    cost: Callable[[Prepared, Sequence[Shape | None]], OpCost]
    check: Callable[[NodeInfo, Target], str | None] = _no_check
    rank_free: bool = False  # True: inputs of unknown rank are fine (see the module docstring)
    # per input, the rank the ONNX spec fixes (None: any): such an input of unknown rank has that rank (Gemm's A
    # after a Reshape to a computed shape); the kernel checks it at run time
    spec_ranks: tuple[int | None, ...] = ()
    # run time, optional: (prepared, inputs, outputs) of a call -> a native step for these input shapes that the
    # program's C++ loop runs instead of ``run`` (``ep/step_binding.py``; ``kernels.runtime.call_step``), or None
    bind: Callable[[Prepared, Sequence[np.ndarray | None], Sequence[np.ndarray]], Any] | None = None


KERNELS: dict[tuple[str, str], KernelDef] = {}


def register(kernel: KernelDef) -> KernelDef:
    """Called by the module ``kernels/kernel_table.py`` names for the kernel's op, when the registry imports it."""
    key = (kernel.domain, kernel.op_type)
    if key in KERNELS:
        raise ValueError(f"kernel {key} registered twice")
    if key not in KERNEL_MODULES:
        raise ValueError(f"kernel {key} has no row in kernels/kernel_table.py (which module under kernels/ops/ "
                         "holds it)")
    KERNELS[key] = kernel
    return kernel


def kernel_for(domain: str, op_type: str) -> KernelDef | None:
    _load_ops()
    return KERNELS.get((domain, op_type))


_loaded = False


def _load_ops() -> None:
    """Import the modules ``kernels/kernel_table.py`` names, once, and check each registered the ops its rows
    give it."""
    global _loaded
    if _loaded:
        return
    import importlib

    from . import ops

    for mod in sorted(set(KERNEL_MODULES.values())):
        importlib.import_module(f"{ops.__name__}.{mod}")
    missing = sorted(f"{d}::{o} ({KERNEL_MODULES[d, o]})" for d, o in KERNEL_MODULES.keys() - KERNELS.keys())
    if missing:
        raise ImportError(f"kernels/kernel_table.py names ops their modules do not register: {', '.join(missing)}")
    _loaded = True
