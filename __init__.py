"""NpuEP: an ONNX Runtime plugin execution provider for an emulated NPU, and the tools that prepare models for it.

``import npu_ep`` registers the plugin library with ONNX Runtime (once per process), after which
``onnxruntime.InferenceSession(model, providers=["NpuEP", "CPUExecutionProvider"])`` selects it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import threading


def _unshadow() -> None:
    """Take this package's own folder off ``sys.path``: ``python -m npu_ep...`` run in a checkout puts it there (the
    checkout's root is this package), and its subpackages would then also import as top-level packages, shadowing
    installed ones of the same name (transformers imports Hugging Face's ``kernels`` and got ours)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


_unshadow()

from ._version import __version__ as __version__  # noqa: E402 - after the path is clean

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
    from .kernels.runtime import extension

    return bool(getattr(extension(), "embedded_host", lambda: False)())


def register() -> None:
    """Register the plugin with ONNX Runtime; idempotent, and fine if the user already registered it."""
    global _registered
    with _lock:
        if _registered or _embedded_in_foreign_host():
            return
        import onnxruntime as ort

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
    from .kernels.runtime import extension

    ext = extension()
    if ext is not None:
        ext.prepare_shutdown(2.0)


register()
atexit.register(_prepare_shutdown)
