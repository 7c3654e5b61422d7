"""Build of the native plugin shim (the rest of the package is plain Python, configured in pyproject.toml).

The shim is one shared library that is both an ORT plugin EP (exports CreateEpFactories) and a Python extension
module (``npu_ep.ep._native``), so ``importlib`` can locate it in wheels and editable installs alike.
Beside it, ``npu_ep/ep/libnpu_ep_plugin.so`` (ep/loader) is the library for hosts without Python: it links no
libpython, starts the interpreter of the environment it is installed in and forwards to ``_native``; the python that
runs this build is recorded in it for editable installs (where no site-packages surrounds it).
ONNX Runtime's C headers come from ``ORT_INCLUDE_DIR`` or are fetched by ``ep/native/fetch_ort_headers.py``.
"""

import os
import runpy
import sys
import sysconfig
from pathlib import Path

import numpy
from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "ep" / "native"  # the ORT shim and the executor
KERNELS = ROOT / "kernels" / "native"  # the native kernels, beside their numpy reference in kernels/ops
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

    def get_ext_filename(self, fullname):
        """The loader is a plain shared library (no module init), named as one."""
        parts = fullname.split(".")  # distutils asks with the full dotted name and with its last part alone
        if parts[-1] == LOADER_NAME.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], "libnpu_ep_plugin.so")
        return super().get_ext_filename(fullname)


class BuildPy(build_py):
    """The repo root is the package ``npu_ep``: keep build scripts out of the installed package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "npu_ep" and m[1] in ("setup", "conftest"))]


native = Pybind11Extension(
    "npu_ep.ep._native",
    sorted(str(p.relative_to(ROOT)) for p in [*NATIVE.glob("*.cc"), *KERNELS.glob("*.cc")]),
    # includes name their folder: "kernels/native/conv.h", "ep/native/ort_api.h"
    include_dirs=[str(ROOT), numpy.get_include()],  # numpy's: ufunc_split.cc reads a ufunc's own loops
    cxx_std=17,
    define_macros=[("NPU_EP_VERSION", f'"{VERSION}"')],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
)


def _c_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


LOADER_NAME = "npu_ep.ep.libnpu_ep_plugin"
loader = Extension(
    LOADER_NAME,
    ["ep/loader/plugin_loader.cc"],
    language="c++",
    define_macros=[
        ("NPU_EP_BUILD_PYTHON", _c_string(sys.executable)),
        ("NPU_EP_LIBPYTHON", _c_string(sysconfig.get_config_var("INSTSONAME") or "")),
        ("NPU_EP_BUILD_LIBDIR", _c_string(sysconfig.get_config_var("LIBDIR") or "")),
        ("NPU_EP_NATIVE_FILE", _c_string("_native" + sysconfig.get_config_var("EXT_SUFFIX"))),
        ("NPU_EP_PYTHON_VERSION", _c_string(f"{sys.version_info.major}.{sys.version_info.minor}")),
    ],
    extra_compile_args=["-std=c++17", "-O2", "-Wall", "-fvisibility=hidden"],
    extra_link_args=["-ldl"],
)

os.chdir(ROOT)
ParallelCompile("NPU_EP_BUILD_JOBS").install()  # the shim's ~40 sources on every core (pip passes no -j)
setup(ext_modules=[native, loader], cmdclass={"build_ext": BuildNative, "build_py": BuildPy})
