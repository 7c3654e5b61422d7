"""Real-NPU targets and the projected latency: target schema (ops_from, [projection]), the projection's arithmetic,
DRAM residency, weight widths, depthwise products on the vector unit, and the calibration fit's math."""

from __future__ import annotations

import csv
import dataclasses
import math

import numpy as np
import pytest

from npu_ep.kernels.cost import matrix_compute_cycles
from npu_ep.kernels.planner import plan_matmul
from npu_ep.kernels.projection import (FLOAT_WIDTH, QUANT_WIDTH, OpWork, Terms, Work, dram_bytes, op_work,
                                      partition_work, project_seconds, terms, timeline_work, weight_bytes)
from npu_ep.kernels.target import Target, TargetError, builtin_targets
from npu_ep.tools.bench import silicon

REAL = ("snapdragon-8gen3", "snapdragon-8elite", "snapdragon-xelite")


@pytest.mark.parametrize("name", REAL)
def test_real_npu_targets_load_with_npu_refs_ops_and_fitted_terms(name):
    t = Target.load(name)
    assert name in builtin_targets()
    assert set(t.ops) == set(Target.load("npu-ref").ops)  # ops_from = "npu-ref"
    assert t.float_mode("float32") == "float16"  # "float" models run in fp16 on the NPU
    c = dataclasses.astuple(terms(t))
    assert len(c) == 7 and all(math.isfinite(v) and v >= 0 for v in c)
    assert t.raw["projection"]["calibration"]["rows"] > 0


@pytest.mark.parametrize("name", REAL)
def test_fitted_efficiencies_are_fractions_of_the_peak(name):
    """Every fitted efficiency lies in (0, 1]: no unit beats its datasheet rate (the vector unit's once fitted to
    3.9 and 31, X Elite's DRAM to 1.39, when the projection counted Q/DQ and epilogue steps the device folds)."""
    p = Target.load(name).raw["projection"]
    effs = [*p["matrix_efficiency"].values(), p["vector_efficiency"], p["dram_efficiency"], p["int4_unpack_efficiency"]]
    assert all(0 < e <= 1 for e in effs), p


def _raw(**projection):
    raw = {"name": "t", "clock_mhz": 1000, "sram_bytes": 1 << 20,
           "matrix": {"tile_m": 32, "tile_n": 32, "tile_k": 32, "macs_per_cycle": {"float16": 1000, "int8": 2000},
                      "accumulator": {"float16": "float32", "int8": "int32"}, "float_compute": {"float32": "float16"}},
           "vector": {"lanes": 64}, "dma": {"bytes_per_cycle": 100.0, "latency_cycles": 100, "alignment_bytes": 64}}
    if projection:
        raw["projection"] = projection
    return raw


GOOD = dict(graph_overhead_us=100.0, op_overhead_us=2.0, matrix_efficiency={"float16": 0.5, "int8": 0.25},
            vector_efficiency=0.5, dram_efficiency=1.0, int4_unpack_efficiency=0.2)


def test_projection_section_is_validated_naming_the_field():
    Target.from_dict(_raw(**GOOD))
    with pytest.raises(TargetError, match="matrix_efficiency must give one value per mode"):
        Target.from_dict(_raw(**{**GOOD, "matrix_efficiency": {"float16": 0.5}}))
    with pytest.raises(TargetError, match=r"projection.dram_efficiency"):
        Target.from_dict(_raw(**{**GOOD, "dram_efficiency": 0}))
    with pytest.raises(TargetError, match=r"missing field 'projection.op_overhead_us'"):
        Target.from_dict(_raw(**{k: v for k, v in GOOD.items() if k != "op_overhead_us"}))
    with pytest.raises(TargetError, match="unknown field"):
        Target.from_dict(_raw(**{**GOOD, "fudge": 2.0}))
    with pytest.raises(TargetError, match="ops_from = 'nope' is not a built-in target"):
        Target.from_dict({**_raw(), "ops_from": "nope"})


