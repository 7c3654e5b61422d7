"""How a kernel that holds graphs (``If``, ``Loop``, ``Scan``) compiles and reloads them, without importing the
layer above.

Compiling a branch or body is the compiler's job: ``COMPILER`` names the module (``ep.compiler``: its
``compile_parts`` and ``load_program``), looked up when a graph is first compiled or loaded rather than imported,
since ``ep`` imports ``kernels``; nothing registers itself on import. A sub-program travels as plain parts (a JSON-able
header and named arrays), like every compiled program in the cache and in EPContext payloads, stored in its owner's
Prepared: the header under ``attrs[key]``, the arrays under ``consts['key/...']``.

A sub-program belongs to its owner: its steps run with the owner's kernel setting (``kernels=native|reference``,
host threads; ``kernels.runtime``), whether the session stamps the owner before or after the sub-program is
loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

Parts = tuple[dict[str, Any], dict[str, np.ndarray]]
# the module that compiles and loads graphs, relative to this package: compile_parts(name, nodes, inputs, outputs,
# target) -> (header, arrays); load_program(header, arrays, target) -> program
COMPILER = "..ep.compiler"


def _compiler() -> ModuleType:
    return importlib.import_module(COMPILER, __package__)


def compile_parts(name: str, nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any], target) -> Parts:
    return _compiler().compile_parts(name, nodes, inputs, outputs, target)


def load_program(header: dict[str, Any], arrays: dict[str, np.ndarray], target) -> Any:
    return _compiler().load_program(header, arrays, target)


def program(owner: Any, key: str) -> Any:
    """The sub-program stored under ``key`` in the Prepared ``owner``, loaded on first use (kept in the owner's
    ``StepRuntime.subprograms``); its steps take the owner's kernel choice and threads (``runtime.configure``
    re-stamps loaded sub-programs)."""
    loaded = owner.runtime.subprograms
    found = loaded.get(key)
    if found is None:
        prefix = f"{key}/"
        arrays = {k[len(prefix):]: v for k, v in owner.consts.items() if k.startswith(prefix)}
        found = load_program(owner.attrs[key], arrays, owner.target)
        for step in found.steps:
            step.prepared.runtime.kernels = owner.runtime.kernels
            step.prepared.runtime.threads = owner.runtime.threads
        loaded[key] = found
    return found


def loaded_programs(owner: Any) -> list[Any]:
    """The sub-programs of ``owner`` loaded so far."""
    return list(owner.runtime.subprograms.values())
