"""Generation's entry points, as NPU compilers compile them: the first prefill, prefill with history (a chunk
appended after the valid past) and decode, each for a static bucket (S new tokens, P past slots).

NpuEP compiles a partition once into a ``Program`` (its weights prepared and packed once, ``ep.weight_arena``);
each distinct input-shape signature the program is called with gets its own cost and native step bindings
(``ep.program``). An entry is such a signature, named: the generator tells the table which entry a step runs,
and the entry's first call records the signature each NpuEP program was called with (the programs' own call
counts, read before and after that call only: later calls count here without touching the programs). Every entry
therefore runs the same programs, so the weights exist once whatever the number of entries (``weight_bytes``: the
distinct weight buffers the programs hold), and all entries read and write the generator's one KV cache.

The table of a session's entries is kept beside its NpuEP session (``entries_of``), so ``npu_ep.report(session)``
names them: which entry ran, its bucket, its calls and emulated time. A generator that creates its session declares
its possible entries to it (``declared_entries``), and an EPContext model dumped from that session names them in
its nodes' notes; the compile cache's entries hold the programs only.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

PREFILL, PREFILL_HISTORY, DECODE = "prefill", "prefill_history", "decode"
KINDS = (PREFILL, PREFILL_HISTORY, DECODE)

_TABLES: weakref.WeakKeyDictionary[Any, EntryTable] = weakref.WeakKeyDictionary()
_KV_DECODE: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class Entry:
    kind: str                                   # PREFILL, PREFILL_HISTORY or DECODE
    bucket: tuple[int, int]                     # (S executed new tokens, P past slots fed)
    calls: int = 0
    host_s: float = 0.0
    npu_s: float = 0.0                          # emulated NPU seconds
    logical_tokens: int = 0                     # new tokens that mattered, over every call
    signatures: dict[str, list] = dataclasses.field(default_factory=dict)  # NpuEP program -> its input shapes

    @property
    def name(self) -> str:
        s, p = self.bucket
        return f"{self.kind}[S={s},P={p}]"

    @property
    def executed_tokens(self) -> int:
        return self.calls * self.bucket[0]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "new_tokens": self.bucket[0], "past_slots": self.bucket[1],
                "calls": self.calls, "host_s": self.host_s, "npu_s": self.npu_s,
                "logical_tokens": self.logical_tokens, "executed_tokens": self.executed_tokens,
                "programs": {name: [list(s) for s in sig] for name, sig in self.signatures.items()}}


def declared_entries(sizes: Sequence[int], chunked: bool, capacity: int, first_past: int) -> list[str]:
    """The entry points a generator may run, named before its session compiles (``ep.entry_points.ENTRIES_CONFIG_KEY``:
    the EPContext node's notes carry them): a first prefill and, chunked, a prefill with history per step size,
    and decode. ``first_past``: the past slots a first prefill is fed (0, or the capacity when the KV is resident)."""
    names = [Entry(PREFILL, (s, first_past)).name for s in sizes]
    if chunked:
        names += [Entry(PREFILL_HISTORY, (s, capacity)).name for s in sizes]
    return [*names, Entry(DECODE, (1, capacity)).name]


def _snapshot(eps: Sequence[Any]) -> dict[str, dict[tuple, int]]:
    return {name: dict(p.signatures) for ep in eps for name, p in list(ep.programs.items())}


class EntryTable:
    """The entries a generator ran on one session (NpuEP or not), in first-use order."""

    def __init__(self, eps: Sequence[Any] = (), *, register: bool = True):
        self.eps = list(eps)
        self.entries: dict[tuple[str, tuple[int, int]], Entry] = {}
        for ep in self.eps if register else ():
            _TABLES[ep] = self

    def entry(self, kind: str, bucket: tuple[int, int]) -> Entry:
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r} (known: {', '.join(KINDS)})")
        return self.entries.setdefault((kind, bucket), Entry(kind, bucket))

    def before_call(self, entry: Entry) -> dict | None:
        """The programs' call counts before an entry's first call (None for later calls: nothing to read)."""
        return _snapshot(self.eps) if entry.calls == 0 and self.eps else None

    def after_call(self, entry: Entry, before: dict | None, logical: int, host_s: float, npu_s: float) -> None:
        if before is not None:  # the signature each program gained a call under is the entry's
            for name, sigs in _snapshot(self.eps).items():
                gained = [sig for sig, n in sigs.items() if n > before.get(name, {}).get(sig, 0)]
                if len(gained) == 1:
                    entry.signatures[name] = [tuple(s) for s in gained[0]]
        entry.calls += 1
        entry.host_s += host_s
        entry.npu_s += npu_s
        entry.logical_tokens += logical

    def weight_bytes(self) -> int:
        """Bytes of the distinct weight buffers (constants of at least ``WEIGHT_MIN_BYTES``) the NpuEP programs'
        steps hold, each buffer counted once (arena slices and ORT's initializers alike): what every entry reads."""
        seen: dict[int, int] = {}
        for ep in self.eps:
            for program in list(ep.programs.values()):
                for step in program.steps:
                    for value in step.prepared.consts.values():
                        _count_buffer(value, seen)
        return sum(seen.values())

    def rows(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.entries.values()]


WEIGHT_MIN_BYTES = 64 << 10  # smaller constants (scales, norms) are not weights worth counting


def _count_buffer(value: Any, seen: dict[int, int]) -> None:
    """Record an array's memory range by its start address (views of one buffer count once)."""
    if isinstance(value, np.ndarray) and value.nbytes >= WEIGHT_MIN_BYTES:
        seen[value.__array_interface__["data"][0]] = max(seen.get(value.__array_interface__["data"][0], 0),
                                                        value.nbytes)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _count_buffer(item, seen)


def entries_of(ep_session: Any) -> EntryTable | None:
    """The entry table of the generator created last on this NpuEP session, if one was. Generators sharing a
    session each keep their own table (their calls never mix); an entry's signatures are read around its first call,
    so another thread's call of the same programs at that moment can hide them (then the entry names none)."""
    return _TABLES.get(ep_session)


def record_kv_decode(eps: Sequence[Any], kv: dict[str, Any], steps: int, npu_s: float, inter_token_s: float) -> None:
    """Keep a generation's KV facts per decode step (``GenerationResult.kv_decode``) beside its NpuEP sessions, one
    record per KV mode (the last generation of that mode wins), with the decode step's mean emulated NPU and
    inter-token seconds: generators of different modes on one session are then reported side by side."""
    record = {**kv, "decode_steps": steps, "npu_s": npu_s / steps, "inter_token_s": inter_token_s / steps}
    for ep in eps:
        _KV_DECODE.setdefault(ep, {})[kv["mode"]] = record


def kv_decode_of(ep_session: Any) -> list[dict[str, Any]]:
    """The KV records of the modes generators ran on this NpuEP session (``record_kv_decode``), in first-run order."""
    return list(_KV_DECODE.get(ep_session, {}).values())
