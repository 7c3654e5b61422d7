"""How a kernel that holds graphs (``If``) compiles and reloads them, without importing the layer above.

Compiling a branch is the compiler's job (``ep.compiler``); the compiler registers its two functions here when it
is imported, so ``kernels`` keeps depending only downward. A branch program travels as plain parts (a JSON-able
header and named arrays), like every compiled program in the cache and in EPContext payloads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Parts = tuple[dict[str, Any], dict[str, np.ndarray]]
_compile: Callable[..., Parts] | None = None
_load: Callable[[dict[str, Any], dict[str, np.ndarray], Any], Any] | None = None


def register(compile_fn: Callable[..., Parts], load_fn: Callable[[dict[str, Any], dict[str, np.ndarray], Any], Any]) -> None:
    """Called once by ``ep.compiler``: ``compile_fn(name, nodes, inputs, outputs, target) -> (header, arrays)``,
    ``load_fn(header, arrays, target) -> program``."""
    global _compile, _load
    _compile, _load = compile_fn, load_fn


def compile_parts(name: str, nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any], target) -> Parts:
    if _compile is None:
        raise RuntimeError("no compiler registered for subgraphs (import npu_ep.ep.compiler first)")
    return _compile(name, nodes, inputs, outputs, target)


def load_program(header: dict[str, Any], arrays: dict[str, np.ndarray], target) -> Any:
    if _load is None:
        raise RuntimeError("no compiler registered for subgraphs (import npu_ep.ep.compiler first)")
    return _load(header, arrays, target)
