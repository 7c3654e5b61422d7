"""npu_ep.ep: the execution provider itself, ORT's side of NpuEP.

The C++ shim (``native/``: factory, EP, graph view, partition kernel, the program's step loop, built with the native
kernels into the extension ``ep/_native*.so``) implements ORT's plugin-EP ABI and calls the Python core:
``entry_points`` (the plugin's Python side: one ``EpSession`` per ORT session), ``options``, ``capability`` (which nodes
the target runs, a reason for every other), ``partition`` and ``policy`` (islands to claim), ``compiler`` (a partition
into a ``program.Program`` of kernel steps, ``step_binding`` for its native steps), compiled contexts
(``compiled_programs`` joins ``compile_cache`` and ``epcontext``; ``compiler_version`` is the one place to bump when
programs change), ``registration`` (the provider name, the libraries' paths, registering with ORT), NPU memory as a
device (``device_memory``) and the stateful KV option (``kv_state``).

May import: ``kernels``, ``context_cache``, ``quantization``, ``log``, ``dtypes``, ``_version``, ``_atomic``.
Never ``rewriter``, ``tools`` or ``models`` (above it, or generators for tests and demos).
"""
