"""npu_ep.quantization: INT4/INT8 math shared by the rewriter, the compiler and the kernels.

- ``rounding``: QuantizeLinear rounding (half to even) and saturation (NaN to the lowest value, as ORT) for
  int4/uint4/int8/uint8/int16/uint16; the kernels use it too.
- ``int4``: ONNX int4/uint4 packing (low nibble first).
- ``blockwise``: RTN block quantization bit-identical to ORT's MLAS (MatMulNBitsQuantizer).
- ``matmul_nbits``: com.microsoft MatMulNBits B/scales/zero_points layouts, packing and repacking, and
  accuracy_level 4's int8-unit tiles.

May import: numpy and ml_dtypes; no other npu_ep package (it is the bottom layer).
"""

from .blockwise import BlockQuantized, k_blocks, quantize_blockwise_rtn
from .int4 import pack_int4, unpack_int4
from .matmul_nbits import (
    MatMulNBitsWeights,
    dequantize_b,
    from_int8_tiles,
    int8_tiles,
    pack_b,
    pack_zero_points,
    quantize_matmul_nbits,
    repack_blocked_int4,
    unpack_b,
    unpack_zero_points,
)
from .rounding import (
    QUANT_RANGES,
    dequantize_linear,
    qrange,
    quantize_float,
    quantize_linear,
    round_half_away_from_zero,
    round_half_to_even,
    saturate,
)

__all__ = [
    "QUANT_RANGES", "BlockQuantized", "MatMulNBitsWeights", "dequantize_b", "dequantize_linear", "from_int8_tiles",
    "int8_tiles", "k_blocks",
    "pack_b", "pack_int4", "pack_zero_points", "qrange", "quantize_blockwise_rtn", "quantize_float", "quantize_linear",
    "quantize_matmul_nbits", "repack_blocked_int4", "round_half_away_from_zero", "round_half_to_even", "saturate",
    "unpack_b", "unpack_int4", "unpack_zero_points",
]
