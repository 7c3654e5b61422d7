"""The stamp of a compiled program: compiler version and target, checked in cache keys, container headers and
EPContext nodes, so a program is never loaded by a compiler that would have built it differently."""

from __future__ import annotations

from .._version import __version__
from ..context_cache.container import ContainerExpect, ContainerMeta
from ..kernels.target import Target

# The one place to bump: raise the cN suffix (c4 -> c5, and add a note) in the commit whose change to the compiler
# (ep/compiler.py, kernels/fusion/) or to a kernel's prepared layout changes compiled programs. Cache entries and
# EPContext models made by the previous version then miss or are refused instead of being loaded.
# c24: the layout pass keeps pools (npu::PoolNhwc), Resizes (axes [0, 3, 1, 2]) and Shapes of its maps in NHWC;
# c23: npu::AttentionChain takes K's Transpose (k_transpose; k_repeat / v_repeat);
# c22: npu::QdqMatMul keeps W - w_zp as int16 panels (wp, colsum, chunk_pairs; K and N as attrs), not float64 w;
# c21: GroupQueryAttention keeps its KV cache format (kv_format, the target's kv_cache_dtype; issue 41);
# c20: an act-order MatMulNBits keeps its rows permuted into blocks and A's column order (nb_perm; issue 38);
# c19: reductions, Softmax/LogSoftmax, pooling, Shape/Size and the convs keep a constant data input (issue 38);
# c18: com.microsoft DynamicQuantizeLSTM compiles to one step (int8 products, ORT's dynamic quantization of h);
# c17: HardSwish folds into the conv tail; c16: Sigmoid is a conv-tail instruction, so SiLU folds into the conv;
# c15: sibling groups take matmuls with a constant per-column bias (MatMulEpilogue) and the norm pass folds into
# them; c14: npu::RotateHalf takes the Slices' bounds as inputs (TorchScript computes them at run time); c13: the
# rotary pass, exporters' rotary embedding as one npu::RotateHalf (kernels/fusion/rotary.py); c12: the rms pass, an
# RMS norm written out op by op as one SimplifiedLayerNormalization (kernels/fusion/rms.py);
# c11: npu::AttentionChain keeps its Softmax's axis and opset (unknown ranks); c10: it takes the exporters' repeat_kv
# (k_path / v_path); c9: materialized attention chains fused into npu::AttentionChain (kernels/fusion/attention.py);
# c8: accuracy_level 4 MatMulNBits keeps its weights as the int8 unit's tiles (quantization.matmul_nbits.int8_tiles);
# c7: QDQ lookup-table units folded into QLinearConv, QDQ byte units, fused conv tails; c6: MatMulGroup over
# MatMulNBits keeps its members' weights (m{i}/nb_*), not one concatenation; c5: QLinearConv keeps integer weights
# (qw); c4: pool attrs (auto_pad, 1-D); c3: packed MatMulNBits; c2: fusions
COMPILER_VERSION = f"{__version__}+c24"


def stamp(target: Target, key: str) -> ContainerMeta:
    """What a new container records about its maker (``key``: the cache key it was compiled under)."""
    return ContainerMeta(COMPILER_VERSION, target.name, target.digest, key)


def expected(target: Target) -> ContainerExpect:
    """What a loaded container must match to run in a session for ``target``."""
    return ContainerExpect(target_name=target.name, target_hash=target.digest, compiler_version=COMPILER_VERSION)
