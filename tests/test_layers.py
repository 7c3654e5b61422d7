"""The package's layering as the README states it: ``kernels/runtime.py`` is the only module that loads the native
extension (``npu_ep.ep._native``); every other module reaches it through ``kernels.runtime``, so the one upward
import (kernels -> ep) stays in one place."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "npu_ep.ep._native"
LOADER = "kernels/runtime.py"
NOT_PACKAGE = ("tests", "build", ".venv", "dist")


def _package_modules() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in NOT_PACKAGE]


def _module_name(path: Path) -> str:
    parts = ["npu_ep", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, tree: ast.AST) -> set[str]:
    """Every module an import statement of ``path`` names, relative imports resolved, ``from X import y`` giving
    both X and X.y (y may be a submodule)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def extension_importers() -> list[str]:
    out = []
    for path in _package_modules():
        if EXTENSION in _imported(path, ast.parse(path.read_text(), str(path))):
            out.append(path.relative_to(ROOT).as_posix())
    return sorted(out)


def test_only_kernels_runtime_imports_the_extension():
    assert extension_importers() == [LOADER]


def test_the_check_sees_relative_and_absolute_imports_of_the_extension(tmp_path):
    ep_module = ROOT / "ep" / "x.py"
    for text in ("from . import _native", "from ._native import CallStep", "import npu_ep.ep._native",
                 "from npu_ep.ep import _native as ext"):
        assert EXTENSION in _imported(ep_module, ast.parse(text)), text
    tools_module = ROOT / "tools" / "bench" / "x.py"
    assert EXTENSION in _imported(tools_module, ast.parse("from ...ep import _native"))
    assert EXTENSION not in _imported(tools_module, ast.parse("from ...kernels.runtime import extension"))
