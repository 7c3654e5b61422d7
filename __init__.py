"""NpuEP: an ONNX Runtime plugin execution provider for an emulated NPU, and the tools that prepare models for it.

``import npu_ep`` registers the plugin library with ONNX Runtime (once per process), after which
``onnxruntime.InferenceSession(model, providers=["NpuEP", "CPUExecutionProvider"])`` selects it.
"""

from __future__ import annotations

import atexit
import os
import sys


def _unshadow() -> None:
    """Take this package's own folder off ``sys.path``: ``python -m npu_ep...`` run in a checkout puts it there (the
    checkout's root is this package), and its subpackages would then also import as top-level packages, shadowing
    installed ones of the same name (transformers imports Hugging Face's ``kernels`` and got ours)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


_unshadow()

from ._version import __version__ as __version__  # noqa: E402 - after the path is clean

from .ep.registration import get_ep_name, get_library_path, get_plugin_library_path, register  # noqa: E402 - the same

__all__ = ["__version__", "get_ep_name", "get_library_path", "get_plugin_library_path", "register", "report"]


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
