"""The calibration set's architectures, rebuilt with random weights at the measured input shapes.

``shared/reference/npu-measured/cnn_calibration.csv`` names torchvision / transformers constructors; latency does
not depend on the weights' values, so each is built untrained, exported by torch's TorchScript exporter (opset 17)
and, for the w8a8 rows, quantized by ORT's own ``quantize_static`` (uint8 activations, per-channel int8 weights, QDQ),
as AI Hub's w8a8 models are. Files are cached under ``<cache>/silicon`` (new files only, keyed by name).

torch, torchvision and transformers are optional: ``SiliconModelsUnavailable`` says which one is missing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# model name (as the calibration CSV spells it) -> input [N, C, H, W] of its get_input_spec() default
INPUT_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "mobilenet_v2": (1, 3, 224, 224), "mobilenet_v3_large": (1, 3, 224, 224), "efficientnet_b0": (1, 3, 224, 224),
    "resnet18": (1, 3, 224, 224), "resnet50": (1, 3, 224, 224), "inception_v3": (1, 3, 224, 224),
    "convnext_tiny": (1, 3, 224, 224), "vit": (1, 3, 224, 224), "fcn_resnet50": (1, 3, 520, 520),
    "detr_resnet50": (1, 3, 640, 640),
}
CALIBRATION_SAMPLES = 2  # quantize_static's calibration inputs: ranges only, latency does not depend on them


class SiliconModelsUnavailable(RuntimeError):
    """An optional exporter dependency is missing; the message names it."""


@contextlib.contextmanager
def _torchvision_without_ops():
    """Import torchvision when its compiled ops do not load (the registry's torchvision wheels are built against
    CUDA's torch, this project uses the CPU build): only the model constructors are needed, not nms/roi_align, so
    their fake-tensor registrations are skipped during the import."""
    import torch

    original = torch.library.register_fake
    torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
    try:
        yield
    finally:
        torch.library.register_fake = original


def _torchvision() -> Any:
    try:
        import torch  # noqa: F401 - only whether it is installed
    except ImportError:
        raise SiliconModelsUnavailable("the calibration models need torch: pip install torch==2.13.0") from None
    try:
        with _torchvision_without_ops():
            import torchvision
    except ImportError:
        raise SiliconModelsUnavailable("the calibration models need torchvision: pip install torchvision") from None
    return torchvision


class _LogitsOnly:
    """Wraps a module whose forward returns a dict/tuple so the export has one tensor output per head."""

    def __new__(cls, module: Any, keys: tuple[str, ...]):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = module

            def forward(self, x):
                out = self.inner(x)
                if isinstance(out, dict):
                    return tuple(out[k] for k in keys)
                return tuple(getattr(out, k) for k in keys)

        return Wrapped()


def _detr() -> Any:
    try:
        from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig
    except ImportError:
        raise SiliconModelsUnavailable("detr_resnet50 needs transformers: pip install transformers") from None
    backbone = ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
                            out_features=["stage4"])
    config = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
                        num_queries=100)
    return _LogitsOnly(DetrForObjectDetection(config), ("logits", "pred_boxes"))


def _tv(name: str, **kwargs: Any) -> Callable[[], Any]:
    """A torchvision constructor by name, torchvision imported only when it is called."""
    def build():
        models = _torchvision().models
        owner = models.segmentation if name.startswith("fcn_") else models
        return getattr(owner, name)(weights=None, **kwargs)
    return build


CONSTRUCTORS: dict[str, Callable[[], Any]] = {
    "mobilenet_v2": _tv("mobilenet_v2"),
    "mobilenet_v3_large": _tv("mobilenet_v3_large"),
    "efficientnet_b0": _tv("efficientnet_b0"),
    "resnet18": _tv("resnet18"),
    "resnet50": _tv("resnet50"),
    "inception_v3": _tv("inception_v3", init_weights=False, aux_logits=False),
    "convnext_tiny": _tv("convnext_tiny"),
    "vit": _tv("vit_b_16"),
    "fcn_resnet50": lambda: _LogitsOnly(_tv("fcn_resnet50", weights_backbone=None, aux_loss=False)(), ("out",)),
    "detr_resnet50": _detr,
}


def _trained_like_norms(module: Any) -> None:
    """Random BatchNorm statistics and affine terms: an untrained BatchNorm folds into a zero conv bias, and the
    exporter then shares one zero initializer between all convs, a graph no trained model has."""
    import torch

    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def _export(name: str, path: Path) -> None:
    import torch

    torch.manual_seed(0)
    module = CONSTRUCTORS[name]().eval()
    _trained_like_norms(module)
    x = torch.randn(*INPUT_SHAPES[name])
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused MHA kernel has no ONNX export (ViT)
    try:
        with torch.no_grad():
            torch.onnx.export(module, (x,), str(tmp), dynamo=False, opset_version=17, input_names=["x"])
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    os.replace(tmp, path)


def _quantize(src: Path, dst: Path, name: str) -> None:
    from .convnet import quantize_qdq

    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal(INPUT_SHAPES[name]).astype(np.float32)} for _ in range(CALIBRATION_SAMPLES)]
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    quantize_qdq(str(src), str(tmp), calib)
    os.replace(tmp, dst)


def model_path(name: str, precision: str, cache: Path) -> Path:
    """The ONNX file of ``name`` at ``precision`` ("float": the fp32 export the NPU runs in fp16; "w8a8": QDQ),
    built on first use."""
    if name not in INPUT_SHAPES:
        raise KeyError(f"unknown calibration model {name!r}; known: {', '.join(INPUT_SHAPES)}")
    cache.mkdir(parents=True, exist_ok=True)
    float_path = cache / f"{name}.onnx"
    if not float_path.is_file():
        _export(name, float_path)
    if precision == "float":
        return float_path
    if precision != "w8a8":
        raise ValueError(f"precision {precision!r}: the calibration builds 'float' and 'w8a8'")
    qdq_path = cache / f"{name}.w8a8.onnx"
    if not qdq_path.is_file():
        _quantize(float_path, qdq_path, name)
    return qdq_path
