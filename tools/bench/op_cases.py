"""The cases of the op-by-op speed table (``tools/bench/ops.py``): one single-node (or single-group) model per
(op, dtype) of a target's op list and size, generated so that a new op of the target gets its row by itself.

A node's inputs come from its ONNX schema where that is enough (element-wise, comparisons, unary movement: every
required input is a runtime tensor of the case's shape; an input of another type constraint gets float32, else
int64). The ops whose inputs need values (weights, axes, indices, quantization parameters) or attributes have an
entry in ``SPECS``: a list of input kinds resolved by ``_value`` and the attributes. Fused groups (the compiler's
``npu::`` ops and conv + activation) are small graphs in ``GROUPS``. Whatever cannot be built is a case with a
``gap`` saying why, so the table shows it instead of leaving it out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...kernels.target import Target

SIZES = ("small", "medium", "large")
# data shapes from real models: per-call cost; 56x56 maps, 128-token sequences; 1500-frame audio, LLM widths
LAYOUTS: dict[str, dict[str, tuple[int, ...]]] = {
    "seq": {"small": (1, 64), "medium": (1, 128, 384), "large": (1, 1500, 1536)},
    "rows": {"small": (1, 64), "medium": (128, 384), "large": (1500, 1536)},   # rank-2 ops (Gemm)
    "seq3": {"small": (1, 1, 64), "medium": (1, 128, 384), "large": (1, 1500, 1536)},
    "map": {"small": (1, 16, 8, 8), "medium": (1, 64, 56, 56), "large": (1, 128, 56, 56)},
    "heads": {"small": (1, 1, 8, 64), "medium": (1, 6, 128, 64), "large": (1, 12, 1500, 128)},
    "gqa": {"small": (2, 1, 64, 16), "medium": (6, 2, 64, 128), "large": (32, 8, 128, 1500)},  # heads, kv, head, past
    "rnn": {"small": (1, 1, 64), "medium": (16, 1, 384), "large": (64, 1, 1024)},
}
OPSETS = {"": 23, "com.microsoft": 1}
NP = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
      "uint16": np.uint16, "int32": np.int32, "int64": np.int64, "bool": np.bool_}
GAPS = {  # (op key or "key:dtype") -> why no model is built yet
    "Scan": "control flow: the body is the work, no single-node model measures it",
    "com.microsoft::DynamicQuantizeLSTM": "no builder yet (packed int8 weights and their scales per gate)",
    "npu::MatMulEpilogue:int8": "no builder yet (an integer matmul with a quantize epilogue)",
    "npu::MatMulEpilogue:uint8": "no builder yet (an integer matmul with a quantize epilogue)",
}
FOUR_BIT = {"int4", "uint4"}


@dataclasses.dataclass
class Case:
    """One row of the table: ``model`` and ``feeds`` unless ``gap`` says why there is none."""
    op: str                   # target key: "Op" or "domain::Op"; a group's name for the extra fused groups
    dtype: str
    size: str
    model: onnx.ModelProto | None = None
    feeds: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    gap: str = ""
    checkable: bool = True    # every node has an ONNX schema known to onnx.checker (com.microsoft ones do not)

    @property
    def key(self) -> str:
        return f"{self.op} {self.dtype} {self.size}"


@dataclasses.dataclass
class Spec:
    """How to build one op's node: input kinds (see ``_value``), attributes, data layout, number of outputs."""
    inputs: tuple[str, ...]
    attrs: dict[str, Any] | Callable[[tuple[int, ...], str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    layout: str = "seq"
    outputs: int = 1
    out_dtype: str | tuple[str, ...] | None = None  # declared output type(s) where ONNX inference does not know the op
    same_shape: bool = False       # the output has the data's shape (declared so where inference gives none)


# -- input kinds ------------------------------------------------------------------------------------------------
# "x": the runtime data (case dtype, layout shape); "x+": positive; "x2" ("x2+"): a second runtime tensor like x;
# "c:NAME" a constant, "r:NAME" a runtime tensor, both from VALUES[NAME](shape, dtype, rng); "": a missing input.

def _data(shape: tuple[int, ...], dtype: str, rng: np.random.Generator, positive: bool = False) -> np.ndarray:
    t = NP[dtype]
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.issubdtype(t, np.integer):
        lo = 1 if positive or t in (np.int32, np.int64) else max(int(np.iinfo(t).min), -100)
        return rng.integers(lo, min(int(np.iinfo(t).max), 100), shape, endpoint=True).astype(t)
    x = rng.standard_normal(shape)
    return (np.abs(x) + 0.5 if positive else x).astype(t)


def _f(dtype: str) -> type:
    return NP[dtype] if dtype in ("float32", "float16") else np.float32


def _last(s):
    return s[-1]


def _chan(s):
    return s[1]


def _qzero(dt: str) -> np.ndarray:
    return np.array(0 if dt in ("int8", "int16", "int32") else (128 if dt == "uint8" else 32768), NP[dt])


VALUES: dict[str, Callable[[tuple[int, ...], str, np.random.Generator], np.ndarray]] = {
    "three": lambda s, d, r: np.array(3, NP[d]),
    "axes_last": lambda s, d, r: np.array([-1], np.int64),
    "axes_first": lambda s, d, r: np.array([0], np.int64),
    "axis_last": lambda s, d, r: np.array(-1, np.int64),
    "ones_last": lambda s, d, r: np.ones(_last(s), _f(d)),
    "zeros_last": lambda s, d, r: np.zeros(_last(s), _f(d)),
    "ones_chan": lambda s, d, r: np.ones(_chan(s), _f(d)),
    "zeros_chan": lambda s, d, r: np.zeros(_chan(s), _f(d)),
    "w_square": lambda s, d, r: (r.standard_normal((_last(s), _last(s))) / np.sqrt(_last(s))).astype(_f(d)),
    "w_conv": lambda s, d, r: (r.standard_normal((_chan(s), _chan(s), 3, 3)) / np.sqrt(9 * _chan(s))).astype(_f(d)),
    "w_conv_i8": lambda s, d, r: r.integers(-64, 64, (_chan(s), _chan(s), 3, 3)).astype(np.int8),
    "w_square_i8": lambda s, d, r: r.integers(-64, 64, (_last(s), _last(s))).astype(np.int8),
    "w_square_u8": lambda s, d, r: r.integers(0, 255, (_last(s), _last(s))).astype(np.uint8),
    "w_like_x": lambda s, d, r: r.integers(-64, 64, (_last(s), _last(s))).astype(NP[d]),
    "bias_i32_chan": lambda s, d, r: r.integers(-100, 100, _chan(s)).astype(np.int32),
    "scale": lambda s, d, r: np.array(0.02, _f(d)),
    "scale_f32": lambda s, d, r: np.array(0.02, np.float32),
    "zp": lambda s, d, r: _qzero(d),
    "zp_u8": lambda s, d, r: np.array(128, np.uint8),
    "zp_i8": lambda s, d, r: np.array(0, np.int8),
    "shape_flat": lambda s, d, r: np.array([1, -1], np.int64),
    "starts": lambda s, d, r: np.array([1], np.int64),
    "ends": lambda s, d, r: np.array([_last(s) - 1], np.int64),
    "every_other_last": lambda s, d, r: np.arange(0, _last(s), 2, dtype=np.int64),
    "expand_shape": lambda s, d, r: np.array((2,) + s, np.int64),
    "tile_last": lambda s, d, r: np.array([1] * (len(s) - 1) + [2], np.int64),
    "pads_last": lambda s, d, r: np.array([0] * (len(s) - 1) + [1] + [0] * (len(s) - 1) + [1], np.int64),
    "scales_2x": lambda s, d, r: np.array([1, 1, 2, 2], np.float32),
    "nd_indices": lambda s, d, r: np.array([[0, i] for i in range(0, s[1], 2)], np.int64),
    "nd_updates": lambda s, d, r: _data(((s[1] + 1) // 2,) + s[2:], d, r),
    "shape_vec": lambda s, d, r: np.array(s, np.int64),
    "zero": lambda s, d, r: np.array(0, NP[d]),
    "limit": lambda s, d, r: np.array(int(np.prod(s)), NP[d]),
    "one": lambda s, d, r: np.array(1, NP[d]),
    "k8": lambda s, d, r: np.array([min(8, _last(s))], np.int64),
    "clip_lo": lambda s, d, r: np.array(-1 if np.dtype(NP[d]).kind != "u" else 10, NP[d]),
    "clip_hi": lambda s, d, r: np.array(5 if np.dtype(NP[d]).kind != "f" else 0.5, NP[d]),
    "slope": lambda s, d, r: np.array([0.1], NP[d]),
    "ids": lambda s, d, r: r.integers(0, 1000, s[:2]).astype(np.int32),
    "word_emb": lambda s, d, r: r.standard_normal((1000, _last(s))).astype(np.float32),
    "pos_emb": lambda s, d, r: r.standard_normal((max(s[1], 2), _last(s))).astype(np.float32),
    "positions": lambda s, d, r: np.arange(s[2], dtype=np.int64)[None, :],
    "rot_cache": lambda s, d, r: r.standard_normal((s[2], s[3] // 2)).astype(_f(d)),
    "w_qkv": lambda s, d, r: (r.standard_normal((_last(s), 3 * _last(s))) / np.sqrt(_last(s))).astype(np.float32),
    "b_qkv": lambda s, d, r: np.zeros(3 * _last(s), np.float32),
    "u8": lambda s, d, r: _data(s, "uint8", r),
}


def _rnn_w(gates: int) -> dict[str, Callable]:
    return {f"W{gates}": lambda s, d, r: (r.standard_normal((1, gates * s[2], s[2])) * 0.05).astype(np.float32),
            f"R{gates}": lambda s, d, r: (r.standard_normal((1, gates * s[2], s[2])) * 0.05).astype(np.float32),
            f"B{gates}": lambda s, d, r: np.zeros((1, 2 * gates * s[2]), np.float32)}


VALUES.update(_rnn_w(4))
VALUES.update(_rnn_w(3))
VALUES.update(_rnn_w(1))


def _nbits(s, d, r):
    from ...quantization import quantize_matmul_nbits

    return quantize_matmul_nbits(r.standard_normal((_last(s), _last(s))).astype(np.float32), 32, True)


VALUES["nbits_B"] = lambda s, d, r: _nbits(s, d, np.random.default_rng(1)).B
VALUES["nbits_S"] = lambda s, d, r: _nbits(s, d, np.random.default_rng(1)).scales.astype(_f(d))

_Q8 = ("c:scale_f32", "c:zp")
SPECS: dict[str, Spec] = {
    "Pow": Spec(("x+", "c:three")),
    "Mod": Spec(("x", "x2+"), lambda s, d: {"fmod": int(d in ("float32", "float16"))}),  # float Mod is fmod only
    "Sqrt": Spec(("x+",)), "Log": Spec(("x+",)), "Reciprocal": Spec(("x+",)),
    "Cast": Spec(("x",), lambda s, d: {"to": TensorProto.FLOAT16 if d == "float32" else TensorProto.FLOAT}),
    "ReduceMean": Spec(("x", "c:axes_last")), "ReduceSum": Spec(("x", "c:axes_last")),
    "ReduceMax": Spec(("x", "c:axes_last")), "ReduceMin": Spec(("x", "c:axes_last")),
    "ReduceSumSquare": Spec(("x", "c:axes_last")), "ReduceL1": Spec(("x", "c:axes_last")),
    "ReduceL2": Spec(("x", "c:axes_last")), "ReduceProd": Spec(("x", "c:axes_last")),
    "LayerNormalization": Spec(("x", "c:ones_last", "c:zeros_last"), {"axis": -1}),
    "SimplifiedLayerNormalization": Spec(("x", "c:ones_last"), {"axis": -1}),
    "RMSNormalization": Spec(("x", "c:ones_last"), {"axis": -1}),
    "com.microsoft::SkipSimplifiedLayerNormalization": Spec(("x", "x2", "c:ones_last"), layout="seq3"),
    "com.microsoft::SkipLayerNormalization": Spec(("x", "x2", "c:ones_last", "c:zeros_last"), layout="seq3"),
    "com.microsoft::EmbedLayerNormalization": Spec(("r:ids", "", "c:word_emb", "c:pos_emb", "", "c:ones_last",
                                                    "c:zeros_last"), layout="seq3", outputs=2,
                                                   out_dtype=("float32", "int32")),
    "BatchNormalization": Spec(("x", "c:ones_chan", "c:zeros_chan", "c:zeros_chan", "c:ones_chan"), layout="map"),
    "InstanceNormalization": Spec(("x", "c:ones_chan", "c:zeros_chan"), layout="map"),
    "GroupNormalization": Spec(("x", "c:ones_chan", "c:zeros_chan"), {"num_groups": 4}, layout="map",
                               same_shape=True),
    "Conv": Spec(("x", "c:w_conv", "c:zeros_chan"), {"pads": [1, 1, 1, 1]}, layout="map"),
    "ConvTranspose": Spec(("x", "c:w_conv", "c:zeros_chan"), {"pads": [1, 1, 1, 1]}, layout="map"),
    "QLinearConv": Spec(("x", *_Q8, "c:w_conv_i8", "c:scale_f32", "c:zp_i8", *_Q8, "c:bias_i32_chan"),
                        {"pads": [1, 1, 1, 1]}, layout="map"),
    "ConvInteger": Spec(("x", "c:w_conv_i8", "c:zp", "c:zp_i8"), {"pads": [1, 1, 1, 1]}, layout="map"),
    "MaxPool": Spec(("x",), {"kernel_shape": [2, 2], "strides": [2, 2]}, layout="map"),
    "AveragePool": Spec(("x",), {"kernel_shape": [2, 2], "strides": [2, 2]}, layout="map"),
    "GlobalAveragePool": Spec(("x",), layout="map"), "GlobalMaxPool": Spec(("x",), layout="map"),
    "QuantizeLinear": Spec(("x", "c:scale", "c:zp_u8")),
    "DequantizeLinear": Spec(("x", "c:scale_f32", "c:zp")),
    "com.microsoft::QuantizeLinear": Spec(("x", "c:scale", "c:zp_u8"), out_dtype="uint8"),
    "com.microsoft::DequantizeLinear": Spec(("x", "c:scale_f32", "c:zp"), out_dtype="float32"),
    "MatMul": Spec(("x", "c:w_square")),
    "Gemm": Spec(("x", "c:w_square", "c:zeros_last"), {"transB": 1}, layout="rows"),
    "MatMulInteger": Spec(("x", "c:w_square_i8", "c:zp", "c:zp_i8")),
    "QLinearMatMul": Spec(("x", *_Q8, "c:w_square_i8", "c:scale_f32", "c:zp_i8", *_Q8)),
    "com.microsoft::MatMulIntegerToFloat": Spec(("x", "c:w_square_i8", "c:scale_f32", "c:scale_f32", "c:zp",
                                                 "c:zp_i8"), out_dtype="float32"),
    "com.microsoft::MatMulNBits": Spec(("x", "c:nbits_B", "c:nbits_S"), lambda s, d: {
        "K": s[-1], "N": s[-1], "bits": 4, "block_size": 32}),
    "com.microsoft::QLinearAdd": Spec(("x", *_Q8, "x2", *_Q8, *_Q8)),
    "com.microsoft::QLinearMul": Spec(("x", *_Q8, "x2", *_Q8, *_Q8)),
    "com.microsoft::QLinearSigmoid": Spec(("x", *_Q8, *_Q8)),
    "com.microsoft::QLinearConcat": Spec(("c:scale_f32", "c:zp_u8", "r:u8", "c:scale_f32", "c:zp_u8", "r:u8",
                                          "c:scale_f32", "c:zp_u8"), {"axis": -1}, out_dtype="uint8"),
    "com.microsoft::QLinearGlobalAveragePool": Spec(("x", *_Q8, *_Q8), {"channels_last": 0}, layout="map"),
    "com.microsoft::QGemm": Spec(("x", *_Q8, "c:w_square_i8", "c:scale_f32", "c:zp_i8", "", *_Q8), {"transB": 1},
                                 layout="rows"),
    "DynamicQuantizeLinear": Spec(("x",), outputs=3),
    "Reshape": Spec(("x", "c:shape_flat")),
    "Transpose": Spec(("x",), lambda s, d: {"perm": list(range(len(s) - 2)) + [len(s) - 1, len(s) - 2]}),
    "Concat": Spec(("x", "x2"), {"axis": -1}),
    "Split": Spec(("x",), {"axis": -1, "num_outputs": 2}, outputs=2),
    "Slice": Spec(("x", "c:starts", "c:ends", "c:axes_last")),
    "Gather": Spec(("x", "c:every_other_last"), {"axis": -1}),
    "Unsqueeze": Spec(("x", "c:axes_first")), "Squeeze": Spec(("x", "c:axes_first")),
    "Expand": Spec(("x", "c:expand_shape")),
    "Tile": Spec(("x", "c:tile_last")),
    "Pad": Spec(("x", "c:pads_last")),
    "Resize": Spec(("x", "", "c:scales_2x"), layout="map"),
    "GatherND": Spec(("x", "c:nd_indices"), layout="seq3"),
    "ScatterND": Spec(("x", "c:nd_indices", "r:nd_updates"), layout="seq3"),
    "ConstantOfShape": Spec(("r:shape_vec",), {"value": numpy_helper.from_array(np.array([1.0], np.float32))}),
    "Range": Spec(("r:zero", "r:limit", "r:one")),
    "CumSum": Spec(("x", "c:axis_last")),
    "ArgMax": Spec(("x",), {"axis": -1}), "ArgMin": Spec(("x",), {"axis": -1}),
    "TopK": Spec(("x", "c:k8"), outputs=2),
    "Clip": Spec(("x", "c:clip_lo", "c:clip_hi")),
    "PRelu": Spec(("x", "c:slope")),
    "com.microsoft::BiasGelu": Spec(("x", "c:zeros_last")),
    "com.microsoft::Gelu": Spec(("x",)), "com.microsoft::FastGelu": Spec(("x",)),
    "com.microsoft::QuickGelu": Spec(("x",), {"alpha": 1.702}),
    "com.microsoft::RotaryEmbedding": Spec(("x", "r:positions", "c:rot_cache", "c:rot_cache"), layout="heads"),
    "Attention": Spec(("x", "x2", "x2"), layout="heads"),
    "com.microsoft::MultiHeadAttention": Spec(("x", "x2", "x2"), lambda s, d: {"num_heads": max(1, s[-1] // 64)},
                                              layout="seq3"),
    "com.microsoft::Attention": Spec(("x", "c:w_qkv", "c:b_qkv"), lambda s, d: {"num_heads": max(1, s[-1] // 64)},
                                     layout="seq3"),
    "LSTM": Spec(("x", "c:W4", "c:R4", "c:B4"), lambda s, d: {"hidden_size": s[2]}, layout="rnn"),
    "GRU": Spec(("x", "c:W3", "c:R3", "c:B3"), lambda s, d: {"hidden_size": s[2], "linear_before_reset": 1},
                layout="rnn"),
    "RNN": Spec(("x", "c:W1", "c:R1", "c:B1"), lambda s, d: {"hidden_size": s[2]}, layout="rnn"),
    "Shape": Spec(("x",)), "Size": Spec(("x",)),
}
DYNAMIC_FIRST_DIM = {"Shape", "Size"}  # ORT folds them away when the input's shape is all constant
VARIADIC_TWO = {"Sum", "Mean", "Min", "Max"}


def _split_key(key: str) -> tuple[str, str]:
    return tuple(key.split("::", 1)) if "::" in key else ("", key)  # type: ignore[return-value] - two parts


def _generic_spec(domain: str, op: str) -> Spec | None:
    """All required inputs runtime tensors of the data's shape, from the schema; None: no schema."""
    try:
        schema = onnx.defs.get_schema(op, OPSETS.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return None
    n = max(schema.min_input, 2 if op in VARIADIC_TWO else 1)
    kinds = []
    first = schema.inputs[0].type_str if schema.inputs else ""
    for i in range(n):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        kinds.append("x" if i == 0 else ("x2" if formal.type_str == first else "r:other:" + formal.type_str))
    return Spec(tuple(kinds), outputs=max(1, schema.min_output))


def _other_dtype(domain: str, op: str, type_str: str) -> str:
    schema = onnx.defs.get_schema(op, OPSETS.get(domain, 1), domain)
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}.get(type_str, [])
    for pref in ("tensor(float)", "tensor(int64)"):
        if pref in allowed:
            return "float32" if pref == "tensor(float)" else "int64"
    return "float32"


def _value(kind: str, shape: tuple[int, ...], dtype: str, rng: np.random.Generator, domain: str, op: str
           ) -> tuple[np.ndarray, bool]:
    """(array, is_constant) for one input kind."""
    if kind in ("x", "x2", "x+", "x2+"):
        return _data(shape, dtype, rng, positive=kind.endswith("+")), False
    if kind.startswith("r:other:"):
        return _data(shape, _other_dtype(domain, op, kind[8:]), rng), False
    src, name = kind.split(":", 1)
    return VALUES[name](shape, dtype, rng), src == "c"


def _out_infos(model: onnx.ModelProto, names: list[str], fallback: list[int], shape: tuple | None = None
               ) -> list[onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        known = {v.name: v for v in inferred.graph.value_info}
    except Exception:  # noqa: BLE001 - an op onnx cannot infer: declare the type only
        known = {}
    out = []
    for i, n in enumerate(names):
        v = known.get(n)
        if v is not None and v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape"):
            out.append(v)
        else:
            out.append(helper.make_tensor_value_info(n, fallback[min(i, len(fallback) - 1)], shape))
    return out


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto],
           outputs: list[str], fallback: list[int], shape: tuple | None = None) -> onnx.ModelProto:
    opsets = [helper.make_opsetid(d, v) for d, v in OPSETS.items()]
    g = helper.make_graph(nodes, "op_bench", inputs, [], inits)
    m = helper.make_model(g, opset_imports=opsets, ir_version=10)
    m.graph.output.extend(_out_infos(m, outputs, fallback, shape))
    return m


def build_node_case(key: str, dtype: str, size: str, spec: Spec | None = None, seed: int = 0) -> Case:
    """The one-node model of ``key`` (target op key) for ``dtype`` at ``size``, or a case naming the gap."""
    domain, op = _split_key(key)
    generic = spec is None and key not in SPECS
    spec = spec or SPECS.get(key) or _generic_spec(domain, op)
    if spec is None:
        return Case(key, dtype, size, gap="no builder: no ONNX schema and no entry in op_cases.SPECS")
    if dtype not in NP:
        return Case(key, dtype, size, gap="no builder: ORT's Python API cannot feed or fetch 4-bit tensors")
    rng = np.random.default_rng(seed)
    shape = LAYOUTS[spec.layout][size]
    inputs, inits, feeds, names = [], [], {}, []
    for i, kind in enumerate(spec.inputs):
        if not kind:
            names.append("")
            continue
        arr, const = _value(kind, shape, dtype, rng, domain, op)
        name = f"in{i}"
        names.append(name)
        if const:
            inits.append(numpy_helper.from_array(arr, name))
        else:
            dims: list = list(arr.shape)
            if op in DYNAMIC_FIRST_DIM and dims:
                dims[0] = "N"
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), dims))
            feeds[name] = arr
    attrs = spec.attrs(shape, dtype) if callable(spec.attrs) else dict(spec.attrs)
    outs = [f"out{i}" for i in range(spec.outputs)]
    node = helper.make_node(op, names, outs, name=f"{op}_0", domain=domain or None, **attrs)
    out_dtypes = spec.out_dtype if isinstance(spec.out_dtype, tuple) else (spec.out_dtype or dtype,)
    fallback = [helper.np_dtype_to_tensor_dtype(np.dtype(NP[d])) for d in out_dtypes]
    model = _model([node], inputs, inits, outs, fallback, shape if spec.same_shape else None)
    checkable = domain == "" and _has_onnx_schema(op)
    if generic and checkable:
        try:
            onnx.checker.check_model(model, full_check=True)
        except onnx.checker.ValidationError as exc:
            return Case(key, dtype, size, gap=f"no builder: the model from {op}'s schema alone is invalid ({exc}); "
                                              "it needs an entry in op_cases.SPECS")
    return Case(key, dtype, size, model, feeds, checkable=checkable)


def _has_onnx_schema(op: str) -> bool:
    try:
        onnx.defs.get_schema(op, OPSETS[""], "")
        return True
    except onnx.defs.SchemaError:
        return False


# -- fused groups -------------------------------------------------------------------------------------------------

class _G:
    """A tiny graph builder for the fused groups."""

    def __init__(self, dtype: str, seed: int = 0):
        self.dtype, self.rng, self.nodes, self.inits, self.inputs, self.feeds = dtype, np.random.default_rng(seed), \
            [], [], [], {}
        self.n = 0
        self.declared: dict[str, tuple[int, ...]] = {}  # output shapes to declare where inference gives none

    def feed(self, arr: np.ndarray) -> str:
        name = f"in{len(self.feeds)}"
        self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        self.feeds[name] = arr
        return name

    def const(self, arr: Any) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def op(self, op_type: str, *ins: str, outputs: int = 1, domain: str = "", **attrs: Any) -> Any:
        self.n += 1
        outs = [f"t{self.n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(ins), outs, name=f"{op_type}_{self.n}",
                                           domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, outputs: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        fallback = [helper.np_dtype_to_tensor_dtype(np.dtype(NP[self.dtype]))]
        m = _model(self.nodes, self.inputs, self.inits, outputs, fallback)
        for out in m.graph.output:
            if out.name in self.declared:
                out.CopyFrom(helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type,
                                                          self.declared[out.name]))
        return m, self.feeds

    def w(self, *shape: int) -> str:
        return self.const((self.rng.standard_normal(shape) / np.sqrt(shape[0])).astype(NP[self.dtype]))


def _matmul_epilogue(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    y = g.op("MatMul", x, g.w(s[-1], s[-1]))
    return [g.op("Relu", g.op("Add", y, g.const(np.zeros(s[-1], NP[g.dtype]))))]


def _matmul_group(g: _G, s: tuple[int, ...]) -> list[str]:
    """An LLM MLP's gate and up projections with their SwiGLU, silu(x W_gate) * (x W_up): one connected graph (NpuEP
    makes a partition per connected part, and siblings in different partitions never group)."""
    x = g.feed(_data(s, g.dtype, g.rng))
    gate, up = (g.op("MatMul", x, g.w(s[-1], s[-1])) for _ in range(2))
    return [g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)]


def _rms_norm(g: _G, x: str, width: int) -> str:
    ms = g.op("ReduceMean", g.op("Pow", x, g.const(np.array(2.0, np.float32))), g.const(np.array([-1], np.int64)))
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(np.array(1e-6, np.float32)))))
    return g.op("Mul", g.const(np.ones(width, np.float32)), g.op("Mul", x, inv))


def _norm_matmul(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    n = g.op("SimplifiedLayerNormalization", x, g.const(np.ones(s[-1], np.float32)), axis=-1, epsilon=1e-6)
    return [g.op("MatMul", n, g.w(s[-1], s[-1]))]


def _attention_chain(g: _G, s: tuple[int, ...]) -> list[str]:
    q, k, v = (g.feed(_data(s, g.dtype, g.rng)) for _ in range(3))
    kt = g.op("Transpose", k, perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", q, kt), g.const(np.array(1 / np.sqrt(s[-1]), np.float32)))
    return [g.op("MatMul", g.op("Softmax", scores, axis=-1), v)]


def _rotate_half(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    half = s[-1] // 2
    cos = g.const(g.rng.standard_normal((s[-2], s[-1])).astype(np.float32))
    sin = g.const(g.rng.standard_normal((s[-2], s[-1])).astype(np.float32))
    ax = g.const(np.array([-1], np.int64))
    lo = g.op("Slice", x, g.const(np.array([0], np.int64)), g.const(np.array([half], np.int64)), ax)
    hi = g.op("Slice", x, g.const(np.array([half], np.int64)), g.const(np.array([s[-1]], np.int64)), ax)
    rot = g.op("Concat", g.op("Neg", hi), lo, axis=-1)
    return [g.op("Add", g.op("Mul", x, cos), g.op("Mul", rot, sin))]


def _qdq_lut(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    zp = g.const(_qzero(g.dtype))
    sc = g.const(np.array(0.05, np.float32))
    y = g.op("Mul", g.op("DequantizeLinear", x, sc, zp), g.const(np.array(0.5, np.float32)))  # a unit qdq_lut folds
    return [g.op("QuantizeLinear", y, g.const(np.array(1 / 256, np.float32)), zp)]


def _elementwise_chain(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    silu = g.op("Mul", x, g.op("Sigmoid", x))  # SiLU and a scale: one chain (kernels/fusion/eltwise_chain.py)
    return [g.op("Mul", silu, g.const(np.array(2.0, np.float32)))]


def _qdq_matmul(g: _G, s: tuple[int, ...]) -> list[str]:
    x = g.feed(_data(s, g.dtype, g.rng))
    wdt = "int8"  # 8-bit weights: a8w8, and a16w8 as QNN's 16-bit activation units
    w = g.const(_data((s[-1], s[-1]), wdt, g.rng))
    sc = g.const(np.array(0.01, np.float32))
    a = g.op("DequantizeLinear", x, sc, g.const(_qzero(g.dtype)))
    b = g.op("DequantizeLinear", w, sc, g.const(_qzero(wdt)))
    return [g.op("QuantizeLinear", g.op("MatMul", a, b), g.const(np.array(0.05, np.float32)),
                 g.const(_qzero(g.dtype)))]


def _gqa_decode(g: _G, s: tuple[int, ...]) -> list[str]:
    """One new token against ``past`` cached ones (B=1, separate Q/K/V), as an LLM's decode step."""
    heads, kv_heads, head, past = s
    q = g.feed(_data((1, 1, heads * head), g.dtype, g.rng))
    k, v = (g.feed(_data((1, 1, kv_heads * head), g.dtype, g.rng)) for _ in range(2))
    pk, pv = (g.feed(_data((1, kv_heads, past, head), g.dtype, g.rng)) for _ in range(2))
    lens = g.feed(np.full((1,), past, np.int32))
    total = g.feed(np.array(past + 1, np.int32))
    outs = g.op("GroupQueryAttention", q, k, v, pk, pv, lens, total, outputs=3, domain="com.microsoft",
                num_heads=heads, kv_num_heads=kv_heads)
    g.declared = {outs[0]: (1, 1, heads * head), outs[1]: (1, kv_heads, past + 1, head),
                  outs[2]: (1, kv_heads, past + 1, head)}  # presents grow by the new token, as the CPU EP returns
    return outs


def _conv_then(act: str, **attrs: Any) -> Callable[[_G, tuple[int, ...]], list[str]]:
    def build(g: _G, s: tuple[int, ...]) -> list[str]:
        x = g.feed(_data(s, g.dtype, g.rng))
        w = g.const((g.rng.standard_normal((s[1], s[1], 3, 3)) / np.sqrt(9 * s[1])).astype(NP[g.dtype]))
        y = g.op("Conv", x, w, g.const(np.zeros(s[1], NP[g.dtype])), pads=[1, 1, 1, 1])
        return [g.op(act, y, **attrs)]
    return build


def _conv_then_prelu(g: _G, s: tuple[int, ...]) -> list[str]:
    """Conv then a PRelu of one slope per output channel ([C, 1, 1]: face-detection cascades, MobileFaceNets)."""
    x = g.feed(_data(s, g.dtype, g.rng))
    w = g.const((g.rng.standard_normal((s[1], s[1], 3, 3)) / np.sqrt(9 * s[1])).astype(NP[g.dtype]))
    y = g.op("Conv", x, w, g.const(np.zeros(s[1], NP[g.dtype])), pads=[1, 1, 1, 1])
    slope = g.const(g.rng.uniform(0.05, 0.3, (s[1], 1, 1)).astype(NP[g.dtype]))
    return [g.op("PRelu", y, slope)]


def _if_select(g: _G, s: tuple[int, ...]) -> list[str]:
    """An If picking Relu(x) or Neg(x) by a runtime condition: choosing and calling a branch beside one cheap op."""
    x = g.feed(_data(s, "float32", g.rng))
    cond = g.feed(np.array(True))

    def branch(op: str) -> onnx.GraphProto:
        out = f"{op.lower()}_out"
        return helper.make_graph([helper.make_node(op, [x], [out], name=f"{op}_branch")], op.lower(), [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, s)])

    out = g.op("If", cond, then_branch=branch("Relu"), else_branch=branch("Neg"))
    g.declared = {out: s}
    return [out]


def _loop_accumulate(g: _G, s: tuple[int, ...]) -> list[str]:
    """A Loop of 8 iterations carrying v = v + x (x from the outer scope, the row's dtype): a body call per
    iteration beside one cheap op."""
    x = g.feed(_data(s, g.dtype, g.rng))
    trips = g.feed(np.array(8, np.int64))
    vi, elem = helper.make_tensor_value_info, helper.np_dtype_to_tensor_dtype(np.dtype(NP[g.dtype]))
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", x], ["v_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", elem, s)],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", elem, s)])
    out = g.op("Loop", trips, "", x, body=body)
    g.declared = {out: s}
    return [out]


# (builder, layout) per fused group: the target's npu:: ops, then groups whose fused op keeps the op's own name
GROUPS: dict[str, tuple[Callable[[_G, tuple[int, ...]], list[str]], str]] = {
    "npu::MatMulEpilogue": (_matmul_epilogue, "seq"),
    "npu::MatMulGroup": (_matmul_group, "seq"),
    "npu::NormMatMul": (_norm_matmul, "seq3"),
    "npu::AttentionChain": (_attention_chain, "heads"),
    "npu::RotateHalf": (_rotate_half, "heads"),
    "npu::QdqLut": (_qdq_lut, "seq"),
    "npu::ElementwiseChain": (_elementwise_chain, "seq"),
    "npu::QdqMatMul": (_qdq_matmul, "seq"),
    "com.microsoft::GroupQueryAttention": (_gqa_decode, "gqa"),
    "If": (_if_select, "seq"),
    "Loop": (_loop_accumulate, "seq"),
    "group::Conv+Relu": (_conv_then("Relu"), "map"),
    "group::Conv+LeakyRelu": (_conv_then("LeakyRelu", alpha=0.1), "map"),
    "group::Conv+HardSwish": (_conv_then("HardSwish"), "map"),
    "group::Conv+PRelu": (_conv_then_prelu, "map"),
}
EXTRA_GROUP_DTYPES = {"group::Conv+Relu": ("float32",), "group::Conv+LeakyRelu": ("float32",),
                      "group::Conv+HardSwish": ("float32",), "group::Conv+PRelu": ("float32",)}


def build_group_case(key: str, dtype: str, size: str, seed: int = 0) -> Case:
    build, layout = GROUPS[key]
    g = _G(dtype, seed)
    outs = build(g, LAYOUTS[layout][size])
    model, feeds = g.model(outs)
    checkable = all(not n.domain and _has_onnx_schema(n.op_type) for n in model.graph.node)
    return Case(key, dtype, size, model, feeds, checkable=checkable)


def build_case(key: str, dtype: str, size: str) -> Case:
    """Any row: a gap, a fused group or a one-node model; a builder's exception becomes the row's gap."""
    gap = GAPS.get(f"{key}:{dtype}") or GAPS.get(key)
    if gap:
        return Case(key, dtype, size, gap=gap)
    try:
        if key in GROUPS:
            return build_group_case(key, dtype, size)
        if key.startswith("npu::"):
            return Case(key, dtype, size, gap="no builder: a fused op without an entry in op_cases.GROUPS")
        return build_node_case(key, dtype, size)
    except Exception as exc:  # noqa: BLE001 - a broken builder is a visible row, not a crash of the table
        return Case(key, dtype, size, gap=f"builder failed: {type(exc).__name__}: {exc}")


def target_rows(target: Target) -> list[tuple[str, str]]:
    """(op key, dtype) of every op and dtype the target lists (an op without dtypes: one row, dtype "-"), then the
    extra fused groups."""
    rows = []
    for (domain, op), rule in sorted(target.ops.items()):
        key = f"{domain}::{op}" if domain else op
        rows += [(key, dt) for dt in sorted(rule.dtypes)] or [(key, "-")]
    rows += [(k, dt) for k, dts in EXTRA_GROUP_DTYPES.items() for dt in dts]
    return rows


def cases(target: Target, sizes: tuple[str, ...] = SIZES, ops: set[str] | None = None):
    """Every case, lazily (a large model is built only when its row runs)."""
    for key, dtype in target_rows(target):
        if ops and key not in ops and key.split("::")[-1] not in ops:
            continue
        for size in sizes:
            yield lambda key=key, dtype=dtype, size=size: build_case(key, dtype, size)
