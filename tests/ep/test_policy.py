"""partition_policy=cost_aware: tiny NPU islands between CPU-only ops stay on the CPU, big matmuls stay on the NPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.capability import analyze
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.compiler import compile_partition
from npu_ep.ep.partition import boundary
from npu_ep.ep.policy import BRIDGE_ENV, DEFAULT_BRIDGE_US, bridge_cost_us, cost_aware_policy, crossings, estimate
from npu_ep.kernels.target import Target
from tests.npu_testing import assignment, cpu_run, make_model, npu_partitions, npu_session

F32 = TensorProto.FLOAT
ISLANDS = 12
TARGET_DIR = Path(__file__).resolve().parents[2] / "kernels" / "targets"


def target_without(folder, ops: tuple[str, ...] = ("Erf",), name: str = "npu-ref-no-erf") -> str:
    """Path of a copy of npu-ref's TOML without ``ops`` in [ops]: those nodes are forced onto the CPU."""
    lines = (TARGET_DIR / "npu-ref.toml").read_text().splitlines()
    keep = [ln for ln in lines if not any(ln.startswith(f'"{op}" =') for op in ops)]
    keep = [f'name = "{name}"' if ln.startswith("name =") else ln for ln in keep]
    path = Path(folder) / f"{name}.toml"
    path.write_text("\n".join(keep) + "\n")
    return str(path)


def islands_model(islands: int = ISLANDS, rows: int = 64, d: int = 256) -> onnx.ModelProto:
    """x -> MatMul (big, worth the NPU) -> [Erf (CPU-only) -> Add (tiny NPU island)] * islands -> Erf -> y."""
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((d, d)) / 16).astype(np.float32), "c": np.full((1,), 0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="big_mm")]
    cur = "h0"
    for i in range(islands):
        nodes += [helper.make_node("Erf", [cur], [f"e{i}"], name=f"erf{i}"),
                  helper.make_node("Add", [f"e{i}", "c"], [f"a{i}"], name=f"add{i}")]
        cur = f"a{i}"
    nodes.append(helper.make_node("Erf", [cur], ["y"], name="erf_out"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [rows, d])],
                      [helper.make_tensor_value_info("y", F32, [rows, d])], inits)


def test_bridge_cost_default_and_env_override(monkeypatch):
    monkeypatch.delenv(BRIDGE_ENV, raising=False)
    assert bridge_cost_us() == DEFAULT_BRIDGE_US
    monkeypatch.setenv(BRIDGE_ENV, "3.5")
    assert bridge_cost_us() == 3.5
    monkeypatch.setenv(BRIDGE_ENV, "fast")
    with pytest.raises(ValueError, match=BRIDGE_ENV):
        bridge_cost_us()


def test_policy_declines_islands_with_reason_and_keeps_big_matmul(tmp_path):
    nodes = nodes_from_model(islands_model())
    target = Target.load(target_without(tmp_path))
    greedy = analyze(nodes, target)
    aware = analyze(nodes, target, policy=cost_aware_policy(target, bridge_us=10.0))
    assert len(greedy.partitions) == ISLANDS + 1
    assert [[nodes[i].name for i in p] for p in aware.partitions] == [["big_mm"]]
    declined = {d.node.name: d.reason for d in aware.declined}
    for i in range(ISLANDS):
        assert "declined: boundary cost 20.0 us > gain" in declined[f"add{i}"]
    assert crossings(greedy.partitions[1], nodes) == 2


def test_zero_bridge_cost_keeps_everything_with_positive_gain(tmp_path):
    nodes = nodes_from_model(islands_model(islands=2))
    target = Target.load(target_without(tmp_path))
    aware = analyze(nodes, target, policy=cost_aware_policy(target, bridge_us=0.0))
    assert next([nodes[i].name for i in p] for p in aware.partitions) == ["big_mm"]


