"""NpuEP's registration with ONNX Runtime: the provider name, the plugin libraries' paths, and ``register``.

Below every tool and the package's public ``__init__`` (which re-exports these and registers at import), so code
inside the package asks here instead of importing the package's top.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

EP_NAME = "NpuEP"
_lock = threading.Lock()
_registered = False


def get_ep_name() -> str:
    """The name to put in ``providers=[...]`` (ORT plugin packaging convention)."""
    return EP_NAME


def get_library_path() -> str:
    """Absolute path of the built plugin library (also importable as ``npu_ep.ep._native``)."""
    spec = importlib.util.find_spec("npu_ep.ep._native")
    if spec is None or not spec.origin:
        raise ImportError("NpuEP's native plugin library is not built: run `pip install -e .` (or `pip install .`) "
                          "in the repository; see README.md")
    return os.path.realpath(spec.origin)


def get_plugin_library_path() -> str:
    """Absolute path of the library for hosts without Python (C, C++, C#, Java, Node: README.md, "Any host"). It
    starts the interpreter of the environment NpuEP is installed in and forwards to ``get_library_path()``'s."""
    path = os.path.join(os.path.dirname(get_library_path()), "libnpu_ep_plugin.so")
    if not os.path.isfile(path):
        raise ImportError(f"NpuEP's plugin loader {path} is not built: reinstall npu-ep (see README.md)")
    return path


def _embedded_in_foreign_host() -> bool:
    """Whether this interpreter was started by the plugin loader for a non-Python ONNX Runtime host: then that host's
    runtime already has the plugin, and the onnxruntime Python package's runtime is a different one."""
    if importlib.util.find_spec("npu_ep.ep._native") is None:
        return False
    from ..kernels.runtime import extension

    return bool(getattr(extension(), "embedded_host", lambda: False)())


def register(force: bool = False) -> None:
    """Register the plugin with ONNX Runtime; idempotent, and fine if the user already registered it. ``force``
    registers again after ORT forgot it (a test that unloaded the library)."""
    global _registered
    with _lock:
        if (_registered and not force) or _embedded_in_foreign_host():
            return
        import onnxruntime as ort

        try:
            ort.register_execution_provider_library(EP_NAME, get_library_path())
        except Exception as exc:  # ORT refuses a second registration under the same name
            if "already registered" not in str(exc):
                raise
        _registered = True


def register_with_genai(og: Any) -> None:
    """Register the plugin with onnxruntime-genai (``og``, the imported ``onnxruntime_genai``), whose ORT is its own
    registry: genai takes one registration per process, so a later call is a no-op."""
    try:
        og.register_execution_provider_library(EP_NAME, get_library_path())
    except RuntimeError as exc:
        if "already registered" not in str(exc):
            raise
