"""NPU memory as a device of its own (ep/native/device_memory.h): NpuEP's "npu" OrtEpDevice makes ORT allocate
partition inputs/outputs with NpuEP's allocator and copy through NpuEP's data transfer at CPU<->NPU boundaries; every
copy is counted (direction, bytes, emulated DMA time), and a partition counts the bytes it finds already in NPU
memory. The "host" device (what providers=["NpuEP"] selects) keeps everything in host memory, as before."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, session_options

import npu_ep
from npu_ep.ep import _native
from npu_ep.ep.device_memory import NPU_VENDOR_ID, add_npu_ep, device_counters, device_value, npu_ep_device
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels.cost import dma_cycles

RNG = np.random.default_rng(41)
SHAPE = [4, 16]
NBYTES = 4 * 16 * 4


def _model(middle_op: str = "Einsum"):
    """x -> Relu -> <middle_op> -> Relu -> y. Einsum is not in npu-ref's [ops]: it stays on the CPU EP, so the
    model crosses NPU -> CPU after the first Relu and CPU -> NPU before the second."""
    middle = (helper.make_node("Einsum", ["a"], ["b"], name="mid", equation="ij->ij") if middle_op == "Einsum"
              else helper.make_node(middle_op, ["a"], ["b"], name="mid"))
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu1"), middle,
             helper.make_node("Neg", ["b"], ["y"], name="neg2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, SHAPE)],
                      [helper.make_tensor_value_info("y", F32, SHAPE)])


def _session(model, memory: str) -> ort.InferenceSession:
    so = session_options()
    tag_session_options(so)
    add_npu_ep(so, {"cache_dir": "", "log_level": "error"}, memory=memory)
    return ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0)  # NpuEP's errors raise


def _partition_bytes(sess: ort.InferenceSession) -> dict[str, int]:
    """The session's partitions' input/output bytes per call kind, summed: all, and those found in NPU memory."""
    stats = _native.partition_stats()
    names = session_of(sess).programs
    keys = ("bytes_in", "bytes_out", "bytes_in_npu", "bytes_out_npu")
    return {k: sum(stats[n][k] for n in names if n in stats) for k in keys}


def _us(target, nbytes: int, copies: int) -> float:
    return dma_cycles(target, nbytes, transfers=copies) / target.clock_hz * 1e6


def test_npu_ep_offers_a_host_and_an_npu_memory_device():
    devices = [(d.ep_name, d.ep_metadata.get("npu_ep.memory")) for d in ort.get_ep_devices()
               if d.ep_name.startswith("NpuEP")]
    # one device per name: hosts that append every device of a name (onnxruntime-genai) get one memory
    assert devices == [("NpuEP", "host"), ("NpuEPNpuMemory", "npu")]
    info = npu_ep_device("npu").memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    assert (info.name, info.device_vendor_id, info.device_id) == ("NpuEP", NPU_VENDOR_ID, 0)
    assert info.device_mem_type == ort.OrtDeviceMemoryType.DEFAULT
    assert npu_ep_device("host").memory_info(ort.OrtDeviceMemoryType.DEFAULT) is None
    with pytest.raises(ValueError, match="expected 'npu' or 'host'"):
        npu_ep_device("gpu")


def test_copies_at_each_boundary_are_counted_with_bytes_direction_and_dma_time():
    model = _model()
    sess = _session(model, "npu")
    where = assignment(sess)
    assert where == {"relu1": "NpuEP", "mid": "CPUExecutionProvider", "neg2": "NpuEP"}, where
    ep = session_of(sess)
    assert ep.device_memory == "npu"
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    _native.reset_stats()
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, cpu_run(model, {"x": x})[0])  # Relu, copy, Neg: exact on both EPs
    c = device_counters(sess)
    # to the NPU: the graph input x (ORT copies a feed to the device its consumer reads); to the host: relu1's
    # output for the CPU node, and neg2's output y for the caller.
    assert (c["copies_to_npu"], c["bytes_to_npu"]) == (1, NBYTES)
    assert (c["copies_to_host"], c["bytes_to_host"]) == (2, 2 * NBYTES)
    assert c["copies_on_npu"] == c["bytes_on_npu"] == 0
    assert c["dma_us_to_npu"] == pytest.approx(_us(ep.target, NBYTES, 1))
    assert c["dma_us_to_host"] == pytest.approx(_us(ep.target, 2 * NBYTES, 2))
    # The session's allocator served both partitions' outputs and the device copy of x; all freed after the run.
    assert c["allocations"] == c["frees"] == 3 and c["live_bytes"] == 0 and c["peak_bytes"] >= NBYTES
    part = _partition_bytes(sess)
    assert (part["bytes_in"], part["bytes_out"]) == (2 * NBYTES, 2 * NBYTES)
    # ORT 1.31 plans a MemcpyFromHost for the CPU node's output but hands neg2 host memory (no copy reaches NpuEP's
    # data transfer): that input crossed without a copy, and the partition counts it as found in host memory.
    assert (part["bytes_in_npu"], part["bytes_out_npu"]) == (NBYTES, 2 * NBYTES)


def test_host_memory_device_makes_no_copies_and_finds_nothing_in_npu_memory():
    model = _model()
    sess = _session(model, "host")
    assert session_of(sess).device_memory == "host"
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    _native.reset_stats()
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, cpu_run(model, {"x": x})[0])
    c = device_counters(sess)
    assert c["allocations"] == c["copies_to_npu"] == c["copies_to_host"] == 0
    part = _partition_bytes(sess)
    assert part["bytes_in"] == 2 * NBYTES and part["bytes_in_npu"] == part["bytes_out_npu"] == 0


def test_live_bytes_rise_with_an_npu_value_and_fall_when_it_is_released():
    before = device_counters(None)
    value = device_value(_session(_model("Relu"), "npu"), [3, 1000], np.float32)
    during = device_counters(None)
    assert value.device_name() == "npu" and value.shape() == [3, 1000]
    assert during["live_bytes"] - before["live_bytes"] == 12000
    assert during["peak_bytes"] >= during["live_bytes"]
    del value
    after = device_counters(None)
    assert after["live_bytes"] == before["live_bytes"] and after["frees"] == before["frees"] + 1


def test_iobinding_with_npu_values_crosses_no_bytes_on_a_model_wholly_on_npu_ep():
    model = _model("Relu")  # Relu -> Relu -> Neg: one partition
    sess = _session(model, "npu")
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    x_npu, y_npu = device_value(sess, SHAPE), device_value(sess, SHAPE)
    ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(x)], [x_npu])  # the caller's one upload, before the runs
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", x_npu)
    binding.bind_ortvalue_output("y", y_npu)
    _native.reset_stats()
    session_before = device_counters(sess)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    c = device_counters(sess)
    for key in ("copies_to_npu", "copies_to_host", "copies_on_npu", "bytes_to_npu", "bytes_to_host"):
        assert c[key] == session_before[key], key
    part = _partition_bytes(sess)
    assert part["bytes_in"] == part["bytes_in_npu"] == 3 * NBYTES  # read where they live: nothing crossed
    assert part["bytes_out"] == part["bytes_out_npu"] == 3 * NBYTES
    np.testing.assert_array_equal(y_npu.numpy(), cpu_run(model, {"x": x})[0])  # numpy(): one copy to the host


def test_the_npu_memory_device_runs_the_ep_named_npu_ep_with_its_provider_options():
    """ORT keys the options of the NPU-memory device under its own ep_name (ep.npuepnpumemory.*): they must reach
    the EP as the host device's do, and the EP ORT records is still NpuEP."""
    so = session_options()
    tag_session_options(so)
    add_npu_ep(so, {"cache_dir": "", "target": "npu-edge", "log_level": "error"})
    sess = ort.InferenceSession(_model("Relu").SerializeToString(), so, enable_fallback=0)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    assert session_of(sess).target.name == "npu-edge"
    so = session_options()
    add_npu_ep(so, {"cache_dir": "", "no_such_option": "1"})
    with pytest.raises(Exception, match=r"unknown NpuEP provider option.*no_such_option"):
        ort.InferenceSession(_model("Relu").SerializeToString(), so, enable_fallback=0)


