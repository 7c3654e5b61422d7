"""Build and drive tests/hosts/host.cc, a C++ ONNX Runtime host without Python of its own.

It is compiled with the system compiler against ORT's C headers (the ones the build fetched, ``build/ort-headers``)
and linked to the libonnxruntime inside the installed onnxruntime wheel; NpuEP reaches it as
``npu_ep.get_plugin_library_path()``, the loader that starts Python itself. Inputs go to the host as raw files per
step and its outputs come back the same way (``write_steps`` / ``read_outputs``).
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import helper

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("host.cc")


def ort_library() -> Path:
    """The C library inside the onnxruntime wheel (the Python module carries its own copy of the runtime)."""
    capi = Path(ort.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so.*"))
    if not found:
        raise FileNotFoundError(f"no libonnxruntime.so.* in {capi}")
    return found[0]


def ort_headers() -> Path:
    fetcher = runpy.run_path(str(ROOT / "ep" / "native" / "fetch_ort_headers.py"))
    return fetcher["fetch"](ROOT / "build" / "ort-headers")


def build_host(folder: Path) -> Path:
    """Compile host.cc into ``folder``; the wheel's library has no ``libonnxruntime.so.1`` link (its soname), so a
    private one is made beside the binary and found through its rpath."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++) on PATH")
    lib_dir = folder / "lib"
    lib_dir.mkdir(parents=True, exist_ok=True)
    link = lib_dir / "libonnxruntime.so.1"
    if not link.exists():
        link.symlink_to(ort_library())
    shared = ort_library().with_name("libonnxruntime_providers_shared.so")  # ORT 1.23 loads it from beside itself
    if shared.is_file() and not (lib_dir / shared.name).exists():
        (lib_dir / shared.name).symlink_to(shared)
    binary = folder / "npu_host"
    subprocess.run([compiler, "-std=c++17", "-O2", "-o", str(binary), str(SOURCE), f"-I{ort_headers()}", str(link),
                    f"-Wl,-rpath,{lib_dir}", "-pthread"], check=True, capture_output=True, text=True)
    return binary


def write_steps(folder: Path, steps: Sequence[Mapping[str, np.ndarray]]) -> Path:
    """One ``step<k>`` folder per dict of feeds, in host.cc's format."""
    for k, feeds in enumerate(steps):
        step = folder / f"step{k}"
        step.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, (name, value) in enumerate(feeds.items()):
            value = np.ascontiguousarray(value)
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            lines.append(" ".join([name, str(elem), str(value.ndim), *map(str, value.shape)]))
            value.tofile(step / f"in{i}.bin")
        (step / "inputs.txt").write_text("\n".join(lines) + "\n")
    return folder


def read_outputs(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for i, line in enumerate((folder / "outputs.txt").read_text().splitlines()):
        name, elem, rank, *dims = line.split()
        assert len(dims) == int(rank), line
        dtype = helper.tensor_dtype_to_np_dtype(int(elem))
        out[name] = np.fromfile(folder / f"out{i}.bin", dtype=dtype).reshape([int(d) for d in dims])
    return out


@dataclasses.dataclass
class HostRun:
    returncode: int
    stdout: str
    stderr: str
    iodir: Path

    def outputs(self, step: int, round_: int = 0, thread: int = 0) -> dict[str, np.ndarray]:
        return read_outputs(self.iodir / "out" / f"r{round_}_t{thread}" / f"step{step}")

    def profile(self) -> Path | None:
        lines = [ln.split(" ", 1)[1] for ln in self.stdout.splitlines() if ln.startswith("profile ")]
        return Path(lines[0]) if lines else None


def run_host(binary: Path, library: str, model: str | Path, iodir: Path, *args: str,
             env: Mapping[str, str] | None = None, timeout: float = 600) -> HostRun:
    proc = subprocess.run([str(binary), library, str(model), str(iodir), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=iodir)
    return HostRun(proc.returncode, proc.stdout, proc.stderr, iodir)
