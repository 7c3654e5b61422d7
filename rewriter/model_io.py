"""Reading and writing models for the rewriter.

Loading: weights stay on disk, memory-mapped by onnx-ir when a rule reads them (external data as it is; large
inline tensors through ``inline_data``); every stored tensor is checked against its dims from the headers, before
anything is allocated; negative declared dims become unknown dims.
Saving: self-contained (the output never points at the input's files), atomic (``npu_ep._atomic``), and never
over a file the input reads (``refuse_overwriting_inputs``).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable

import onnx
import onnx_ir as ir

from .._atomic import atomic_write_bytes, atomic_writer
from ..ep.onnx_graph import all_tensors
from .inline_data import load_mapped

# Above this many bytes of tensor data a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
_INLINE_LIMIT = 1024  # with a data file, tensors up to this size stay inline (as onnx.save's size_threshold)
_ALIGN = 64  # data-file offsets are aligned for the memory maps that read them
SOURCE_FILES_KEY = "npu_ep.source_files"  # ir.Model.meta: the model file a model was loaded from, then its data files


class RewriteError(Exception):
    """A model could not be read or rewritten; the message is one line naming the file or node and the reason."""


def load_model(model: str | os.PathLike | onnx.ModelProto | ir.Model) -> ir.Model:
    """Any accepted model form as an ``onnx_ir.Model``; external data stays memory-mapped on disk."""
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        _check_tensor_sizes(model, "<ModelProto>", None)
        if _has_negative_dims(model.graph):
            model = _copy(model)
            _clear_negative_dims(model.graph)
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
        proto = load_mapped(path) or onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises various types on garbage
        raise RewriteError(f"{path}: not a readable ONNX model: {_one_line(e)}") from None
    if not proto.graph.node and not proto.graph.output:
        raise RewriteError(f"{path}: not a readable ONNX model: empty graph")
    data_files = _check_external_data(proto, path)
    _check_tensor_sizes(proto, str(path), path.parent)
    _clear_negative_dims(proto.graph)
    try:
        ir_model = ir.serde.deserialize_model(proto)
    except Exception as e:  # noqa: BLE001 - onnx_ir raises many kinds; the user gets one line
        raise RewriteError(f"{path}: not a valid ONNX model: {_one_line(e)}") from None
    ir.external_data.set_base_dir(ir_model.graph, str(path.parent))
    ir_model.meta[SOURCE_FILES_KEY] = (str(path), *map(str, data_files))
    return ir_model


def _check_external_data(proto: onnx.ModelProto, path: pathlib.Path) -> set[pathlib.Path]:
    """Every external data file must exist inside the model's directory (no absolute paths, no ``..`` escape).
    Returns the data files."""
    base = path.parent.resolve()
    files = set()
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
        files.add(target)
    return files


def _check_tensor_sizes(proto: onnx.ModelProto, where: str, base: pathlib.Path | None) -> None:
    """Every stored tensor holds as many bytes as its dims declare and no dim is negative, checked from the
    headers before anything is allocated (the rules would otherwise fail deep inside numpy)."""
    for tensor in all_tensors(proto.graph):
        name = f"{where}: initializer {tensor.name!r} {onnx.TensorProto.DataType.Name(tensor.data_type)}" \
               f"{list(tensor.dims)}"
        if any(d < 0 for d in tensor.dims):
            raise RewriteError(f"{name} has a negative dim")
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            try:
                onnx.checker.check_tensor(tensor)
            except Exception as e:  # noqa: BLE001 - ValidationError and friends
                raise RewriteError(f"{name}: {re.sub(r' ?[(]tensor name: [^)]*[)]', '', _one_line(e))}") from None
            continue
        need = _declared_bytes(tensor)
        info = {e.key: e.value for e in tensor.external_data}
        try:
            offset, length = int(info.get("offset") or 0), info.get("length")
            length = None if length in (None, "") else int(length)
        except ValueError:
            raise RewriteError(f"{name}: external data offset/length are not integers") from None
        if need is None:
            continue
        if length is not None and length < need:
            raise RewriteError(f"{name} needs {need} bytes but its external data length is {length}")
        if base is not None:
            available = (base / info["location"]).stat().st_size - offset
            if available < need:
                raise RewriteError(f"{name} needs {need} bytes at offset {offset} of {info['location']!r}, "
                                   f"which holds only {max(available, 0)} there")


def _value_infos(graph: onnx.GraphProto):
    """Every declared value shape of ``graph`` and its subgraphs."""
    yield from (*graph.input, *graph.output, *graph.value_info)
    for node in graph.node:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _value_infos(g)


def _has_negative_dims(graph: onnx.GraphProto) -> bool:
    return any(d.HasField("dim_value") and d.dim_value < 0
               for vi in _value_infos(graph) for d in vi.type.tensor_type.shape.dim)


def _clear_negative_dims(graph: onnx.GraphProto) -> None:
    """A negative declared size (exporters write -1 for "unknown"; ONNX requires >= 0) becomes an unknown dim,
    which is what it means: shape inference then fills it instead of failing on it."""
    for vi in _value_infos(graph):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _declared_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes the dims declare (sub-byte types packed), None for strings and unknown types."""
    try:
        bits = ir.DataType(tensor.data_type).bitwidth
    except Exception:  # noqa: BLE001 - STRING and undefined types have no fixed width
        return None
    count = 1
    for d in tensor.dims:
        count *= d
    return (count * bits + 7) // 8


