"""The native kernels' instruction-set paths this host can take (scalar, AVX2, AVX-512, AVX-512 VNNI, AMX int8,
lowest first), and capping the kernels' dispatch at one of them: shared by the native-kernel tests
(``conftest.isa``)."""

from __future__ import annotations

try:
    from npu_ep.ep import _native
except ImportError:  # extension not built: the native tests skip themselves
    _native = None

ISA_ORDER = ["scalar", "avx2", "avx512", "avx512_vnni", "amx_int8"]


def host_isas(top: str | None = None) -> list[str]:
    """The dispatch levels this host runs, lowest first, up to ``top`` (a kernel without a higher path of its own)."""
    if _native is None:
        return []
    last = ISA_ORDER.index(_native.kernels.isa())
    if top is not None:
        last = min(last, ISA_ORDER.index(top))
    return ISA_ORDER[: last + 1]


def cap_isa(name: str):
    """Cap the dispatch at ``name`` until the returned generator resumes (fixture body)."""
    _native.kernels.set_isa_cap(ISA_ORDER.index(name))
    assert _native.kernels.isa() == name
    try:
        yield name
    finally:
        _native.kernels.set_isa_cap(-1)
