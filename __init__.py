"""NpuEP: an ONNX Runtime plugin execution provider for an emulated NPU, and the tools that prepare models for it.

``import npu_ep`` registers the plugin library with ONNX Runtime (once per process), after which
``onnxruntime.InferenceSession(model, providers=["NpuEP", "CPUExecutionProvider"])`` selects it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import threading

from ._version import __version__

_EP_NAME = "NpuEP"
_lock = threading.Lock()
_registered = False


def get_ep_name() -> str:
    """The name to put in ``providers=[...]`` (ORT plugin packaging convention)."""
    return _EP_NAME


def get_library_path() -> str:
    """Absolute path of the built plugin library (also importable as ``npu_ep.ep._native``)."""
    spec = importlib.util.find_spec("npu_ep.ep._native")
    if spec is None or not spec.origin:
        raise ImportError("NpuEP's native plugin library is not built: run `pip install -e .` (or `pip install .`) "
                          "in the repository; see README.md")
    return os.path.realpath(spec.origin)


def register() -> None:
    """Register the plugin with ONNX Runtime; idempotent, and fine if the user already registered it."""
    global _registered
    import onnxruntime as ort

    with _lock:
        if _registered:
            return
        try:
            ort.register_execution_provider_library(_EP_NAME, get_library_path())
        except Exception as exc:  # ORT refuses a second registration under the same name
            if "already registered" not in str(exc):
                raise
        _registered = True


def report(model_or_session, **kwargs):
    """Coverage/partition/boundary report for a model path or an InferenceSession (``npu_ep.tools.report.build``)."""
    from .tools.report.build import build_report

    return build_report(model_or_session, **kwargs)


def _prepare_shutdown() -> None:
    """Daemon threads may still be inside session.run at exit: stop NpuEP from entering Python before teardown."""
    try:
        from .ep import _native
    except ImportError:
        return
    _native.prepare_shutdown(2.0)


register()
atexit.register(_prepare_shutdown)
