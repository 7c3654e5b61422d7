"""NpuEP: an ONNX Runtime plugin execution provider for an emulated NPU, and the tools that prepare models for it.

``import npu_ep`` registers the plugin library with ONNX Runtime (once per process), after which
``onnxruntime.InferenceSession(model, providers=["NpuEP", "CPUExecutionProvider"])`` selects it.
"""

from __future__ import annotations

__version__ = "0.1.0"