def test_projection_is_overheads_plus_the_longer_of_compute_and_dram():
    t = terms(Target.from_dict(_raw(**GOOD)))
    np.testing.assert_allclose(dataclasses.astuple(t), (100e-6, 2e-6, 1 / 0.5, 1 / 0.25, 1 / 0.5, 1.0, 1 / 0.2))
    conv = OpWork(float_matrix_s=1e-3, vector_s=1e-4, dram_s=5e-4)
    gemv = OpWork(int_matrix_s=1e-5, dram_s=3e-4)
    cnn = Work.of([conv, conv, gemv])  # compute 2 * (2 + 0.2 + 0.002) + 0.04 + 3 * 0.002 ms > DRAM 1.3 ms
    compute = 3 * 2e-6 + 2 * (1e-3 / 0.5 + 1e-4 / 0.5) + 1e-5 / 0.25
    assert project_seconds(cnn, t) == pytest.approx(100e-6 + compute) and not t.dram_bound(cnn)
    decode = Work.of([gemv] * 4)  # DRAM 1.2 ms > compute 0.168 ms: bound by its weights
    assert project_seconds(decode, t) == pytest.approx(100e-6 + 4 * 3e-4) and t.dram_bound(decode)
    bare = terms(Target.from_dict(_raw()))  # no [projection]: no overheads, each unit at its peak
    assert project_seconds(cnn, bare) == pytest.approx(2 * 1.1e-3 + 1e-5)


def test_one_more_layer_is_the_larger_models_extra_ops_repeated():
    a, b, head = OpWork(1e-3), OpWork(2e-3), OpWork(5e-3)
    one, two = Work.of([head, a, b]), Work.of([head, a, b, a, b])
    deep = two.scaled_difference(one, 14)  # 16 layers
    assert dict(deep.ops) == {head: 1, a: 16, b: 16}
    with pytest.raises(ValueError, match="not repeats"):
        one.scaled_difference(two, 1)
    assert Work.from_json(deep.to_json()) == deep


def test_activations_cross_dram_only_beyond_on_chip_memory():
    t = Target.from_dict(_raw())  # 1 MiB on chip
    small = {"op": "MatMul", "cycles": 10.0, "compute_cycles": 8.0, "dma_cycles": 9.0, "dma_bytes": 300_000,
             "weight_bytes": 100_000, "unit": "matrix", "mode": "int8"}
    assert dram_bytes(small, t) == 100_000  # 200 kB of activations stay on chip
    big = {**small, "dma_bytes": 3_100_000}
    assert dram_bytes(big, t) == 100_000 + 3_000_000 - (1 << 20)  # what does not fit streams through DRAM
    assert dram_bytes(big, t, width=0.5) == 100_000 + 1_500_000 - (1 << 20)  # fp16 activations of an fp32 graph
    w = op_work(small, t)
    assert w.int_matrix_s == pytest.approx(8e-9) and w.float_matrix_s == 0
    assert w.dram_s == pytest.approx(100_000 / 100e9)
    assert op_work({**small, "cycles": 0.0}, t) is None  # a view does no work
    gather = {**small, "dma_bytes": 4096, "weight_bytes": 50_000_000}  # reads a few rows of a big table
    assert dram_bytes(gather, t) == 4096
    int4 = op_work({**small, "mode": "int4"}, t)  # 200 000 weights unpacked at 64 lanes x 4 per cycle, 1 GHz
    assert int4.int_matrix_s == pytest.approx(8e-9) and int4.unpack_s == pytest.approx(2 * 100_000 / (64 * 4 * 1e9))
    assert w.unpack_s == 0  # int8 weights reach the matrix unit as they are


def _op(op: str, unit: str = "vector", mode: str | None = None, cycles: float = 1000.0, **kw) -> dict:
    return {"op": op, "unit": unit, "mode": mode, "cycles": cycles, "compute_cycles": cycles,
            "dma_bytes": kw.pop("dma_bytes", 64_000), "weight_bytes": kw.pop("weight_bytes", 0), "macs": 0, **kw}


