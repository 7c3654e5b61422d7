"""``isa``: runs a test once per instruction-set path of the native kernels this host can take, capping their
dispatch for its duration (``_isa``)."""

from __future__ import annotations

import pytest
from _isa import cap_isa, host_isas


@pytest.fixture(params=host_isas())
def isa(request):
    yield from cap_isa(request.param)
