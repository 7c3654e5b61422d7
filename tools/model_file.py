"""Reading a model file the user named, as the context cache reads its entries (``context_cache/fileio.py``).

Why: a folder of models can hold anything. Opening a FIFO for reading blocks until a writer comes (forever), a
``*.onnx`` symlink to ``/dev/zero`` reads without end, a socket or a folder is no model. So a path is opened with
``O_NONBLOCK`` (a FIFO does not wait for a writer), ``fstat`` on the open descriptor must say "regular file" (no
check-then-open race) and at most ``limit`` bytes are read. Symlinks to regular files are followed: model hubs
(Hugging Face's cache) store models as symlinks to blobs.

Errors: ``NotRegularFileError`` (a FIFO, device, socket, folder; a file above the limit) and the usual ``OSError``
(missing, permission denied). Every message names the path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

import onnx

PROTOBUF_LIMIT = 2**31 - 1  # protobuf reads no larger message: an .onnx file (its external data aside) is smaller
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """The path is not a regular file (or is larger than the reader's limit): never read."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


@contextmanager
def open_regular(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[tuple[int, int]]:
    """Yield ``(fd, size)`` of a regular file (symlinks followed) of at most ``limit`` bytes."""
    name = os.fspath(path)
    fd = os.open(name, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{name}: is {_kind(st.st_mode)}, not a regular file")
        if limit is not None and st.st_size > limit:
            raise NotRegularFileError(f"{name}: {st.st_size} bytes is above the limit of {limit} bytes")
        yield fd, st.st_size
    finally:
        os.close(fd)


def check_regular_file(path: str | os.PathLike[str]) -> None:
    """Raise ``NotRegularFileError`` / ``OSError`` unless ``path`` is a regular file that can be opened."""
    with open_regular(path):
        pass


def read_regular_file(path: str | os.PathLike[str], limit: int = PROTOBUF_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a file that grows while read stops at the limit)."""
    with open_regular(path, limit) as (fd, _size), os.fdopen(os.dup(fd), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotRegularFileError(f"{os.fspath(path)}: grew above the limit of {limit} bytes while being read")
    return data


def load_model_file(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """``onnx.load(path)`` through ``read_regular_file``: the model file and each external data file it names
    must be regular files (checked before onnx opens them). Parse errors propagate as onnx raises them."""
    name = os.fspath(path)
    model = onnx.load_model_from_string(read_regular_file(name))
    base = os.path.dirname(name)
    locations = external_data_locations(model)
    for location in locations:
        check_regular_file(os.path.join(base, location))
    if locations:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, base)
    return model


def external_data_locations(model: onnx.ModelProto) -> list[str]:
    """The external data file names (relative to the model's folder) of every tensor of the model, subgraphs
    included, each once."""
    from ..ep.onnx_graph import all_tensors

    names = (e.value for t in all_tensors(model.graph) for e in t.external_data if e.key == "location" and e.value)
    return list(dict.fromkeys(names))