def test_vector_work_is_priced_at_the_width_the_device_computes_in():
    """fp32 lanes hold two fp16 elements (a float graph), four 8-bit ones (a quantized graph's element-wise work);
    softmax and normalisations compute in 32 bits on quantized data; a Div by a constant is a multiply."""
    t = Target.from_dict(_raw())  # 1 GHz: 1000 cycles = 1 us
    assert op_work(_op("Add"), t).vector_s == pytest.approx(1e-6 * FLOAT_WIDTH)
    assert op_work(_op("Add"), t, quantized=True).vector_s == pytest.approx(1e-6 * QUANT_WIDTH)
    assert op_work(_op("Softmax"), t, quantized=True).vector_s == pytest.approx(1e-6)
    divide = _op("Div", cycles=5000.0)  # 1 op + 1 transcendental (4 cycles here) per element vector
    assert op_work(divide, t).vector_s == pytest.approx(5e-6 * FLOAT_WIDTH)  # by a tensor: a real division
    assert op_work({**divide, "weight_bytes": 4}, t).vector_s == pytest.approx(1e-6 * FLOAT_WIDTH)  # by a constant


def test_qdq_folds_into_the_ops_around_it_and_is_counted_once():
    """A QDQ unit is one op on the device: DQ -> int8 product -> Q costs the product alone (no vector work, one
    per-op overhead); beside a product the emulator runs in fp16 (a 16-bit layer of a w8a8 graph) each Q/DQ is an
    8-bit conversion pass folded into that product, still one op."""
    t = Target.from_dict(_raw())
    dq, q = _op("DequantizeLinear", cycles=3000.0), _op("QuantizeLinear", cycles=2000.0)
    int8 = _op("QLinearMatMul", "matrix", "int8", 4000.0)
    assert partition_work([dq, int8, q], t) == [op_work(int8, t, quantized=True)]
    fp16 = _op("npu::MatMulEpilogue", "matrix", "float16", 4000.0)
    (unit,) = partition_work([dq, fp16, q], t)
    assert unit.float_matrix_s == pytest.approx(4e-6)
    assert unit.vector_s == pytest.approx((3e-6 + 2e-6) * QUANT_WIDTH)
    work = timeline_work([{"ops": [dq, int8, q]}, {"ops": [dq, fp16, q]}], t)
    assert work.count == 2
    g = Terms(op_s=1e-6)  # one overhead per unit, none for its Q/DQ
    assert project_seconds(work, g) == pytest.approx(2e-6 + 4e-6 + 4e-6 + 5e-6 * QUANT_WIDTH)


def test_epilogues_join_their_matrix_op_and_shape_arithmetic_folds():
    t = Target.from_dict(_raw())
    conv = _op("Conv", "matrix", "float16", 8000.0)
    add, relu, pool = _op("Add"), _op("Relu"), _op("MaxPool")
    shape_math = _op("Mul", cycles=1.0, dma_bytes=16)  # a Shape -> Gather -> Mul chain's scalars
    ops = partition_work([shape_math, conv, add, relu, pool], t)
    assert len(ops) == 2  # conv with its residual add and relu, then the pool
    assert ops[0].float_matrix_s == pytest.approx(8e-6) and ops[0].vector_s == pytest.approx(2e-6 * FLOAT_WIDTH)
    assert ops[1] == op_work(pool, t)
    assert partition_work([pool, add], t) == [op_work(pool, t), op_work(add, t)]  # no matrix op: no epilogue


def test_float32_weights_count_at_the_float_modes_width():
    consts = [np.zeros(100, np.float32), np.zeros(100, np.int8), np.zeros(10, np.int32)]
    assert weight_bytes(consts, Target.from_dict(_raw())) == 200 + 100 + 40  # fp16 matrix mode: halves
    assert weight_bytes(consts, Target.load("npu-ref")) == 400 + 100 + 40  # float32 mode: as stored


def test_depthwise_product_runs_on_the_vector_unit_when_the_matrix_unit_would_mostly_pad():
    t = Target.load("snapdragon-8gen3")
    # a 3x3 depthwise conv over 112x112, 32 channels: per group m = 12544, n = 1, k = 9
    p = plan_matmul(112 * 112, 1, 9, "float16", "float16", t, batch=32)
    hm, hn, hk = t.tile
    padded = 32 * math.ceil(p.m / hm) * hm * hn * hk / t.mac_rate("float16")
    on_vector = p.macs / (int(t.vector["lanes"]) * 2)
    assert on_vector < padded and matrix_compute_cycles(p, t) == pytest.approx(on_vector)
    # a dense product stays on the matrix unit
    q = plan_matmul(3136, 64, 576, "float16", "float16", t)
    assert matrix_compute_cycles(q, t) == pytest.approx(
        math.ceil(q.m / hm) * math.ceil(q.n / hn) * math.ceil(q.k / hk) * hm * hn * hk / t.mac_rate("float16"))


