"""npu-report --run's boundaries (tools/report/boundaries.py): bytes that crossed the CPU<->NPU boundary against
bytes already resident in NPU memory, on NpuEP's host-memory device and on its NPU-memory device."""

from __future__ import annotations

import io

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, make_model
from rich.console import Console

import npu_ep
from npu_ep.kernels.cost import dma_cycles
from npu_ep.kernels.target import Target
from npu_ep.tools.report.build import validate
from npu_ep.tools.report.render import render

TENSOR = 4 * 16 * 4  # bytes of one [4, 16] float32 tensor


def _model():
    """Relu -> Einsum (not on npu-ref: the CPU EP) -> Neg: four crossings per run, one tensor each."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu1"),
             helper.make_node("Einsum", ["a"], ["b"], name="mid", equation="ij->ij"),
             helper.make_node("Neg", ["b"], ["y"], name="neg2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 16])],
                      [helper.make_tensor_value_info("y", F32, [4, 16])])


def test_host_memory_crossings_are_partition_io_read_in_place():
    doc = npu_ep.report(_model(), run=True, runs=3)
    validate(doc)
    b = doc["measurement"]["boundaries"]
    assert b["memory"] == "host"
    assert b["crossed_bytes"] == b["host_io_bytes"] == 4 * TENSOR
    assert b["resident_bytes"] == 0 and sum(b["copies"].values()) == 0 and b["allocator_peak_bytes"] == 0


def test_npu_memory_crossings_are_counted_copies_and_the_terminal_says_so():
    doc = npu_ep.report(_model(), run=True, runs=3, device_memory="npu")
    validate(doc)
    b = doc["measurement"]["boundaries"]
    assert b["memory"] == "npu"
    # the same four crossings: x copied to the NPU, relu1's output and y copied to the host, and the CPU node's
    # output read by neg2 where ORT 1.31 leaves it (host memory, no copy)
    assert b["copies"] == {"to_npu": 1, "to_host": 2, "on_npu": 0}
    assert b["copy_bytes"] == {"to_npu": TENSOR, "to_host": 2 * TENSOR, "on_npu": 0}
    assert b["host_io_bytes"] == TENSOR and b["crossed_bytes"] == 4 * TENSOR and b["resident_bytes"] == 0
    t = Target.load("npu-ref")
    assert b["dma_us"]["to_host"] == pytest.approx(dma_cycles(t, 2 * TENSOR, transfers=2) / t.clock_hz * 1e6)
    assert b["allocator_peak_bytes"] >= TENSOR and b["allocator_live_bytes"] == 0
    out = io.StringIO()
    render(doc, Console(file=out, width=400))
    assert "boundaries per run (partition inputs/outputs in NPU memory): 1,024 B crossed" in out.getvalue()
    assert "1 copies to the NPU, 256 B, and 2 to the host, 512 B" in out.getvalue()


def test_device_memory_must_be_host_or_npu():
    with pytest.raises(ValueError, match="device_memory='gpu'"):
        npu_ep.report(_model(), run=True, runs=1, device_memory="gpu")


def test_outputs_are_unchanged_by_the_device():
    from npu_ep.ep.device_memory import add_npu_ep
    import onnxruntime as ort

    model = _model()
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    results = []
    for memory in ("host", "npu"):
        so = ort.SessionOptions()
        add_npu_ep(so, {"cache_dir": "", "log_level": "error"}, memory=memory)
        results.append(ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0).run(None, {"x": x})[0])
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], -np.maximum(x, 0))
