"""A compiled partition: a straight-line list of prepared kernel steps over numbered value slots.

Everything that does not depend on the inputs was done at compile time (``prepare``); a call only looks up
slots and runs kernels. The program also keeps what reports need: call count, host time, and the emulated NPU
cost per distinct input-shape signature (computed once per signature from the cost model, when first asked for).

Per-signature state is bounded: a program keeps its ``SIGNATURES_KEPT`` most recently used signatures (their cost,
counts and the extension's entry; native steps for ``_BOUND_SIGNATURES`` of them). A decoder whose past grows has a
new signature per token, so keeping every one grew by ~0.3 KB per step per shape for the session's life. An evicted
signature's counts and emulated time stay in the totals; seen again, its call is a first call once more.
A new signature's first call runs on the steps' latest native steps without observing (``_scout``), so a new
past length pays only for the steps whose inputs grew; an observed call reuses, step by step, what earlier
signatures bound and costed for the same step inputs.

Every call runs in the extension (``ep/native/EXECUTOR.md``): ``_native.ProgramCall`` looks up the signature and
runs its ``_native.StepLoop``; a new signature's first call and recording calls come back here (``_observe``), which
runs the same loop with an observer that chooses each step's native step and binds new ones from the step's
inputs and outputs. The plain Python walk of the steps is the executor's test oracle (``tests/loop_oracle.py``),
on no call path.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np
from numpy._core._ufunc_config import _extobj_contextvar as _ERRSTATE

from ..kernels.registry import KernelDef, OpCost, Prepared, StepRuntime
from ..kernels.runtime import FIXED_INPUT_BYTES, extension
from . import step_binding
from ..log import escape, logger
from .weight_arena import pack_constants

_extension = extension()  # the C++ call, loop and native steps every call runs on (None: not built, see _native_loop)


UNKNOWN_RANK = "?"  # a declared input shape of unknown rank (Step.declared)


# IEEE results (inf, nan) are the kernels' answers, as on the CPU EP: numpy must not turn them into RuntimeWarnings
# (errors under ``python -W error``). numpy 2 keeps its error state in a context variable: an observing call sets
# it to "ignore all" and resets it, which is ``np.errstate(all="ignore")`` without building the state on every call
# (~0.2 us instead of ~1 us); the extension's hot call enters a context of its own that holds that value (no set
# and reset per call). Every numpy >= 2.0 (required) has the variable (_ERRSTATE).
with np.errstate(all="ignore"):
    _IGNORE_ALL = _ERRSTATE.get()

SIGNATURES_KEPT = 64  # input-shape signatures a program keeps (cost, counts, the extension's entry): the latest used
_BOUND_SIGNATURES = 16  # input-shape signatures whose native steps a program keeps (a subset of the kept ones)
_RECENT_NATIVES = 4  # native steps per step the latest loop tries (a prefill's and a decode's, ...)
_STEP_MEMO_KEPT = 8192  # per-step costs and bindings a program reuses across signatures (cleared when full)


class NpuRuntimeError(RuntimeError):
    """A kernel failed at run time; the message names the node, op and input shapes."""


@dataclasses.dataclass
class Step:
    node_name: str
    op: str  # "domain::op_type" or "op_type"
    kernel: KernelDef
    prepared: Prepared
    in_slots: tuple[int, ...]  # -1: compile-time constant or omitted optional input
    out_slots: tuple[int, ...]
    release: tuple[int, ...] = ()  # slots whose last reader is this step
    declared: tuple[tuple | None, ...] = ()  # the graph's shapes of the runtime inputs (None: constant or omitted)
    # the shapes of the constant inputs (input index -> shape): not runtime arguments, the cost model needs them
    const_shapes: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        return f"node '{escape(self.node_name)}' ({escape(self.op)})"  # model-supplied: log.escape


@dataclasses.dataclass
class IoSpec:
    name: str
    dtype: str
    shape: tuple[Any, ...] | None


@dataclasses.dataclass(slots=True)
class _SignatureState:
    """What a program keeps for one input-shape signature (the hot path counts its own calls in the extension)."""

    cost: RunCost | None
    calls: int = 0  # calls _observe ran
    ns: int = 0
    # the first call's input shapes per step, until the cost is asked for (``Program._state_cost``): a signature
    # that is never asked about (a decoder's past one longer every token, no emulated timeline read) costs nothing;
    # a scouted call's are a tuple of bytes per step (``_step_shapes``)
    step_shapes: Sequence | None = None


@dataclasses.dataclass
class RunCost:
    """Emulated cost of one program execution: per-step OpCost and the total in cycles and seconds."""

    steps: list[OpCost]
    cycles: float
    seconds: float
    dma_bytes: int


class Program:
    def __init__(self, name: str, inputs: list[IoSpec], outputs: list[IoSpec], steps: list[Step],
                 n_slots: int, output_slots: tuple[int, ...], target, *, record: bool = False):
        self.name = name  # ORT's fused-node name: the key of stats, caches and EPContext nodes
        self.label = name  # what messages call the partition (the EP sets a readable one)
        self.inputs = inputs
        self.outputs = outputs
        self.steps = steps
        self.n_slots = n_slots
        self.output_slots = output_slots
        self.target = target
        for st in steps:  # each step's runtime record: what this program tells its kernel (kernels.registry)
            st.prepared.runtime = StepRuntime(const_shapes=dict(st.const_shapes))
        self._call = None  # set below: record's setter reaches it
        self.record = record
        self.recorded: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        # the kept input-shape signatures: the extension keeps their recency and says which to evict (``_admit``)
        self._signatures: dict[tuple, _SignatureState] = {}
        self._evicted_calls = self._evicted_ns = 0  # of signatures no longer kept
        self._evicted_seconds = 0.0
        # (step index, its input shapes) -> calls of evicted signatures whose cost was never asked for: priced when
        # emulated time is asked for (or when it holds _STEP_MEMO_KEPT), so that a decoder whose past grows beyond
        # SIGNATURES_KEPT does not run the cost model on every token's eviction
        self._unpriced: dict[tuple[int, Any], int] = {}
        self.evicted_signatures = 0
        self._loop = self._native_loop()  # the default loop in C++: no native steps bound yet
        # signature -> native steps bound after its first call (ep.step_binding), and the loop that runs them
        self._bindings: dict[tuple, list] = {}
        self._bound: dict[tuple, Any] = {}
        self._shape_derived = step_binding.shape_derived_slots(steps, len(inputs))  # slots a step may memoize
        # A new signature (a decoder's past one longer each token) mostly changes a few steps' inputs: the others'
        # cost and native step are those of an earlier signature, reused by the step's own inputs (_step_key)
        self._step_costs: dict[tuple, OpCost] = {}
        self._step_natives: dict[tuple, Any] = {}
        # id(step) -> the step's most recently bound native steps, and the native step trying them in that order
        self._recent_natives: dict[int, list] = {}
        self._latest_natives: dict[int, Any] = {}
        # A new signature's first call runs the steps' latest native steps (``_scout``): the loop over them (built
        # when first needed after they change), the signatures kept on it, and those whose next call observes
        self._latest_loop: Any = None
        self._scouted: dict[tuple, None] = {}
        self._pending: dict[tuple, None] = {}
        self._declines: dict[int, int] = {}  # step index -> scouted calls in a row in which its native step declined
        # per step: whether small input values are part of its key (a shape-derived step's memo holds to them)
        self._keyed_values = {id(st): st.op not in step_binding.SHAPE_ONLY
                              and all(s in self._shape_derived for s in st.in_slots if s >= 0) for st in steps}
        self._input_perm: tuple[int, ...] | None = None  # set by rebind when ORT orders inputs differently
        self._marked = False  # mark_partition_outputs was called (rebind then marks again)
        self._call = self._program_call()  # every call's entry, in C++
        self.arena_bytes = pack_constants(st.prepared for st in steps)  # weights as one huge-page stream

    @property
    def record(self) -> bool:
        """Keep every step's outputs in ``recorded`` (every call then takes the observing path)."""
        return self._recording

    @record.setter
    def record(self, on: bool) -> None:
        self._recording = on
        if self._call is not None:  # None only while __init__ runs
            self._call.record = on

    def _program_call(self) -> Any:
        """The extension's ProgramCall for this program. It reaches ``_observe`` through a weak reference: the
        program holds it, and a cycle through an extension object is never collected."""
        ref = weakref.ref(self)

        def observe(inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
            return ref()._observe(inputs)

        call = _extension.ProgramCall(observe, _ERRSTATE, _IGNORE_ALL, self._loop, SIGNATURES_KEPT)
        call.record = self._recording
        return call

    @property
    def native_call(self) -> Any:
        """The extension's ProgramCall: what a native step running this program calls (an If's branch step)."""
        return self._call

    def rebind(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        """Accept ORT's I/O order (an EPContext node's order can differ from the fused node it was compiled from)."""
        have_in = [io.name for io in self.inputs]
        have_out = [io.name for io in self.outputs]
        if sorted(have_in) != sorted(input_names) or sorted(have_out) != sorted(output_names):
            raise ValueError(f"compiled program has I/O {have_in} -> {have_out}, the node has "
                             f"{list(input_names)} -> {list(output_names)}")
        position = {n: i for i, n in enumerate(input_names)}
        perm = tuple(position[n] for n in have_in)
        self._input_perm = None if perm == tuple(range(len(perm))) else perm
        by_name = dict(zip(have_out, zip(self.output_slots, self.outputs)))
        self.output_slots = tuple(by_name[n][0] for n in output_names)
        self.outputs = [by_name[n][1] for n in output_names]
        self._loop = self._native_loop()
        self._bound = {sig: self._native_loop(natives) for sig, natives in self._bindings.items()}
        self._latest_loop = None
        self._call.set_perm(self._input_perm)
        self._call.set_loop(self._loop)
        for sig, loop in self._bound.items():
            self._call.track(sig, loop)
        for sig in self._scouted:
            self._call.track(sig, self._latest())
        if self._marked:
            self.mark_partition_outputs()

    def _native_loop(self, natives: Sequence[Any] | None = None) -> Any:
        """The extension's StepLoop over this program's steps (with a signature's native steps)."""
        if _extension is None:
            raise ImportError("npu_ep.ep._native is not built: a compiled program runs on its native loop "
                              "(build it: python setup.py build_ext --inplace)")
        natives = natives or [None] * len(self.steps)
        steps = [(st.kernel.run, st.prepared, st.in_slots,
                  tuple((i, slot) for i, slot in enumerate(st.out_slots) if slot >= 0), st.release, native)
                 for st, native in zip(self.steps, natives, strict=True)]
        program_steps = self.steps  # not self: a cycle through an extension object is never collected
        return _extension.StepLoop(steps, self.n_slots, self.output_slots,
                                   lambda j, args, exc: _failure(program_steps[j], args, exc))

    def mark_partition_outputs(self) -> None:
        """Tell each step which of its outputs are outputs of this partition (their ORT index), so a kernel that
        can compute one straight into ORT's buffer does (``kernels.runtime.ort_output``). Only for the programs
        ORT calls: a sub-program's outputs (If branches, Loop bodies) go back to its owner, not to ORT."""
        self._marked = True
        first: dict[int, int] = {}
        for j, slot in enumerate(self.output_slots):
            first.setdefault(slot, j)  # an output listed twice: the second is copied from the first
        for st in self.steps:
            st.prepared.runtime.partition_outputs = {i: first[s] for i, s in enumerate(st.out_slots) if s in first}

    @property
    def native_step_counts(self) -> tuple[int, int]:
        """(native step runs, inputs a native step declined) over the signatures whose native steps are kept and
        the loop over the steps' latest native steps (``_scout``)."""
        loops = [*self._bound.values(), *([self._latest_loop] if self._latest_loop is not None else [])]
        counts = [loop.native_counts for loop in loops]
        return sum(r for r, _ in counts), sum(d for _, d in counts)

    @property
    def calls(self) -> int:
        """Every call so far (evicted signatures' included)."""
        return sum(c for c, _ in self._folded().values()) + self._evicted_calls + self._late_counts()[0]

    @property
    def host_ns(self) -> int:
        return sum(ns for _, ns in self._folded().values()) + self._evicted_ns + self._late_counts()[1]

    @property
    def signatures(self) -> dict[tuple, int]:
        """Input-shape signature -> number of calls, for the kept signatures (at most ``SIGNATURES_KEPT``)."""
        return {sig: c for sig, (c, _) in self._folded().items()}

    def _late_counts(self) -> tuple[int, int]:
        """(calls, ns) of hot-path calls that finished after their signature was evicted."""
        return tuple(self._call.late_counts())

    def _folded(self) -> dict[tuple, tuple[int, int]]:
        """Every call of the kept signatures: signature -> (calls, host ns)."""
        with self._lock:
            folded = {sig: (st.calls, st.ns) for sig, st in self._signatures.items()}
        for sig, (c, ns) in self._call.counts().items():
            have = folded.get(sig, (0, 0))
            folded[sig] = (have[0] + c, have[1] + ns)
        return folded

    def __call__(self, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The outputs for ``inputs`` in ORT's order: the call ORT's partition calls make directly
        (``ep/native/program_call.h``)."""
        return self._call(inputs)

    def _observe(self, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """A call that observes (inputs in the program's order): the first with a new input-shape signature keeps
        every step's input shapes for the cost model and binds native steps; recording keeps every intermediate
        tensor. It runs on the native loop too (``StepLoop.observe``), the observer (``_Observation``) choosing each
        step's native step. The hot path (``self._call``) does neither; a known signature's call comes here only
        while recording, or after its signature was evicted."""
        t0 = perf_counter_ns()
        signature = tuple([a.shape for a in inputs])
        if signature not in self._signatures and not self.record and self._latest_natives:
            return self._scout(signature, inputs, t0)
        seen = _Observation(self, first=signature not in self._signatures or signature in self._pending,
                            record=self.record)
        token = _ERRSTATE.set(_IGNORE_ALL)
        try:
            result = self._loop.observe(inputs, seen.before, seen.after)
        finally:
            _ERRSTATE.reset(token)
        step_shapes, natives = seen.step_shapes, seen.natives
        elapsed = perf_counter_ns() - t0
        with self._lock:
            if step_shapes is not None and natives and any(n is not None for n in natives):
                self._keep_bound(signature, natives)
            state = self._signatures.get(signature)
            if state is None:  # a first call (or one whose signature was evicted meanwhile: then without a cost)
                state = self._admit(signature, step_shapes, self._bound.get(signature))
            elif self._pending.pop(signature, 0) is None:  # a scouted signature's second call: now on the hot path
                self._track(signature, self._bound.get(signature))
            state.calls += 1
            state.ns += elapsed
        return result

    def _scout(self, signature: tuple, inputs: tuple[np.ndarray, ...], t0: int) -> tuple[np.ndarray, ...]:
        """A new signature's first call without the observer (a decoder's past one longer every token is one per
        token): the steps' latest native steps run it, each declining inputs it was not bound for (its kernel runs
        then), and the loop returns the step shapes the cost model needs. When every native step took its inputs,
        the signature is kept on that loop; else its next call observes, binding native steps for its inputs."""
        loop = self._latest()
        token = _ERRSTATE.set(_IGNORE_ALL)
        try:
            result, step_shapes, declined = loop.scout(inputs)
        finally:
            _ERRSTATE.reset(token)
        elapsed = perf_counter_ns() - t0
        if declined or self._declines:
            self._bind_declined(declined)
        with self._lock:
            state = self._signatures.get(signature)
            if state is None:  # (else another thread kept it meanwhile) _admit, inlined: every token of a decoder
                self._signatures[signature] = _SignatureState(None, 1, elapsed, step_shapes)
                for sig, calls, ns in self._call.track(signature, loop, bool(declined)):
                    self._evict(sig, calls, ns)
                (self._pending if declined else self._scouted)[signature] = None
            else:
                state.calls += 1
                state.ns += elapsed
        return result

    def _bind_declined(self, declined: list[tuple[int, tuple, Any]]) -> None:
        """Bind a native step for each step whose latest one declined in a scouted call, so the next signature of
        the same step inputs takes it (a decoder's first decode token after its prefill); a step that declines
        again in the next scout has inputs that change every call (a mask as long as the past) and keeps its
        kernel until its native step takes a call again."""
        now = {j for j, _, _ in declined}
        self._declines = {j: n for j, n in self._declines.items() if j in now}
        for j, args, outs in declined:
            n = self._declines[j] = self._declines.get(j, 0) + 1
            if n == 1:
                step = self.steps[j]
                self._bind_step(_step_key(step, args, self._keyed_values[id(step)]), step, args, outs)

    def _latest(self) -> Any:
        """The loop over each step's latest native step (None for a step that never bound one)."""
        loop = self._latest_loop
        if loop is None:
            loop = self._latest_loop = self._native_loop([self._latest_natives.get(id(st)) for st in self.steps])
        return loop

    def _keep_bound(self, signature: tuple, natives: list) -> None:
        """Run this signature's later calls with its native steps; only the latest ``_BOUND_SIGNATURES`` keep
        theirs (the extension then runs the others on the steps' latest native steps). Under ``_lock``."""
        while len(self._bindings) >= _BOUND_SIGNATURES:
            oldest = next(iter(self._bindings))
            del self._bindings[oldest]
            self._bound.pop(oldest, None)
            if oldest in self._signatures and oldest not in self._pending:
                self._call.track(oldest, self._latest())  # on the steps' latest native steps from now on
                self._scouted[oldest] = None
        self._bindings[signature] = natives
        self._bound[signature] = self._native_loop(natives)

    def _admit(self, signature: tuple, step_shapes: list | None, loop: Any, *,
               observe_next: bool = False) -> _SignatureState:
        """Keep a new signature on ``loop`` (None: the default loop); from now on it takes the hot path, or, with
        ``observe_next``, its next call observes. Under ``_lock``."""
        state = self._signatures[signature] = _SignatureState(None, step_shapes=step_shapes)
        self._track(signature, loop, observe_next=observe_next)
        return state

    def _track(self, signature: tuple, loop: Any, *, observe_next: bool = False) -> None:
        """Run ``signature``'s calls on ``loop`` in the extension (its next one observing, with ``observe_next``),
        and evict the least recently used signature beyond ``SIGNATURES_KEPT``: the extension picks it by its own
        clock of hot-path calls. Under ``_lock``."""
        for sig, calls, ns in self._call.track(signature, loop, observe_next):
            self._evict(sig, calls, ns)

    def _evict(self, signature: tuple, hot_calls: int, hot_ns: int) -> None:
        """Fold a signature's counts and emulated time into the totals and drop everything kept for it."""
        state = self._signatures.pop(signature, None) or _SignatureState(None)
        calls = hot_calls + state.calls
        self._evicted_calls += calls
        self._evicted_ns += hot_ns + state.ns
        if state.cost is not None:
            self._evicted_seconds += state.cost.seconds * calls
        elif state.step_shapes is not None:
            unpriced = self._unpriced
            for j, shapes in enumerate(state.step_shapes):
                key = (j, shapes if isinstance(shapes, bytes) else tuple(shapes))
                unpriced[key] = unpriced.get(key, 0) + calls
            if len(unpriced) >= _STEP_MEMO_KEPT:
                self._price_evicted()
        self._bindings.pop(signature, None)
        self._bound.pop(signature, None)
        self._scouted.pop(signature, None)
        self._pending.pop(signature, None)
        self.evicted_signatures += 1

    def _record(self, step: Step, outs: Sequence[np.ndarray | None]) -> None:
        for i, value in enumerate(outs):
            if value is not None:  # an omitted optional output a kernel did not compute
                self.recorded[f"{step.node_name}:{i}"] = np.array(value, copy=True)

    def _bind_step(self, key: tuple | None, step: Step, args: Sequence[Any], outs: Sequence[Any]) -> Any:
        """``_bind``, kept under ``key`` (``_step_key``): a later signature whose call gives the step the same key
        runs this native step at once, in its first call too, and takes it without binding again."""
        native = _bind(step, args, outs, self._shape_derived)
        if key is not None:
            self._keep_native(key, step, native)
        return native

    def _keep_native(self, key: tuple, step: Step, native: Any) -> None:
        """Keep ``native`` for ``key``, and first among the step's latest native steps (tried for a key not seen
        yet, most recent first: a native step that takes inputs of other shapes, such as a decoder's growing past,
        serves them all, and a step alternating between a few shapes finds its own)."""
        if len(self._step_natives) >= _STEP_MEMO_KEPT:
            self._step_natives.clear()
        self._step_natives[key] = native
        recent = self._recent_natives.setdefault(id(step), [])
        if native is not None and native is not self._latest_natives.get(id(step)) and native not in recent[:1]:
            recent[:] = [native, *(n for n in recent if n is not native)][:_RECENT_NATIVES]
            self._latest_natives[id(step)] = recent[0] if len(recent) == 1 else _extension.FirstOfSteps(recent)
            self._latest_loop = None  # built again with it when next needed

    def _price_evicted(self) -> None:
        """Fold the emulated time of the evicted signatures not priced yet into the totals. Under ``_lock``."""
        if self._unpriced:
            cycles = sum(self._step_cost(self.steps[j], shapes).cycles * calls
                         for (j, shapes), calls in self._unpriced.items())
            self._evicted_seconds += self.target.cycles_to_seconds(cycles)
            self._unpriced.clear()

    def _cost(self, step_shapes: Sequence[Sequence | bytes], steps: Sequence[Step] | None = None) -> RunCost:
        """The cost of one call from each step's input shapes (a list of shapes, or a scouted call's bytes)."""
        steps = self.steps if steps is None else steps
        costs = [self._step_cost(step, shapes) for step, shapes in zip(steps, step_shapes)]
        cycles = sum(c.cycles for c in costs)
        return RunCost(costs, cycles, self.target.cycles_to_seconds(cycles), sum(c.dma_bytes for c in costs))

    def _step_cost(self, step: Step, shapes: Sequence | bytes) -> OpCost:
        """A step's cost from its input shapes: memoized by them (a scouted call's bytes unpacked only when new)."""
        keys = [(id(step), shapes if isinstance(shapes, bytes) else tuple(shapes))]
        cost = self._step_costs.get(keys[0])
        if cost is None and isinstance(shapes, bytes):  # known by its shapes (an observed call's)?
            shapes = _step_shapes(shapes)
            keys.append((id(step), tuple(shapes)))
            cost = self._step_costs.get(keys[1])
            if cost is not None:
                self._step_costs[keys[0]] = cost
        if cost is None:
            known = step.const_shapes
            shapes = [known[i] if s is None and i in known else s for i, s in enumerate(shapes)]
            try:
                cost = step.kernel.cost(step.prepared, shapes)
            except Exception as exc:  # noqa: BLE001 - the emulated timeline must never break inference
                logger.warning("cost model failed for %s (shapes %s): %s: %s", step.describe(), shapes,
                               type(exc).__name__, exc)
                cost = OpCost()
            else:
                if len(self._step_costs) >= _STEP_MEMO_KEPT:
                    self._step_costs.clear()
                self._step_costs.update(dict.fromkeys(keys, cost))
        return cost

    def static_cost(self, unknown_dim: int | None = None) -> tuple[RunCost, list[tuple[Step, str]]]:
        """The cost model on the graph's declared shapes (no run needed): what ``npu-report`` shows for a model
        it does not run and what the cost-aware policy weighs. Symbolic dims become ``unknown_dim``; with None, a
        step whose shapes stay symbolic is skipped and returned with the reason."""
        shapes, skipped, kept = [], [], []
        for step in self.steps:
            if not step.declared and step.in_slots:
                skipped.append((step, "declared shapes not kept (a context compiled by an older NpuEP)"))
                continue
            resolved = [_resolve(s, unknown_dim) for s in step.declared]
            if any(r is False for r in resolved):
                ranked = all(s != UNKNOWN_RANK for s in step.declared)
                skipped.append((step, "symbolic shape: pass --dim name=value" if ranked else "input of unknown rank"))
                continue
            kept.append(step)
            shapes.append(resolved)
        return self._cost(shapes, kept), skipped

    def cost_for(self, signature: tuple) -> RunCost | None:
        """The cost of a kept signature (None: never seen, or evicted)."""
        with self._lock:
            state = self._signatures.get(signature)
            return self._state_cost(state) if state is not None else None

    def _state_cost(self, state: _SignatureState) -> RunCost | None:
        """A kept signature's cost, computed from its first call's step shapes when first asked for."""
        if state.step_shapes is not None:
            state.cost, state.step_shapes = self._cost(state.step_shapes), None
        return state.cost

    def emulated_seconds(self) -> float:
        """Emulated NPU time of every call so far (a call still running when its signature was evicted counts in
        ``calls`` and ``host_ns`` only)."""
        folded = self._folded()
        with self._lock:
            self._price_evicted()
            costs = {sig: self._state_cost(st) for sig, st in self._signatures.items()}
        kept = sum(costs[s].seconds * c for s, (c, _) in folded.items() if costs.get(s) is not None)
        return kept + self._evicted_seconds


_UNBOUND = object()


class _Observation:
    """What an observing call (``Program._observe``) decides and keeps while the native loop runs it
    (``StepLoop.observe``). Before each step: the native step to try, one bound for the same step inputs under any
    signature (``_step_key``), else the step's latest. After it: on a first call the step's input shapes (the cost
    model's) and its native step, bound now when none took the inputs; while recording, its outputs."""

    def __init__(self, program: Program, *, first: bool, record: bool):
        self.program = program
        self.step_shapes: list[list] | None = [] if first else None
        self.natives: list | None = [] if first and not record else None
        self.record = record
        self._tried: tuple = (None, _UNBOUND, False)  # this step's key, the native step tried, whether key was known

    def before(self, j: int, args: tuple) -> Any:
        """The native step to try on step ``j``'s ``args``, or None (its kernel runs)."""
        if self.step_shapes is not None:
            self.step_shapes.append([a.shape if a is not None else None for a in args])
        if self.natives is None:
            return None
        program, step = self.program, self.program.steps[j]
        key = _step_key(step, args, program._keyed_values[id(step)])
        native = program._step_natives.get(key, _UNBOUND) if key is not None else _UNBOUND
        known = native is not _UNBOUND
        if not known and key is not None:  # the step's latest native step may take these inputs too
            native = program._latest_natives.get(id(step), _UNBOUND)
        self._tried = (key, native, known)
        return native if native is not _UNBOUND else None

    def after(self, j: int, args: tuple, outs: Sequence[Any], ran_native: bool) -> None:
        """Step ``j`` returned ``outs`` (from the native step tried, when ``ran_native``)."""
        step = self.program.steps[j]
        if self.natives is not None:
            key, native, known = self._tried
            if not ran_native:  # no native step yet, or it declined these inputs (then bound anew)
                native = _UNBOUND if native is not None or not known else native
            if native is _UNBOUND:
                native = self.program._bind_step(key, step, args, outs)
            elif not known:
                self.program._keep_native(key, step, native)
            self.natives.append(native)
        if self.record:
            self.program._record(step, outs)


def _step_key(step: Step, args: Sequence[Any], values: bool) -> tuple | None:
    """What a step's native step is bound for, in any signature: its inputs' dtype, shape and layout (a signature's
    native step is bound on its first call's data and checks every later call's inputs itself, declining values it
    was not bound for); with ``values`` (a shape-derived step: the same values on every call of a signature, which
    its memo holds to) also the bytes of small inputs. None when an input is neither an array nor omitted."""
    parts: list = [id(step)]
    for a in args:
        if a is None:
            parts.append(None)
        elif not isinstance(a, np.ndarray):
            return None
        elif values and a.nbytes <= FIXED_INPUT_BYTES:
            parts.append((a.dtype.str, a.shape, a.flags.c_contiguous, a.tobytes()))
        else:
            parts.append((a.dtype.str, a.shape, a.flags.c_contiguous))
    return tuple(parts)


def _step_shapes(packed: bytes) -> list[tuple[int, ...] | None]:
    """A step's input shapes from a scouted call (``StepLoop.scout``: its input count, then per input its rank, -1
    for a value that is not an array, and its dims): a shape tuple per input, None for one that is not an array."""
    flat = np.frombuffer(packed, np.int64).tolist()
    shapes, i = [], 1
    for _ in range(flat[0]):
        rank, i = flat[i], i + 1
        shapes.append(tuple(flat[i:i + rank]) if rank >= 0 else None)
        i += max(rank, 0)
    return shapes


def _bind(step: Step, args: Sequence[Any], outs: Sequence[Any], shape_derived: set[int]) -> Any:
    """The step's native step for these inputs, or None; binding never breaks a call (the kernel keeps running)."""
    derived = all(s in shape_derived for s in step.in_slots if s >= 0)
    try:
        return step_binding.bind(step.op, step.kernel, step.prepared, args, outs, _extension,
                                 shape_derived=derived)
    except Exception as exc:  # noqa: BLE001 - an optimization that failed, not an error of the model
        logger.debug("no native step for %s: %s: %s", step.describe(), type(exc).__name__, exc)
        return None


def _resolve(shape: tuple | None, unknown_dim: int | None) -> tuple | bool | None:
    """A declared shape with symbolic/unknown dims replaced by ``unknown_dim``; False if that is None."""
    if shape is None:
        return None
    if shape == UNKNOWN_RANK:
        return False
    if all(isinstance(d, int) and d >= 0 for d in shape):
        return tuple(shape)
    if unknown_dim is None:
        return False
    return tuple(d if isinstance(d, int) and d >= 0 else unknown_dim for d in shape)


def _failure(step: Step, args: Sequence[np.ndarray | None], exc: Exception) -> NpuRuntimeError:
    shapes = ", ".join("-" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
    return NpuRuntimeError(f"{step.describe()} failed on inputs ({shapes}): {type(exc).__name__}: {escape(str(exc))}")
