"""Reading and writing models for the rewriter: external data stays memory-mapped on disk while loading."""

from __future__ import annotations

import os
import pathlib

import onnx
import onnx_ir as ir

from ..ep.onnx_graph import all_tensors

# Above this many bytes of tensor data a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


class RewriteError(Exception):
    """A model could not be read or rewritten; the message is one line naming the file or node and the reason."""



def load_model(model: str | os.PathLike | onnx.ModelProto | ir.Model) -> ir.Model:
    """Any accepted model form as an ``onnx_ir.Model``; external data stays memory-mapped on disk."""
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        try:
            return ir.serde.deserialize_model(model)
        except Exception as e:  # noqa: BLE001 - any deserialization failure is bad input
            raise RewriteError(f"<ModelProto>: not a valid ONNX model: {_one_line(e)}") from None
    if not isinstance(model, (str, os.PathLike)):
        raise RewriteError(f"cannot rewrite a {type(model).__name__}; pass a path, ModelProto or onnx_ir.Model")
    path = pathlib.Path(model)
    if not path.is_file():
        raise RewriteError(f"{path}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises various types on garbage
        raise RewriteError(f"{path}: not a readable ONNX model: {_one_line(e)}") from None
    if not proto.graph.node and not proto.graph.output:
        raise RewriteError(f"{path}: not a readable ONNX model: empty graph")
    _check_external_data(proto, path)
    try:
        ir_model = ir.serde.deserialize_model(proto)
    except Exception as e:  # noqa: BLE001
        raise RewriteError(f"{path}: not a valid ONNX model: {_one_line(e)}") from None
    ir.external_data.set_base_dir(ir_model.graph, str(path.parent))
    return ir_model


def _check_external_data(proto: onnx.ModelProto, path: pathlib.Path) -> None:
    """Every external data file must exist inside the model's directory (no absolute paths, no ``..`` escape)."""
    base = path.parent.resolve()
    for tensor in all_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if not location:
            raise RewriteError(f"{path}: initializer {tensor.name!r} has external data without a location")
        target = (base / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(base):
            raise RewriteError(f"{path}: initializer {tensor.name!r} external data path {location!r} "
                               "escapes the model directory")
        if not target.is_file():
            raise RewriteError(f"{path}: initializer {tensor.name!r} external data file {location!r} not found")


def tensor_bytes(model: ir.Model) -> int:
    """Total bytes of initializer data (without reading it)."""
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total


def save_model(model: ir.Model, path: str | os.PathLike) -> pathlib.Path:
    """Save ``model``; above ``EXTERNAL_DATA_THRESHOLD`` bytes of tensors, data goes to ``<file>.data``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD:
            ir.save(model, path, external_data=path.name + ".data")
        else:
            ir.save(model, path)
    except OSError as e:
        raise RewriteError(f"{path}: cannot write model: {_one_line(e)}") from None
    return path


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
