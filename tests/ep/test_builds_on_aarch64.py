"""The native extension builds on aarch64 (issue 12: "builds and runs on any x86-64 and builds on aarch64").

Every source setup.py compiles is compiled here for aarch64-linux-gnu by zig's clang (the ``ziglang`` wheel, a test
dependency), with setup.py's flags, against this host's Python and pybind11 headers (LP64 on both). That proves
the x86 paths are fenced off (cpu.h's NPU_EP_X86) and the portable paths compile with a second compiler; it does
not run them (this host has no aarch64 to run on). Objects only: a shared object for a Python extension leaves
Python's symbols undefined anyway, so linking would prove nothing more.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
import pybind11
import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "ep" / "native"
EM_AARCH64 = 183  # ELF e_machine


def _zig() -> list[str]:
    pytest.importorskip("ziglang", reason="ziglang (a test dependency: pip install -e '.[test]') is not installed")
    return [sys.executable, "-m", "ziglang", "c++"]


def _compile(cmd: list[str], source: Path, out: Path, env: dict[str, str]) -> tuple[Path, int, str]:
    done = subprocess.run([*cmd, "-c", str(source), "-o", str(out)], capture_output=True, text=True, env=env)
    return source, done.returncode, done.stderr


def test_every_native_source_compiles_for_aarch64(tmp_path):
    zig = _zig()
    headers = runpy.run_path(str(NATIVE / "fetch_ort_headers.py"))["fetch"](ROOT / "build" / "ort-headers")
    sources = sorted([*NATIVE.glob("*.cc"), *(ROOT / "kernels" / "native").glob("*.cc")])  # setup.py's list
    assert len(sources) > 30
    cmd = [*zig, "-target", "aarch64-linux-gnu", "-std=c++17", "-O2", "-Wall", "-Wno-unused-function", "-fPIC",
           "-Wno-macro-redefined",  # Python.h after zig's libc headers redefines _POSIX_C_SOURCE: harmless
           '-DNPU_EP_VERSION="aarch64-check"', f"-I{headers}", f"-I{ROOT}", f"-I{pybind11.get_include()}",
           f"-I{sysconfig.get_paths()['include']}", f"-I{numpy.get_include()}"]
    # a cache of this run's own: zig's shared cache answers a source it compiled before without its warnings, so a
    # warning added since would pass here and fail on a fresh machine
    cache = str(tmp_path / "zig-cache")
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": cache, "ZIG_LOCAL_CACHE_DIR": cache}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda s: _compile(cmd, s, tmp_path / f"{s.stem}.o", env), sources))
    failed = {str(s.relative_to(ROOT)): err[-2000:] for s, rc, err in results if rc != 0}
    assert not failed, failed
    warned = {str(s.relative_to(ROOT)): err[-600:] for s, rc, err in results if "warning:" in err}
    assert not warned, warned  # what the host's GCC build does not see (an unused x86-only value, GCC-only pragmas)
    for s in sources:
        header = (tmp_path / f"{s.stem}.o").read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64, s
