"""NpuEP's logger: warnings reach stderr by default (declined nodes must be visible without configuration)."""

from __future__ import annotations

import logging

logger = logging.getLogger("npu_ep")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("NpuEP %(levelname)s: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
