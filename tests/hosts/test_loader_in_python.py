"""The loader in a Python host changes nothing: registering ``npu_ep.get_plugin_library_path()`` instead of the
extension gives the same NpuEP (the loader sees the running interpreter and only forwards). In a subprocess, so the
registration under the name NpuEP is the loader's."""

from __future__ import annotations

import subprocess
import sys

import npu_ep

CODE = """
import numpy as np, onnxruntime as ort, sys
ort.register_execution_provider_library("NpuEP", sys.argv[1])
import npu_ep  # registers the extension too: refused as already registered, which register() accepts
from npu_testing import F32, assignment, cpu_run, make_model, npu_session  # cwd: tests/
from onnx import helper
model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"],
                    name="add")], [helper.make_tensor_value_info("x", F32, [2, 8])],
                   [helper.make_tensor_value_info("y", F32, [2, 8])])
x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
sess = npu_session(model, cpu=False)
assert set(assignment(sess).values()) == {"NpuEP"}, assignment(sess)
assert sess.run(None, {"x": x})[0].tobytes() == cpu_run(model, {"x": x})[0].tobytes()
print("ok")
"""


def test_a_python_host_can_register_the_loader_instead_of_the_extension():
    from tests.hosts.cpp_host import ROOT

    done = subprocess.run([sys.executable, "-c", CODE, npu_ep.get_plugin_library_path()], capture_output=True,
                          text=True, timeout=300, cwd=ROOT / "tests")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "ok"
