"""npu_ep.tools: what users run, the top layer.

The CLIs ``npu-rewrite``, ``npu-report``, ``npu-cache`` and ``npu-generate`` and the demo (thin modules here),
``report/`` (building, running and rendering the report; partition dumps; the model zoo), ``bench/`` (benchmarks
against the CPU EP, soak, peak RSS) and ``generation/`` (greedy generation with a fixed KV cache).

May import: every other npu_ep package. Only the package's ``__init__`` imports it (``npu_ep.report``).
"""
