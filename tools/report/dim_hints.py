"""Input sizes a model can run with when size 1 cannot: sizes from the model's own shape hints, tried in order.

Why: ``resolve_dims`` sizes a symbolic dim it knows nothing about as 1 (a decode step, a batch of one). An image
net with dims named ``h``/``w`` then fails inside ORT ("Shape mismatch" where a stride-2 conv and a 2x Resize meet
again at an Add). The model says what it needs: every Conv/MaxPool/AveragePool stride divides the size, every
Resize scale multiplies it back, so the input must be a multiple of the largest downsampling any tensor sees
(``downsampling``). The sizes tried are multiples of that; the first one the CPU EP runs is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .attention_dims import attention_dims
from .run import _dim_name, _graph_inputs

_STRIDED = ("Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "ConvTranspose")
MAX_TRIED_SIZE = 1024


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: t for t in model.graph.initializer}
    out = {}
    for name, t in values.items():
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and np.prod(t.dims) <= 16:
            out[name] = numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and np.prod(t.dims) <= 16:
                out[n.output[0]] = numpy_helper.to_array(t)
    return out


def _node_factor(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> float:
    """How much ``node`` divides a spatial size: its largest stride (ConvTranspose multiplies: 1 / stride), a
    Resize's smallest spatial scale inverted; 1 for everything else."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type in _STRIDED and "strides" in attrs:
        stride = max(attrs["strides"].ints, default=1)
        return 1 / stride if node.op_type == "ConvTranspose" else float(stride)
    if node.op_type in ("Resize", "Upsample"):
        scales = node.input[2] if node.op_type == "Resize" and len(node.input) > 2 else (
            node.input[1] if node.op_type == "Upsample" and len(node.input) > 1 else "")
        values = constants.get(scales)
        if values is not None and values.size > 2 and np.all(values > 0):
            return 1 / float(np.min(values[2:]))
    return 1.0


def downsampling(model: onnx.ModelProto) -> int:
    """The largest factor by which any tensor of the main graph is smaller than the inputs it comes from (the
    product of the strides on its path, divided by the Resize scales on it): input sizes must be multiples of it."""
    constants = _constants(model)
    factor: dict[str, float] = {i.name: 1.0 for i in model.graph.input}
    largest = 1.0
    for node in model.graph.node:
        here = max((factor.get(i, 1.0) for i in node.input if i), default=1.0) * _node_factor(node, constants)
        for o in node.output:
            factor[o] = here
        largest = max(largest, here)
    return max(1, math.ceil(largest - 1e-9))


def sized_one(model: onnx.ModelProto, dims: Mapping[str, int], given: Mapping[str, int]) -> list[str]:
    """The dims ``resolve_dims`` sized 1 by default (not given, not fixed by the structure, not a batch)."""
    fixed = set()
    inputs = {i.name: i for i in _graph_inputs(model)}
    for (inp, axis) in attention_dims(model).sizes:
        fixed.add(_dim_name(inputs[inp], axis, inputs[inp].type.tensor_type.shape.dim[axis]))
    return [name for name, size in dims.items()
            if size == 1 and name not in given and name not in fixed and "batch" not in name.lower()]


def candidate_sizes(model: onnx.ModelProto) -> list[int]:
    """Sizes to try for the dims sized 1, smallest first: multiples of ``downsampling`` (at least 2)."""
    base = max(2, downsampling(model))
    return sorted({base * k for k in (1, 2, 4, 7, 16) if base * k <= MAX_TRIED_SIZE} or {base})


def with_sizes(dims: Mapping[str, int], names: Sequence[str], size: int) -> dict[str, int]:
    return {**dims, **{n: size for n in names}}


def inputs_that_run(model: onnx.ModelProto, dims: Mapping[str, int], given: Mapping[str, int], where: str,
                    max_input_mib: float) -> tuple[dict[str, int], dict[str, np.ndarray], object]:
    """(dims, feeds, CPU EP session that ran them): ``dims`` if the CPU EP runs them; else, when dims were sized 1
    by default, the first of ``candidate_sizes`` for them that runs. Nothing runs: the first error, naming the dims
    sized 1 and ``--dim`` (``ReportInputError``)."""
    from .run import check_input_memory, cpu_loaded, cpu_run, make_feeds
    from .validate import ReportInputError

    check_input_memory(model, dims, where, max_input_mib)
    cpu = cpu_loaded(model.SerializeToString(), where)
    feeds = make_feeds(model, dims)
    try:
        cpu_run(cpu, feeds, where)
        return dict(dims), feeds, cpu
    except ReportInputError as exc:
        ones = sized_one(model, dims, given)
        if not ones:
            raise
        first = exc
    for size in candidate_sizes(model):
        tried = with_sizes(dims, ones, size)
        try:
            check_input_memory(model, tried, where, max_input_mib)
        except ReportInputError:
            break  # larger sizes need more still
        feeds = make_feeds(model, tried)
        try:
            cpu_run(cpu, feeds, where)
            return tried, feeds, cpu
        except ReportInputError:
            continue
    named = ", ".join(f"{n}=1" for n in ones)
    raise ReportInputError(f"{first}; the input dims not given were sized {named}, and the sizes the model's "
                           f"strides and scales suggest ({', '.join(map(str, candidate_sizes(model)))}) did not run "
                           "either: set them with --dim NAME=VALUE") from None