def tensor_bytes(model: ir.Model) -> int:
    """Total bytes of initializer data in every graph (without reading it)."""
    return sum(value.const_value.nbytes for graph in model.graphs() for value in graph.initializers.values()
               if value.const_value is not None)


def files_read_by(model: ir.Model) -> set[pathlib.Path]:
    """The files ``model`` reads: the model file it was loaded from and every external data file."""
    files = set(_source_model(model))
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                files.add(pathlib.Path(value.const_value.path))
    return {f.resolve() for f in files}


def refuse_overwriting_inputs(outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike],
                              what: str = "output") -> None:
    """Raise ``RewriteError`` if an output is one of the inputs (same resolved path, or same inode via a link)."""
    ins = [pathlib.Path(i) for i in inputs]
    for out in outputs:
        out = pathlib.Path(out)
        for i in ins:
            same = out.resolve() == i.resolve()
            if not same and out.exists() and i.exists():
                try:
                    same = os.path.samefile(out, i)
                except OSError:
                    same = False
            if same:
                raise RewriteError(f"{out}: {what} would replace {i}, which the input model reads; "
                                   "choose another output path")


def save_model(model: ir.Model, path: str | os.PathLike) -> pathlib.Path:
    """Save ``model`` self-contained, atomically, never over a file it reads.

    Self-contained: when the model reads external data (it came with a data file) or holds more than
    ``EXTERNAL_DATA_THRESHOLD`` bytes of tensors, every large initializer is copied into ``<file>.data`` beside
    the output (kernel file-to-file copy for untouched external tensors, so weights are streamed, never resident);
    otherwise everything is inline (weights mapped from an inline input file are read back in). The output never
    points at a file of the input.
    Atomic: each file is written to a unique temp file, fsync'ed and renamed (data first, then the model).
    """
    path = pathlib.Path(path)
    data_name = path.name + ".data"
    inputs = files_read_by(model)
    data_files_read = inputs - {p.resolve() for p in _source_model(model)[:1]}  # external data in, external out
    external = bool(data_files_read) or tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    refuse_overwriting_inputs([path, path.with_name(data_name)] if external else [path], inputs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if external:
            _save_with_data_file(model, path, data_name)
        else:
            atomic_write_bytes(path, _serialize_inline(model, path))
    except OSError as e:
        raise RewriteError(f"{path}: cannot write model: {_one_line(e)}") from None
    return path


def _source_model(model: ir.Model) -> list[pathlib.Path]:
    """The files recorded when ``model`` was loaded: the model file, then its data files."""
    return [pathlib.Path(p) for p in model.meta.get(SOURCE_FILES_KEY, ())]


def _serialize(model: ir.Model, path: pathlib.Path) -> bytes:
    try:
        return ir.serde.serialize_model(model).SerializeToString()
    except ValueError as e:  # protobuf refuses messages above 2 GiB
        raise RewriteError(f"{path}: cannot serialize model: {_one_line(e)}") from None


def _serialize_inline(model: ir.Model, path: pathlib.Path) -> bytes:
    """Every initializer inline; tensors mapped from the input's own file (``inline_data``) are read into it."""
    values = [v for g in model.graphs() for v in g.initializers.values()
              if isinstance(v.const_value, ir.ExternalTensor)]
    originals = [v.const_value for v in values]
    try:
        for value, tensor in zip(values, originals):
            value.const_value = ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=tensor.name)
        return _serialize(model, path)
    finally:
        for value, tensor in zip(values, originals):
            value.const_value = tensor


def _save_with_data_file(model: ir.Model, path: pathlib.Path, data_name: str) -> None:
    """Stream every initializer above ``_INLINE_LIMIT`` bytes, and every external one, into ``data_name`` beside
    ``path`` (atomically), point the initializers at it while the model is serialized, then restore them (the
    model is unchanged)."""
    values = [v for g in model.graphs() for v in g.initializers.values()
              if v.const_value is not None and v.const_value.dtype != ir.DataType.STRING  # strings stay inline
              and (v.const_value.nbytes > _INLINE_LIMIT or isinstance(v.const_value, ir.ExternalTensor))]
    originals = [v.const_value for v in values]
    moved: list[ir.ExternalTensor] = []
    with atomic_writer(path.with_name(data_name)) as f:
        offset = 0
        for value in values:
            tensor = value.const_value
            pad = -offset % _ALIGN
            f.write(bytes(pad))
            offset += pad
            tensor.tofile(f)
            if isinstance(tensor, ir.ExternalTensor):
                tensor.release()
            moved.append(ir.ExternalTensor(data_name, offset, tensor.nbytes, tensor.dtype, shape=tensor.shape,
                                           name=tensor.name or value.name or "", base_dir=str(path.parent)))
            offset += tensor.nbytes
    try:
        for value, tensor in zip(values, moved):
            value.const_value = tensor
        data = _serialize(model, path)
    finally:
        for value, tensor in zip(values, originals):
            value.const_value = tensor
    atomic_write_bytes(path, data)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
