"""npu_ep.kernels.ops: one module per op family, each op's reference half.

A module registers its kernels with ``kernels.registry``: a check that returns why a node is declined (or None), a
prepare step run at compile time (tile plans, constants laid out), and a numpy run that is the reference model every
native kernel is tested against; where a native kernel exists, the module binds it through ``kernels.runtime``.
Modules named ``_*`` are helpers shared by several families.

May import: the rest of ``kernels`` (the fusion passes' op names included), ``quantization`` and ``context_cache``.
"""