def test_fit_recovers_known_terms_from_compute_and_dram_bound_models():
    rng = np.random.default_rng(0)
    truth = Terms(2e-4, 3e-6, 2.0, 4.0, 1.0, 1.5, 3.0)  # the vector unit at its peak on this made-up device
    works = []
    for i in range(16):
        if i % 4:  # a CNN: compute-bound
            ops = [OpWork(*rng.uniform(1e-5, 2e-4, 3), dram_s=rng.uniform(0, 1e-6), unpack_s=rng.uniform(0, 1e-5))
                   for _ in range(int(rng.integers(5, 60)))]
        else:  # a decode step: its weights bound it
            ops = [OpWork(int_matrix_s=rng.uniform(0, 1e-7), dram_s=rng.uniform(1e-4, 1e-3)) for _ in range(8)]
        works.append(Work.of(ops))
    measured = [project_seconds(w, truth) for w in works]
    got = silicon.fit(works, measured)
    assert all(v >= 0 for v in dataclasses.astuple(got))
    np.testing.assert_allclose(dataclasses.astuple(got), dataclasses.astuple(truth), rtol=1e-6, atol=1e-12)
    # a device whose vector unit would beat its peak (work the projection over-counts): the fit stops at the peak
    faster = [project_seconds(w, dataclasses.replace(truth, vector=0.2)) for w in works]
    assert silicon.fit(works, faster).vector == pytest.approx(1.0)


def test_spearman_and_the_row_rule(tmp_path):
    assert silicon.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert silicon.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    cols = ["model", "precision", "device", "chipset", "soc", "runtime", "inference_time_ms", "primary_compute_unit",
            "layers_total", "layers_npu", "layers_cpu", "source_file"]
    rows = [("m", "float", "S24", "qualcomm-snapdragon-8gen3", "", "tflite", "1.0", "NPU", "9", "9", "0", ""),
            ("m", "float", "S24", "qualcomm-snapdragon-8gen3", "", "qnn_dlc", "2.0", "NPU", "9", "9", "0", ""),
            ("m", "float", "S24", "qualcomm-snapdragon-8gen3", "", "onnx", "9.0", "NPU", "9", "5", "4", ""),  # CPU part
            ("m", "w8a16", "S24", "qualcomm-snapdragon-8gen3", "", "qnn_dlc", "1.0", "NPU", "9", "9", "0", ""),
            ("m", "w8a8", "S24", "qualcomm-snapdragon-8gen3", "", "tflite", "0.5", "GPU", "9", "0", "0", ""),
            ("m", "w8a8", "CRD", "qualcomm-snapdragon-x-elite", "", "onnx", "0.7", "NPU", "9", "9", "0", "")]
    with open(tmp_path / "cnn_calibration.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
    assert silicon.measured_rows(tmp_path) == {("m", "float", "snapdragon-8gen3"): 1.5,
                                               ("m", "w8a8", "snapdragon-xelite"): 0.7}


def test_leave_one_model_out_needs_another_model_to_fit_on():
    a, b = Work.of([OpWork(float_matrix_s=1e-3)]), Work.of([OpWork(float_matrix_s=2e-3)])
    one = {("m", "float", "t"): a}
    assert silicon.leave_one_model_out(one, {("m", "float", "t"): 1.5}, ["t"]) == []  # no model left to fit on
    two = {**one, ("n", "float", "t"): b}
    rows = silicon.leave_one_model_out(two, {("m", "float", "t"): 1.5, ("n", "float", "t"): 3.0}, ["t"])
    assert [r["model"] for r in rows] == ["m", "n"] and all(math.isfinite(r["error"]) for r in rows)
