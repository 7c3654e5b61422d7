"""Target descriptions: schema validation with clear errors, and the two built-in targets differ where it matters."""

from __future__ import annotations

import copy

import pytest

from npu_ep.kernels.target import Target, TargetError, builtin_targets


def _raw(name="npu-ref"):
    return copy.deepcopy(dict(Target.load(name).raw))


def test_builtin_targets_load_and_differ():
    assert {"npu-ref", "npu-edge"} <= set(builtin_targets())
    ref, edge = Target.load("npu-ref"), Target.load("npu-edge")
    assert ref.float_mode("float32") == "float32" and ref.float_mode("float16") == "float16"
    assert edge.float_mode("float32") is None and not edge.has_mode("int4")
    assert edge.sram_bytes == 256 * 1024 and ref.sram_bytes == 2 * 1024 * 1024
    assert edge.static_shapes and not ref.static_shapes
    assert ref.mac_rate("float32") < ref.mac_rate("float16") < ref.mac_rate("int8") < ref.mac_rate("int4")
    assert ref.digest != edge.digest


@pytest.mark.parametrize("mutate,message", [
    (lambda r: r.pop("sram_bytes"), "missing field 'sram_bytes'"),
    (lambda r: r.__setitem__("clock_mhz", -1), "clock_mhz: expected a positive float"),
    (lambda r: r["matrix"].__setitem__("tile_k", 0), "matrix.tile_k: expected a positive int"),
    (lambda r: r["matrix"]["macs_per_cycle"].__setitem__("bf17", 3), "unknown mode 'bf17'"),
    (lambda r: r["matrix"]["accumulator"].pop("int8"), "accumulator has no entry for mode 'int8'"),
    (lambda r: r["matrix"].__setitem__("float_compute", {"float32": "int2"}), "float_compute.float32"),
    (lambda r: r["dma"].__setitem__("alignment_bytes", 48), "alignment_bytes must be a power of two"),
    (lambda r: r["fusion"].__setitem__("epilogues", ["gelu"]), "unknown epilogue 'gelu'"),
    (lambda r: r["ops"].__setitem__("MatMul", {"dtypes": ["float99"]}), "ops.MatMul: unknown dtype"),
    (lambda r: r["ops"].__setitem__("MatMul", {"maxrank": 2}), "ops.MatMul: unknown field"),
])
def test_invalid_descriptions_name_the_field(mutate, message):
    raw = _raw()
    mutate(raw)
    with pytest.raises(TargetError, match=message.replace("(", r"\(")):
        Target.from_dict(raw)


def test_unknown_builtin_lists_the_known_ones():
    with pytest.raises(TargetError, match=r"built-in targets: .*npu-edge"):
        Target.load("npu-nope")


def test_align_rounds_up_to_dma_alignment():
    t = Target.load("npu-ref")
    assert t.align(1) == 64 and t.align(64) == 64 and t.align(65) == 128
