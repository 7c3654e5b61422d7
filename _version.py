"""The package version, in one place: pyproject (dynamic version), setup.py (the native shim's NPU_EP_VERSION)
and ``npu_ep.__version__`` all read it."""

__version__ = "0.1.0"
