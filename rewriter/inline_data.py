"""Load a model file whose weights are inline without copying them: large ``raw_data`` becomes external data.

``onnx.load`` reads the whole file and protobuf copies every tensor's bytes into the message: a 400 MB model
costs ~2x its size before any rewrite starts. Here the file is memory-mapped and its wire format walked
(ModelProto.graph = field 7, GraphProto.initializer = 5, TensorProto.raw_data = 9); every top-level initializer
whose ``raw_data`` is larger than ``MIN_BYTES`` is re-encoded as ``data_location = EXTERNAL`` (field 14) with
``external_data`` (field 13) = {location: the model file itself, offset, length}. Only the rest of the message is
copied and parsed; onnx-ir then maps each weight from the model file when a rule reads it.

Anything unexpected in the wire format (a group, a truncated field) returns None, and the caller falls back to
``onnx.load``: this is an optimization, never a second parser that decides what a model means.
"""

from __future__ import annotations

import mmap
import os
import pathlib

import onnx

MIN_BYTES = 1024  # smaller tensors stay inline (as onnx.save's size_threshold)
MIN_FILE_BYTES = 32 << 20  # below this, onnx.load's copy costs little
_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_EXTERNAL_DATA, _TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION = 13, 9, 14


class _Malformed(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf, pos: int, end: int):
    """(field number, wire type, field start, value start, value end) of each field in ``buf[pos:end]``."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, after = _varint(buf, pos, end)
            yield field, wire, start, pos, after
        elif wire == _LEN:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed
            yield field, wire, start, pos, pos + length
            after = pos + length
        elif wire in (_I64, _I32):
            after = pos + (8 if wire == _I64 else 4)
            if after > end:
                raise _Malformed
            yield field, wire, start, pos, after
        else:  # groups (3, 4) and reserved types: not in ONNX's messages
            raise _Malformed
        pos = after


def _len_field(field: int, payload: bytes | bytearray) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(payload)) + bytes(payload)


def _tensor(buf, start: int, end: int, location: str) -> bytes | bytearray:
    """The TensorProto in ``buf[start:end]``, its large raw_data replaced by a reference into the file."""
    fields = list(_fields(buf, start, end))
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA and f[1] == _LEN]
    location_set = any(f[0] == _TENSOR_DATA_LOCATION and _varint(buf, f[3], f[4])[0] != 0 for f in fields)
    if len(raw) != 1 or raw[0][4] - raw[0][3] <= MIN_BYTES or location_set or any(
            f[0] == _TENSOR_EXTERNAL_DATA for f in fields):
        return buf[start:end]
    out = bytearray()
    for field, _, fstart, _, fend in fields:
        if field not in (_TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION):  # data_location DEFAULT may be written out
            out += buf[fstart:fend]
    _, _, _, offset, data_end = raw[0]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(data_end - offset))):
        out += _len_field(_TENSOR_EXTERNAL_DATA, _len_field(1, key.encode()) + _len_field(2, value.encode()))
    out += _encode_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _encode_varint(onnx.TensorProto.EXTERNAL)
    return out


def _graph(buf, start: int, end: int, location: str) -> bytearray:
    out = bytearray()
    for field, wire, fstart, vstart, vend in _fields(buf, start, end):
        if field == _GRAPH_INITIALIZER and wire == _LEN:
            out += _len_field(field, _tensor(buf, vstart, vend, location))
        else:
            out += buf[fstart:vend]
    return out


def load_mapped(path: str | os.PathLike) -> onnx.ModelProto | None:
    """The model at ``path`` with its large inline initializers as external data in the model file itself, or
    None when the file is small, not binary protobuf (by suffix) or not walkable (then use ``onnx.load``)."""
    path = pathlib.Path(path)
    if path.suffix != ".onnx" or path.stat().st_size < MIN_FILE_BYTES:
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        buf = memoryview(mapped)
        try:
            out = bytearray()
            for field, wire, fstart, vstart, vend in _fields(buf, 0, len(buf)):
                if field == _MODEL_GRAPH and wire == _LEN:
                    out += _len_field(field, _graph(buf, vstart, vend, path.name))
                else:
                    out += buf[fstart:vend]
        except _Malformed:
            return None
        finally:
            buf.release()
    model = onnx.ModelProto()
    model.ParseFromString(bytes(out))
    return model
