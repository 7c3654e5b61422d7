"""The native code's layers, read from its ``#include "..."`` lines: no include loop between units in ``ep/native``
and ``kernels/native``, and the kernels never include the ORT shim or the executor (``ep/native``): they know the
host only as a ``HostLoop`` and run in kernel tests without ORT.

A unit is ``foo.cc`` with ``foo.h`` and its private header ``foo_internal.h`` (shared by the unit's own files, such
as the AVX-512 halves of ``matmul_nbits``), which builds on the public header and is no layer of its own."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FOLDERS = ("ep/native", "kernels/native")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

Unit = str  # "folder/stem", e.g. "kernels/native/conv"


def _unit(path: Path) -> Unit:
    unit = str(path.relative_to(ROOT).with_suffix("")).replace("\\", "/")
    return unit.removesuffix("_internal")


def _resolve(includer: Path, written: str) -> Path | None:
    """The file an include names, as the build finds it (the includer's folder, then the repo root: setup.py's
    include_dirs); None for a header outside the tree (ORT's, pybind11's)."""
    for base in (includer.parent, ROOT):
        if (base / written).is_file():
            return (base / written).resolve()
    return None


def include_graph(root: Path = ROOT) -> dict[Unit, set[Unit]]:
    """unit -> the units its files include (a unit's include of its own header is not an edge)."""
    graph: dict[Unit, set[Unit]] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).glob("*")):
            if path.suffix not in (".cc", ".h"):
                continue
            edges = graph.setdefault(_unit(path), set())
            for written in _INCLUDE.findall(path.read_text(encoding="utf-8")):
                target = _resolve(path, written)
                if target is not None and _unit(target) != _unit(path):
                    edges.add(_unit(target))
    return graph


def cycles(graph: dict[Unit, set[Unit]]) -> list[list[Unit]]:
    """One include loop per strongly connected component of more than one unit (Tarjan), as a path a -> ... -> a."""
    index: dict[Unit, int] = {}
    low: dict[Unit, int] = {}
    stack: list[Unit] = []
    found: list[list[Unit]] = []

    def visit(u: Unit) -> None:
        index[u] = low[u] = len(index)
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if v not in index:
                visit(v)
                low[u] = min(low[u], low[v])
            elif v in stack:
                low[u] = min(low[u], index[v])
        if low[u] == index[u]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == u:
                    break
            if len(component) > 1:
                found.append(_loop_through(graph, set(component)))

    for u in sorted(graph):
        if u not in index:
            visit(u)
    return found


def _loop_through(graph: dict[Unit, set[Unit]], component: set[Unit]) -> list[Unit]:
    """A path from the component's first unit back to itself, inside the component (for the message)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for u in frontier:
            for v in sorted(graph.get(u, ()) & component):
                if v == start:
                    return [*paths[u], start]
                if v not in paths:
                    paths[v] = [*paths[u], v]
                    nxt.append(v)
        frontier = nxt
    return sorted(component)


def test_the_include_graph_is_read_from_the_sources():
    graph = include_graph()
    assert "ep/native/partition_kernel" in graph and "kernels/native/conv" in graph
    assert "ep/native/step_loop" in graph["ep/native/program_call"]  # a quoted include in the same folder
    assert "kernels/native/thread_pool" in graph["ep/native/partition_kernel"]  # one named from the repo root
    assert sum(len(e) for e in graph.values()) > 80
    assert "kernels/native/matmul_nbits_internal" not in graph  # a private header belongs to its unit


def test_the_cycle_finder_reports_a_loop_as_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_native_units_include_each_other_without_loops():
    loops = cycles(include_graph())
    assert not loops, "include loops between native units: " + "; ".join(" -> ".join(c) for c in loops)


def test_the_native_kernels_never_include_the_shim_or_the_executor():
    upward = sorted(f"{u} -> {v}" for u, edges in include_graph().items() if u.startswith("kernels/native/")
                    for v in edges if v.startswith("ep/"))
    assert not upward, "kernels/native includes ep/native: " + ", ".join(upward)
