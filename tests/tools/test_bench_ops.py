"""bench.ops, the op-by-op speed table: its cases are generated from the target's op list (every (op, dtype) is a
row, built or saying why not), the models are valid and run on ORT's CPU EP, a small run proves NpuEP ran each case
and names its Python steps, and ``--check`` applies the targets. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npu_ep.kernels.registry import KernelDef
from npu_ep.kernels.target import Target
from npu_ep.tools.bench import op_cases, ops
from npu_ep.tools.bench.op_cases import EXTRA_GROUP_DTYPES, build_case, cases, target_rows
from npu_ep.tools.bench.ops import Row, Timing, check, main, measure, step_reason
from tests.npu_testing import assignment

import npu_ep

TARGET = Target.load("npu-ref")


def _target_pairs(target: Target) -> set[tuple[str, str]]:
    return {(f"{d}::{o}" if d else o, dt) for (d, o), rule in target.ops.items() for dt in (rule.dtypes or ["-"])}


def test_case_list_is_every_op_and_dtype_of_the_target_plus_the_extra_groups():
    rows = target_rows(TARGET)
    extras = {(k, dt) for k, dts in EXTRA_GROUP_DTYPES.items() for dt in dts}
    assert set(rows) == _target_pairs(TARGET) | extras
    assert len(rows) == len(set(rows))
    small = [make() for make in cases(TARGET, ("small",))]
    assert {(c.op, c.dtype) for c in small} == set(rows)  # built or a gap: never missing
    assert all((c.model is None) == bool(c.gap) for c in small)


def test_an_op_without_a_builder_is_a_row_saying_so_and_a_new_onnx_op_builds_by_itself():
    target = Target.from_dict({**TARGET.raw, "ops": {**TARGET.raw["ops"], "com.microsoft::NotAnOp": {
        "dtypes": ["float32"]}, "npu::NotAGroup": {"dtypes": ["float32"]}, "Asin": {"dtypes": ["float32"]}}})
    built = {(c.op, c.dtype): c for c in (make() for make in cases(target, ("small",)))}
    assert built[("com.microsoft::NotAnOp", "float32")].gap.startswith("no builder")
    assert built[("npu::NotAGroup", "float32")].gap.startswith("no builder")
    asin = built[("Asin", "float32")]  # from its ONNX schema alone
    assert not asin.gap and [n.op_type for n in asin.model.graph.node] == ["Asin"]
    assert set(_target_pairs(target)) <= set(built)


def test_a_schema_model_the_checker_rejects_is_a_no_builder_row(monkeypatch):
    monkeypatch.delitem(op_cases.SPECS, "RNN")  # W and R are weights: the data's shape does not fit them
    case = build_case("RNN", "float32", "small")
    assert case.model is None and case.gap.startswith("no builder: the model from RNN's schema alone is invalid")


def test_generated_models_are_valid_and_run_on_the_cpu_ep():
    checked = 0
    for make in cases(TARGET, ("small",)):
        case = make()
        if case.gap:
            continue
        if case.checkable:
            onnx.checker.check_model(case.model, full_check=True)
            checked += 1
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, case.feeds)
        assert len(outs) == len(case.model.graph.output), case.key
    assert checked > 250  # most ops have an ONNX schema, so the checker saw most models


def test_medium_models_pass_the_checker_with_shape_inference():
    """The shapes of each size fit the op (a rank-2 Gemm on a rank-3 sequence fails ONNX's shape inference)."""
    for make in cases(TARGET, ("medium",)):
        case = make()
        assert not case.gap.startswith("builder failed"), case.gap
        if case.model is not None and case.checkable:
            onnx.checker.check_model(case.model, full_check=True)


def test_the_three_sizes_grow():
    sizes = [build_case("Erf", "float32", s).feeds["in0"].size for s in op_cases.SIZES]
    assert sizes == sorted(sizes) and sizes[0] == 64 and sizes[-1] == 1500 * 1536


def test_a_small_run_over_three_ops_gives_ratios_where_it_ran_and_its_python_steps():
    timing = Timing(rounds=2, block_s=0.001, max_calls=2, settle_s=0.0, small_calls=4)
    rows = ops.run_table(TARGET, ["small"], {"Erf", "MatMul", "Where"}, timing)
    assert {(r.op, r.dtype) for r in rows} == {(k, dt) for k, dt in target_rows(TARGET)
                                               if k in ("Erf", "MatMul", "Where")}
    for r in rows:
        assert r.status == "ok" and r.nodes == "1/1", (r.op, r.dtype, r.status, r.note)
        assert r.ratio is not None and r.ratio > 0 and r.calls == 4
        assert isinstance(r.python_steps, list) and all(s["reason"] for s in r.python_steps)
        assert r.steps == [r.op]  # the program's one step
        for s in r.python_steps:
            assert s["op"] == r.op and s["node"]
    assert "python_steps" in rows[0].to_json() and "ratio" in rows[0].to_json()


def test_measure_reads_the_placement_from_ort_and_a_python_step_from_the_program():
    case = build_case("Where", "bool", "small")
    sess = ops.npu_session(case)
    sess.run(None, case.feeds)
    sess.run(None, case.feeds)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    assert ops.placement(sess)[:2] == (1, 1)
    steps = ops.python_steps(sess)
    (program,) = ops._ep_session(sess).programs.values()  # the program the row reads
    natives = next(iter(program._bindings.values()), [None] * len(program.steps))
    assert [s["op"] for s in steps] == [st.op for st, n in zip(program.steps, natives) if n is None]


def test_a_group_row_says_when_the_group_did_not_form(monkeypatch):
    timing = Timing(rounds=2, block_s=0.001, max_calls=2, settle_s=0.0, small_calls=4)
    formed = measure(build_case("npu::MatMulEpilogue", "float32", "small"), timing)
    assert formed.steps == ["npu::MatMulEpilogue"] and not formed.note
    # the same MatMul -> Add -> Relu with the fusion pass off (ORT made MatMul + Add a Gemm): the row says so
    from npu_ep.kernels import fusion

    monkeypatch.setattr(fusion, "PASSES", tuple(p for p in fusion.PASSES if p.name != "epilogue"))
    unfused = measure(build_case("npu::MatMulEpilogue", "float32", "small"), timing)
    assert unfused.steps == ["Gemm", "Relu"]
    assert unfused.note == "not fused: compiled as Gemm + Relu"
    assert "[not fused: compiled as Gemm + Relu]" in ops.format_row(unfused)


def test_fused_knows_each_kind_of_group_row():
    assert ops.fused("npu::NormMatMul", ["npu::NormMatMul"]) and not ops.fused("npu::NormMatMul", ["Gemm"])
    assert ops.fused("group::Conv+Relu", ["Conv"]) and not ops.fused("group::Conv+Relu", ["Conv", "Relu"])
    assert ops.fused("Erf", ["Erf"])


def test_step_reason_names_why_a_step_stayed_python():
    def kdef(bind):
        return KernelDef("", "Foo", lambda *a: None, lambda *a: None, lambda *a: None, bind=bind)
    assert step_reason("Scan", kdef(None)).startswith("never bound")
    assert step_reason("Foo", kdef(None)).startswith("no native binding")
    assert step_reason("Foo", kdef(lambda *a: None)).startswith("binding refused")
    assert step_reason("Reshape", kdef(None)).startswith("binding refused")  # views bind without a kernel bind


def test_a_declined_case_is_a_row_with_the_reason():
    case = build_case("Relu", "float32", "small")  # made float64: outside the target's dtypes, NpuEP declines it
    case.model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    case.model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    case.feeds = {"in0": np.linspace(-2, 2, 64).reshape(1, 64)}
    row = measure(case, Timing(rounds=2, block_s=0.001, max_calls=2, settle_s=0.0, small_calls=4))
    assert (row.status, row.nodes, row.python_steps) == ("declined", "0/1", [])
    assert row.note.startswith("declined: ") and "float64" in row.note and "Relu" in row.note
    assert check([row]) == []  # counted in the summary, not timed
    assert ops.summary([row])["declined"] == 1


def _row(size: str, npu: float, cpu: float, **kw) -> Row:
    return Row("Op", "float32", size, kw.pop("status", "ok"), npu_us=npu, cpu_us=cpu, nodes="1/1", **kw)


def test_check_applies_the_targets_to_synthetic_rows():
    ok = [_row("small", 12.0, 10.0), _row("medium", 140.0, 100.0), _row("large", 50.0, 100.0),
          _row("large", 80.0, 100.0), Row("If", "bool", "small", "gap", "control flow")] + [_row("large", 50, 100)] * 3
    assert check(ok) == []
    assert check(ok + [_row("small", 14.0, 10.0)]) == ["Op float32 small: +4.0 us > +3 us"]
    assert check(ok + [_row("medium", 160.0, 100.0)]) == ["Op float32 medium: 1.60x > 1.5x"]
    slow_median = [_row("medium", 120.0, 100.0)] * 3
    assert check(slow_median) == ["median ratio 1.20x > 1x"]
    nameless = _row("large", 50.0, 100.0, python_steps=[{"op": "Erf", "node": "Erf_0", "reason": ""}])
    assert check([nameless]) == ["Op float32 large: Python step Erf (Erf_0) without a reason"]
    failed = Row("Erf", "float32", "small", "error", "RuntimeError: no kernel")
    assert check(ok + [failed]) == ["Erf float32 small: RuntimeError: no kernel"]


def test_cli_writes_json_and_check_exits_1_above_target(tmp_path, monkeypatch, capsys):
    rows = [_row("medium", 200.0, 100.0), _row("small", 5.0, 10.0)]

    def fake_table(target, sizes, ops_, timing, on_row):
        assert sizes == ["small", "medium"] and ops_ == {"Erf", "Conv"}
        for r in rows:
            on_row(r)
        return rows

    monkeypatch.setattr(ops, "run_table", fake_table)
    out = tmp_path / "t.json"
    assert main(["--ops", "Erf,Conv", "--sizes", "small,medium", "--json", str(out), "--check"]) == 1
    doc = json.loads(out.read_text())
    assert [r["ratio"] for r in doc["rows"]] == [2.0, 0.5] and doc["summary"]["above_target"] == 1
    assert "above target: Op float32 medium: 2.00x > 1.5x" in capsys.readouterr().out
    rows[0] = _row("medium", 100.0, 100.0)
    assert main(["--ops", "Erf,Conv", "--sizes", "small,medium", "--check"]) == 0
    with pytest.raises(SystemExit):
        main(["--sizes", "tiny"])


def test_interleaved_calls_take_turns_call_by_call():
    from npu_ep.tools.bench.timing import interleaved_calls, medians

    order = []
    blocks = interleaved_calls({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 3
    assert [len(b) for b in blocks["a"]] == [3] and set(medians(blocks)) == {"a", "b"}


def test_a_row_timed_in_rounds_takes_the_median_rounds_ratio():
    row = _row("large", 300.0, 100.0, round_ratios=[1.1, 9.0, 1.2])  # one block landed in a slow phase
    assert row.ratio == 1.2 and not ops.above_target(row)
    assert _row("large", 300.0, 100.0).ratio == 3.0  # no rounds (a small row): the ratio of the median calls
    assert row.to_json()["round_ratios"] == [1.1, 9.0, 1.2]
