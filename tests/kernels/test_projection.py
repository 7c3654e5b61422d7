"""Real-NPU targets and the projected latency: target schema (ops_from, [projection]), the projection's arithmetic,
DRAM residency, weight widths, depthwise products on the vector unit, and the calibration fit's math."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from npu_ep.kernels.cost import matrix_compute_cycles
from npu_ep.kernels.planner import plan_matmul
from npu_ep.kernels.projection import Work, coefficients, dram_bytes, op_work, project_seconds, weight_bytes
from npu_ep.kernels.target import Target, TargetError, builtin_targets
from npu_ep.tools.bench import silicon

def _raw(**projection):
    raw = {"name": "t", "clock_mhz": 1000, "sram_bytes": 1 << 20,
           "matrix": {"tile_m": 32, "tile_n": 32, "tile_k": 32, "macs_per_cycle": {"float16": 1000, "int8": 2000},
                      "accumulator": {"float16": "float32", "int8": "int32"}, "float_compute": {"float32": "float16"}},
           "vector": {"lanes": 64}, "dma": {"bytes_per_cycle": 100.0, "latency_cycles": 100, "alignment_bytes": 64}}
    if projection:
        raw["projection"] = projection
    return raw


GOOD = dict(graph_overhead_us=100.0, op_overhead_us=2.0, matrix_efficiency={"float16": 0.5, "int8": 0.25},
            vector_efficiency=0.5, dram_efficiency=1.0)


def test_projection_section_is_validated_naming_the_field():
    Target.from_dict(_raw(**GOOD))
    with pytest.raises(TargetError, match="matrix_efficiency must give one value per mode"):
        Target.from_dict(_raw(**{**GOOD, "matrix_efficiency": {"float16": 0.5}}))
    with pytest.raises(TargetError, match="projection.dram_efficiency"):
        Target.from_dict(_raw(**{**GOOD, "dram_efficiency": 0}))
    with pytest.raises(TargetError, match="missing field 'projection.op_overhead_us'"):
        Target.from_dict(_raw(**{k: v for k, v in GOOD.items() if k != "op_overhead_us"}))
    with pytest.raises(TargetError, match="unknown field"):
        Target.from_dict(_raw(**{**GOOD, "fudge": 2.0}))
    with pytest.raises(TargetError, match="ops_from = 'nope' is not a built-in target"):
        Target.from_dict({**_raw(), "ops_from": "nope"})


def test_projection_is_overheads_plus_work_over_efficiencies():
    t = Target.from_dict(_raw(**GOOD))
    w = Work(ops=10, float_matrix_s=1e-3, int_matrix_s=2e-3, vector_s=1e-4, dram_s=5e-4)
    expected = 100e-6 + 10 * 2e-6 + 1e-3 / 0.5 + 2e-3 / 0.25 + 1e-4 / 0.5 + 5e-4 / 1.0
    assert project_seconds(w, t) == pytest.approx(expected)
    bare = Target.from_dict(_raw())  # no [projection]: the bare work
    assert project_seconds(w, bare) == pytest.approx(1e-3 + 2e-3 + 1e-4 + 5e-4)


def test_activations_cross_dram_only_when_they_exceed_on_chip_memory():
    t = Target.from_dict(_raw())  # 1 MiB on chip
    small = {"cycles": 10.0, "compute_cycles": 8.0, "dma_cycles": 9.0, "dma_bytes": 300_000, "weight_bytes": 100_000,
             "unit": "matrix", "mode": "int8"}
    assert dram_bytes(small, t) == 100_000  # 200 kB of activations stay on chip
    big = {**small, "dma_bytes": 3_000_000}
    assert dram_bytes(big, t) == 3_000_000  # 2.9 MB cannot: all of the plan's traffic is DRAM traffic
    w = op_work(small, t)
    assert w.int_matrix_s == pytest.approx(8e-9) and w.float_matrix_s == 0 and w.ops == 1
    assert w.dram_s == pytest.approx(100_000 / 100e9)
    assert op_work({**small, "cycles": 0.0}, t) == Work()  # a view does no work
    assert op_work({**small, "unit": "vector"}, t).vector_s == pytest.approx(8e-9)


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


def test_fit_recovers_known_terms_and_never_goes_negative():
    rng = np.random.default_rng(0)
    truth = np.array([2e-4, 3e-6, 2.0, 4.0, 0.0, 1.5])  # vector work costs nothing in this made-up device
    works = [Work(int(rng.integers(20, 400)), *rng.uniform(1e-5, 2e-3, 4)) for _ in range(12)]
    measured = [float(np.dot(truth, w.features())) for w in works]
    c = silicon.fit(works, measured)
    assert all(v >= 0 for v in c)
    np.testing.assert_allclose(c, truth, rtol=1e-6, atol=1e-12)


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
