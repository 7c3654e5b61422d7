"""``npu-report`` and ``npu_ep.report(...)``: building the report (``build``), running it on NpuEP (``run``,
``profile``, ``phases``, ``compare``), rendering it (``render``, ``html``), partition dumps and the model zoo."""
