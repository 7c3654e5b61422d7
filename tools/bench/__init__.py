"""Benchmarks (``python -m npu_ep.tools.bench.<name>``): each prints NpuEP against the CPU EP measured in the same
run; ``soak`` runs the long reliability loops; ``peak_rss`` measures a process's memory high-water mark.

May import: every npu_ep package below ``tools``, and ``tools.report`` and ``tools.generation``.
"""
