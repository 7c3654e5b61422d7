"""``npu-report`` and ``npu_ep.report(...)``: building the report (``build``), running it on NpuEP (``run``,
``profile``, ``phases``, ``compare``), rendering it (``render``, ``html``), partition dumps and the model zoo.

May import: every npu_ep package below ``tools``, and ``tools.bench`` (timing helpers) and ``tools.generation``.
"""