def test_copies_between_npu_values_stay_on_the_npu_and_are_counted_there():
    sess = _session(_model("Relu"), "npu")
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    a, b = device_value(sess, SHAPE), device_value(sess, SHAPE)
    ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(x)], [a])
    before = device_counters(None)  # device_value's memory is the environment's (see its docstring)
    ort.copy_tensors([a], [b])
    after = device_counters(None)
    assert (after["copies_on_npu"] - before["copies_on_npu"], after["bytes_on_npu"] - before["bytes_on_npu"]) \
        == (1, NBYTES)
    assert after["copies_to_host"] == before["copies_to_host"] and after["copies_to_npu"] == before["copies_to_npu"]
    np.testing.assert_array_equal(b.numpy(), x)


def test_ortvalue_route_with_device_type_npu_needs_npu_ep_vendor_id():
    """ORT's own route: OrtValue.ortvalue_from_shape_and_type(device_type="npu", vendor_id=NpuEP's) allocates from
    NpuEP's shared allocator; without the vendor id ORT finds no allocator for a generic NPU and says so."""
    before = device_counters(None)
    value = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, device_type="npu", device_id=0,
                                                      vendor_id=NPU_VENDOR_ID)
    assert value.device_name() == "npu"
    assert device_counters(None)["live_bytes"] - before["live_bytes"] == NBYTES
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(x)], [value])
    np.testing.assert_array_equal(value.numpy(), x)
    with pytest.raises(Exception, match="Cannot place the OrtValue on this device"):
        ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, device_type="npu", device_id=0)
