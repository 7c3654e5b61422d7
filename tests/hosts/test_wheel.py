"""The wheel: ``pip wheel . --no-deps`` gives a platform wheel carrying the compiled plugin and the loader, which
installs into a fresh venv with no compiler on PATH and no ORT headers and runs the demo there; the C++ host then
runs NpuEP from that install with no NPU_EP_PYTHON, so the loader found its environment from where it lies.

Slow (it compiles the plugin once more and installs the dependencies into a new venv): ``.ci/run`` runs it after
the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.hosts.cpp_host import ROOT, build_host, run_host, write_steps
from tests.npu_testing import make_model

pytestmark = pytest.mark.slow
COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "ccache")


def _build_wheel(dist: Path) -> Path:
    """README's ``pip wheel . --no-deps``, without build isolation: the test extra has the build's pybind11, and with
    ccache the compiler calls are the developer build's (same include paths), so unchanged sources are not rebuilt."""
    env = dict(os.environ)
    if shutil.which("ccache"):
        env.update(CC="ccache gcc", CXX="ccache g++")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w",
                    str(dist)], check=True, capture_output=True, text=True, env=env)
    (wheel,) = dist.glob("npu_ep-*.whl")
    return wheel


def _clean_env(venv: Path, empty_bin: Path) -> dict[str, str]:
    """The venv's bin and an empty folder as PATH: no compiler, no ORT headers, nothing of the developer's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CC", "CXX", "ORT_INCLUDE_DIR", "VIRTUAL_ENV", "PYTHONPATH", "NPU_EP_PYTHON")}
    env["PATH"] = f"{venv / 'bin'}:{empty_bin}"
    assert not [c for c in COMPILERS if shutil.which(c, path=env["PATH"])]
    return env


def test_wheel_installs_without_a_compiler_and_runs_the_demo(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    assert wheel.name.endswith("-linux_x86_64.whl") or "manylinux" in wheel.name, wheel.name  # a platform wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("npu_ep/ep/_native.") and n.endswith(".so") for n in names), names
    assert "npu_ep/ep/libnpu_ep_plugin.so" in names
    assert not [n for n in names if n.startswith(("tests/", "npu_ep/tests/", "build/"))]

    host = build_host(tmp_path / "host")  # with the compiler, before it is taken away
    venv, empty_bin = tmp_path / "venv", tmp_path / "no_compilers"
    empty_bin.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = _clean_env(venv, empty_bin)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--only-binary=:all:", str(wheel), "-c",
                              str(ROOT / "constraints-dev.txt")], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]

    where = subprocess.run([python, "-c", "import npu_ep; print(npu_ep.get_plugin_library_path())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    loader = where.stdout.strip()
    assert loader.startswith(str(venv)), loader  # the wheel's install, not the checkout

    demo = subprocess.run([python, "-m", "npu_ep.tools.demo", "--max-new-tokens", "4", "--out", str(tmp_path / "d")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "tokens IDENTICAL" in demo.stdout

    # A C++ host registering the installed loader: it starts the venv's interpreter, found from its own location.
    model = tmp_path / "relu.onnx"
    model.write_bytes(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])]).SerializeToString())
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    run = run_host(host, loader, model, write_steps(tmp_path / "io", [{"x": x}]), "--ep-option", "cache_dir=",
                   "--profile", str(tmp_path / "p"), env=env)
    assert run.returncode == 0, run.stderr
    assert run.outputs(0)["y"].tobytes() == np.maximum(x, 0).tobytes()
    assert '"provider" : "NpuEP"' in run.profile().read_text().replace('"provider":"', '"provider" : "')