def conv_island_model() -> onnx.ModelProto:
    """x -> Erf (CPU-only) -> Conv 3x3, 64 -> 64 channels at 32x32 (75 M MACs) -> Erf -> y."""
    rng = np.random.default_rng(2)
    inits = {"w": (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)}
    nodes = [helper.make_node("Erf", ["x"], ["e"], name="erf_in"),
             helper.make_node("Conv", ["e", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Erf", ["c"], ["y"], name="erf_out")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 64, 32, 32])],
                      [helper.make_tensor_value_info("y", F32, [1, 64, 32, 32])], inits)


def test_policy_costs_partitions_with_the_compiled_programs_cost_model(tmp_path):
    """One cost model: the policy's NPU estimate is the compiled Program's cost on the declared shapes, so a Conv
    is matrix work (its MACs at the matrix rate), not element-wise work as a per-op table would cost it."""
    nodes = nodes_from_model(conv_island_model())
    target = Target.load(target_without(tmp_path))
    group = analyze(nodes, target).partitions[0]
    assert [nodes[i].name for i in group] == ["conv"]
    inputs, outputs = boundary(group, nodes)
    program = compile_partition("p", [nodes[i] for i in group], inputs, outputs, target)
    cost, skipped = program.static_cost()
    assert not skipped and cost.steps[0].unit == "matrix" and cost.steps[0].macs == 64 * 64 * 9 * 32 * 32
    est = estimate(group, nodes, target)
    assert est.npu_us == pytest.approx(cost.seconds * 1e6)
    assert est.cpu_us > est.npu_us  # 75 M MACs: worth two crossings at any plausible bridge cost
    aware = analyze(nodes, target, policy=cost_aware_policy(target, bridge_us=10.0))
    assert [[nodes[i].name for i in p] for p in aware.partitions] == [["conv"]]


def test_cost_aware_has_fewer_partitions_than_max_coverage_and_same_results(monkeypatch, tmp_path):
    monkeypatch.delenv(BRIDGE_ENV, raising=False)
    target = target_without(tmp_path)
    model = islands_model(rows=4)
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)}
    greedy = npu_session(model, {"partition_policy": "max_coverage", "target": target})
    aware = npu_session(model, {"partition_policy": "cost_aware", "target": target})
    assert len(npu_partitions(greedy)) == ISLANDS + 1
    assert npu_partitions(aware) == [["big_mm"]]
    ran = assignment(aware)
    assert ran["big_mm"] == "NpuEP" and all(ran[f"add{i}"] == "CPUExecutionProvider" for i in range(ISLANDS))
    want = cpu_run(model, feeds)[0]
    for sess in (greedy, aware):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    # fewer crossings is the point; their host latency is not asserted here (no timed tests)


def test_static_cost_survives_the_context_round_trip(tmp_path):
    """Declared shapes travel with the program parts, so a cached or reloaded program (If branches are stored this
    way) is costed exactly as the freshly compiled one."""
    from npu_ep.ep.program_io import program_from_parts, program_to_parts

    nodes = nodes_from_model(conv_island_model())
    target = Target.load(target_without(tmp_path))
    group = analyze(nodes, target).partitions[0]
    inputs, outputs = boundary(group, nodes)
    program = compile_partition("p", [nodes[i] for i in group], inputs, outputs, target)
    loaded = program_from_parts(*program_to_parts(program), target)
    (fresh, skipped_fresh), (again, skipped_again) = program.static_cost(), loaded.static_cost()
    assert not skipped_fresh and not skipped_again
    assert again.cycles == fresh.cycles and again.dma_bytes == fresh.dma_bytes


def small_model(shape) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, shape)],
                      [helper.make_tensor_value_info("y", F32, shape)])


@pytest.mark.parametrize("shape", [[1, 4], ["N", 4], ["batch", "seq", 768]])
def test_free_crossings_never_decline_small_or_symbolic_partitions(shape):
    """bridge_cost_us=0 sent these wholly to the CPU with "boundary cost 0.0 us > gain -0.3 us"."""
    target = Target.load("npu-ref")
    nodes = nodes_from_model(small_model(shape))
    greedy = analyze(nodes, target)
    aware = analyze(nodes, target, policy=cost_aware_policy(target, bridge_us=0.0))
    assert aware.partitions == greedy.partitions == [[0, 1]]
    assert not aware.declined


@pytest.mark.parametrize("shape", [[1, 4], ["N", 4]])
def test_a_tiny_partition_gains_its_cpu_node_dispatch(shape):
    """The CPU estimate counts ORT's per-node cost: two nodes costed at size 1 are not free on the CPU, so the gain
    is positive (it came out negative: the NPU's fixed DMA latencies against a CPU estimate of a few ns)."""
    target = Target.load("npu-ref")
    nodes = nodes_from_model(small_model(shape))
    est = estimate([0, 1], nodes, target)
    assert est.cpu_us > est.npu_us > 0


def test_zero_bridge_cost_keeps_a_symbolic_model_on_the_npu():
    model = small_model(["N", 4])
    sess = npu_session(model, {"partition_policy": "cost_aware", "bridge_cost_us": "0"})
    assert npu_partitions(sess) == [["relu", "add"]]
    x = np.array([[1, -2, 3, -4]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
