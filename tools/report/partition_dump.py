"""``npu-report --dump-partitions DIR``: every NPU partition as a standalone, runnable ONNX model.

What NPU users hand their vendors: the exact subgraph the EP takes, with its boundary tensors (the CPU<->NPU
crossings) as graph inputs and outputs, so it can be replayed against any EP, bisected or profiled alone.

onnx-graphsurgeon does the extraction by tensors (its documented "isolate a subgraph" recipe): point the graph's
inputs and outputs at the boundary tensors, ``cleanup`` drops everything outside, ``toposort`` orders what is left.
A partition is convex (the partitioner never lets a path leave it and come back), so the nodes between its
boundary tensors are exactly its nodes and the constants they read.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..._atomic import atomic_write_bytes
from ...ep.capability import Capability
from ...ep.onnx_graph import infer_all_shapes
from ...ep.partition import boundary
from ...kernels.node import NodeInfo


class DumpError(RuntimeError):
    """A partition could not be written as a standalone model; the message names the partition and tensor."""


def file_name(index: int) -> str:
    """``p000.onnx``: the partition's label in the report (``p0: ...``), zero-padded so files sort in order."""
    return f"p{index:03d}.onnx"


def check_folder(folder: str | os.PathLike) -> pathlib.Path:
    """Refuse, before any work, a folder argument that cannot be one: empty, or an existing non-folder."""
    if not os.fspath(folder):
        raise DumpError("--dump-partitions: the folder name is empty (give a folder, '.' for this one)")
    path = pathlib.Path(folder)
    if path.exists() and not path.is_dir():
        raise DumpError(f"{path}: cannot dump partitions there: it exists and is not a folder")
    return path


def dump_partitions(model: onnx.ModelProto, nodes: Sequence[NodeInfo], cap: Capability, names: Sequence[str],
                    folder: str | os.PathLike, dims: Mapping[str, int] | None = None) -> list[dict]:
    """Write one ``.onnx`` per partition into ``folder`` (created if missing), all or nothing: files are only ever
    created there, never replaced (an existing file of the same name is an error), and if any partition fails
    (extraction, a full disk, a read-only folder) the files and folders this call created are removed again.
    Symbolic dims named in ``dims`` become concrete in the partitions' I/O. Returns one entry per file:
    partition, path, inputs, outputs, nodes."""
    folder = check_folder(folder)
    paths = [folder / file_name(i) for i in range(len(cap.partitions))]
    taken = [p for p in paths if os.path.lexists(p)]
    if taken:
        raise DumpError(f"{taken[0]}: exists already; dump into an empty folder")
    created: list[pathlib.Path] = []
    try:
        created += _make_folders(folder)
        return _write_all(model, nodes, cap, names, paths, dims or {}, created)
    except BaseException:
        for p in reversed(created):
            with contextlib.suppress(OSError):
                p.rmdir() if p.is_dir() else p.unlink()
        raise


def _make_folders(folder: pathlib.Path) -> list[pathlib.Path]:
    """Create ``folder`` and its missing parents; returns those created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    for p in missing:
        try:
            p.mkdir()
        except OSError as exc:
            raise DumpError(f"{folder}: cannot create the folder: {exc.strerror or exc}") from None
    return missing


def _write_all(model: onnx.ModelProto, nodes: Sequence[NodeInfo], cap: Capability, names: Sequence[str],
               paths: Sequence[pathlib.Path], dims: Mapping[str, int], created: list[pathlib.Path]) -> list[dict]:
    inferred = infer_all_shapes(model)
    by_index = {n.index: n for n in nodes}
    written = []
    for name, group, path in zip(names, cap.partitions, paths):
        inputs, outputs = boundary(group, nodes)
        sub = _extract(inferred, [v.name for v in inputs], [v.name for v in outputs], name, dims)
        n_nodes = sum(1 for n in sub.graph.node if n.op_type != "Constant")
        if n_nodes != len(group):
            raise DumpError(f"partition '{name}': extracting it by its boundary tensors gave {n_nodes} nodes, the "
                            f"partition has {len(group)} (first node '{by_index[group[0]].name}')")
        try:
            atomic_write_bytes(path, sub.SerializeToString())
        except OSError as exc:
            raise DumpError(f"{path.parent}: cannot write partition file {path.name}: {exc.strerror or exc}; "
                            "no partition was kept") from None
        created.append(path)
        written.append({"partition": name, "path": str(path), "inputs": [v.name for v in inputs],
                        "outputs": [v.name for v in outputs], "nodes": len(group)})
    return written


def _extract(model: onnx.ModelProto, inputs: list[str], outputs: list[str], name: str,
             dims: Mapping[str, int]) -> onnx.ModelProto:
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    for t in (*inputs, *outputs):
        v = tensors.get(t)
        if v is None or (isinstance(v, gs.Variable) and v.dtype is None):
            raise DumpError(f"partition '{name}': boundary tensor '{t}' has no type after shape inference")
    graph.inputs = [_specialized(tensors[t], dims) for t in inputs]
    graph.outputs = [_specialized(tensors[t], dims) for t in outputs]
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    graph.name = name
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    return out


def _specialized(t: gs.Variable, dims: Mapping[str, int]) -> gs.Variable:
    if t.shape is not None:
        t.shape = [dims.get(d, d) if isinstance(d, str) else d for d in t.shape]
    return t


def boundary_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                    names: Sequence[str]) -> dict[str, np.ndarray]:
    """Values of the named tensors for ``feeds``, computed by ORT's CPU EP on the whole model: the inputs that
    replay a dumped partition, and the outputs it must reproduce."""
    import onnxruntime as ort

    inferred = infer_all_shapes(model)
    known = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n in feeds or n in have:
            continue
        if n not in known:
            raise DumpError(f"tensor '{n}' has no type after shape inference")
        probe.graph.output.append(known[n])
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = [n for n in names if n not in feeds]
    values = dict(zip(wanted, sess.run(wanted, dict(feeds))))
    values.update({n: feeds[n] for n in names if n in feeds})
    return values
