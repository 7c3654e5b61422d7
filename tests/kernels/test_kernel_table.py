"""Kernel registration and subgraph compilation are declared, not import side effects: ``kernels/kernel_table.py``
places every op's kernel in its module (one row per op), and ``kernels.subprograms.COMPILER`` names the module that
compiles a graph a kernel holds, so compiling an If branch needs nobody to have imported ``ep.compiler`` first."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from npu_ep.kernels import registry
from npu_ep.kernels.kernel_table import KERNEL_MODULES
from npu_ep.kernels.registry import KernelDef, kernel_for

OPS = Path(registry.__file__).parent / "ops"


def _registering_modules() -> set[str]:
    """The modules under kernels/ops/ that call ``register``."""
    found = set()
    for path in OPS.glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register" for n in ast.walk(tree)):
            found.add(path.stem)
    return found


def test_every_row_names_the_module_that_registers_the_op():
    kernel_for("", "Add")  # loads the table's modules
    assert set(registry.KERNELS) == set(KERNEL_MODULES)
    for key in KERNEL_MODULES:
        assert registry.KERNELS[key].run.__module__.startswith("npu_ep.kernels.ops."), key
    assert set(KERNEL_MODULES.values()) == _registering_modules()


def test_an_op_without_a_row_is_refused_at_registration():
    with pytest.raises(ValueError, match=r"\('', 'NotAnOp'\) has no row in kernels/kernel_table.py"):
        registry.register(KernelDef("", "NotAnOp", prepare=None, run=None, cost=None))
    assert ("", "NotAnOp") not in registry.KERNELS


def test_a_branch_compiles_without_importing_the_compiler_first():
    code = """
import sys
from onnx import TensorProto, helper
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import subprograms
from npu_ep.kernels.target import Target
assert "npu_ep.ep.compiler" not in sys.modules
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
nodes = nodes_from_model(m)
header, arrays = subprograms.compile_parts("b", nodes, list(nodes[0].inputs), list(nodes[0].outputs),
                                           Target.load("npu-ref"))
print(len(header["steps"]), len(subprograms.load_program(header, arrays, Target.load("npu-ref")).steps))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]
