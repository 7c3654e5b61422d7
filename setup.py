"""Build of the native plugin shim (the rest of the package is plain Python, configured in pyproject.toml).

The shim is one shared library that is both an ORT plugin EP (exports CreateEpFactories) and a Python extension
module (``npu_ep.ep._native``), so ``importlib`` can locate it in wheels and editable installs alike.
ONNX Runtime's C headers come from ``ORT_INCLUDE_DIR`` or are fetched by ``ep/native/fetch_ort_headers.py``.
"""

import os
import runpy
import sys
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "ep" / "native"
VERSION = runpy.run_path(str(ROOT / "_version.py"))["__version__"]


class BuildNative(build_ext):
    """Fetch the ORT headers (unless ORT_INCLUDE_DIR is set) right before compiling the shim."""

    def build_extensions(self):
        fetcher = runpy.run_path(str(NATIVE / "fetch_ort_headers.py"))
        try:
            include = fetcher["fetch"](ROOT / "build" / "ort-headers")
        except fetcher["HeaderFetchError"] as exc:
            sys.exit(f"error: cannot build the NpuEP plugin: {exc}")
        for ext in self.extensions:
            ext.include_dirs.append(str(include))
        super().build_extensions()


class BuildPy(build_py):
    """The repo root is the package ``npu_ep``: keep build scripts out of the installed package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "npu_ep" and m[1] in ("setup", "conftest"))]


native = Pybind11Extension(
    "npu_ep.ep._native",
    sorted(str(p.relative_to(ROOT)) for p in [*NATIVE.glob("*.cc"), *NATIVE.glob("kernels/*.cc")]),
    cxx_std=17,
    define_macros=[("NPU_EP_VERSION", f'"{VERSION}"')],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
)

os.chdir(ROOT)
setup(ext_modules=[native], cmdclass={"build_ext": BuildNative, "build_py": BuildPy})
