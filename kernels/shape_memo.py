"""Bounded run-time memos keyed by input shape.

Kernels keep what they derive from a call's input shape (pad and convolution geometry, Slice indexes, tile plans,
native call arguments) so that a repeated shape costs no Python. A decoder whose past grows gives a new shape every
token for the session's whole life, so such entries must not pile up: every shape-keyed entry goes through a
``ShapeMemo``, which keeps the ``SHAPES_KEPT`` most recently used shapes of one kind, as a program keeps its
``SIGNATURES_KEPT`` most recent signatures (``ep.program``). A shape evicted and seen again is derived anew. The
planner's process-wide plan cache is a ``ShapeMemo`` too (``planner.PLANS_KEPT``).

Entries that do not depend on the shape (weights packed once per Prepared, per-rank or per-dtype constants) stay
plain ``Prepared.kernel_cache`` entries; what the program tells a step is its ``Prepared.runtime`` record.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .registry import Prepared

T = TypeVar("T")

SHAPES_KEPT = 64  # shapes one kind of a Prepared's memo keeps: ep.program.SIGNATURES_KEPT, the signatures it keeps


class ShapeMemo(OrderedDict):
    """A mapping of the ``capacity`` most recently used keys; the least recently used one goes first.

    Safe across threads under the GIL without a lock: every step is one OrderedDict operation, a key another thread
    evicted meanwhile is just made again, and two racing inserts at most evict one entry early."""

    def __init__(self, capacity: int = SHAPES_KEPT) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"ShapeMemo: capacity {capacity} (must be at least 1)")
        self.capacity = capacity

    def recall(self, key: Hashable, default: Any = None) -> Any:
        """The value kept for ``key`` (now the most recently used), or ``default``."""
        try:
            value = self[key]
        except KeyError:
            return default
        try:
            self.move_to_end(key)
        except KeyError:  # evicted by another thread since the read: the value read is still right
            pass
        return value

    def keep(self, key: Hashable, value: T) -> T:
        """Keep ``value`` for ``key`` as the most recently used, evicting the least recently used beyond capacity."""
        self[key] = value
        try:
            self.move_to_end(key)  # a key kept before: assigning it again left it where it was
        except KeyError:  # evicted by another thread meanwhile
            pass
        while len(self) > self.capacity:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
        return value


_MISSING = object()


def shape_memo(p: Prepared, kind: str) -> ShapeMemo:
    """The bounded memo of ``kind`` (one per kind of derived value) in ``p.kernel_cache``, made on first use."""
    table = p.kernel_cache.get(kind)
    if table is None:
        table = p.kernel_cache.setdefault(kind, ShapeMemo())
    return table


def memo_per_shape(p: Prepared, kind: str, key: Hashable, make: Callable[..., T], *args: Any) -> T:
    """``make(*args)`` for this shape ``key``, made once while ``p`` keeps the key among its ``SHAPES_KEPT`` latest.
    Kernels call this on every run, so a hit is kept to two lookups and the recency update (``make`` takes
    arguments: a closure would be built on every call)."""
    try:
        table = p.kernel_cache[kind]
        value = table[key]
    except KeyError:
        value = _MISSING
    if value is _MISSING:  # made outside the handler: an error of make's is not chained to the lookup's
        return shape_memo(p, kind).keep(key, make(*args))
    try:
        table.move_to_end(key)
    except KeyError:  # evicted by another thread since the read
        pass
    return value
