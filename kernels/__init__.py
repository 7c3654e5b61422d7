"""npu_ep.kernels: the emulated NPU, everything a compiled program runs on.

Target descriptions (``targets/*.toml``, ``target``), support rules (``support``), the tile planner (``planner``,
``tile_plan``), the cost model and silicon projection (``cost``, ``projection``), the compiler's fusion passes in the
order they run (``fusion/``), one module per op family (``ops/``) whose numpy kernels are the reference model, the
native C++ kernels beside them (``native/``, compiled into the same extension as ``ep/native``), and ``runtime``, the
one module that loads that extension.

May import: ``quantization``, ``context_cache``, ``log``, ``dtypes``, ``_version``, ``_atomic``. The layer above,
``ep``, only through ``runtime`` (the extension is built into ``ep/``) and ``subprograms.COMPILER`` (a name).
"""
