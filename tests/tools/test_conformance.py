"""python -m npu_ep.tools.conformance: ONNX's backend suite on NpuEP, each case classed against the CPU EP and the
test's expected outputs, in a worker pool that survives hanging and dying cases."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx
import pytest

from npu_ep.tools import conformance
from npu_ep.tools.conformance_cases import EXTRA_SUITES, SUITES, Case, load_cases, with_constant_inputs
from npu_ep.tools.conformance_run import classify

# one case per class that real onnx cases reach on NpuEP today
REPRESENTATIVE = {
    "node/test_add": "right",                                  # claimed (1 of 1 node on NpuEP), ONNX's outputs
    "simple/test_expand_shape_model1": "right",                # a data-folder suite, read from its .pb files
    "pytorch-converted/test_Conv2d": "right",
    "node/test_strnormalizer_nostopwords_nochangecase": "not_claimed",  # strings: declined, the CPU EP runs it
    "node/test_adagrad": "cpu_cannot_load",                   # a training op the CPU EP does not register
    "node/test_reduce_max_empty_set_bool": "both_fail",       # ORT's ReduceMax refuses an empty bool set
    "node/test_castlike_INT4_to_FLOAT": "not_claimed",        # packed int4 in through an OrtValue
    "real-light/test_squeezenet": "right",                    # a whole light convnet with onnx's dummy input
}


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    names = "|".join(k.split("/", 1)[1] for k in REPRESENTATIVE)
    loaded = load_cases(("node", "simple", "pytorch-converted", "real-light"), f"/({names})$")
    return {c.key: c for c in loaded}


def test_representative_cases_are_classed(cases):
    outcomes = {o.key: o for o in conformance.run_pool([cases[k] for k in REPRESENTATIVE], jobs=2)}
    assert {k: o.kind for k, o in outcomes.items()} == REPRESENTATIVE, {k: o.message for k, o in outcomes.items()}
    squeezenet = outcomes["real-light/test_squeezenet"]
    assert squeezenet.npu_nodes == squeezenet.nodes > 20, squeezenet  # every node of the network on NpuEP
    add = outcomes["node/test_add"]
    assert (add.npu_nodes, add.nodes, add.cpu_matches_expected) == (1, 1, True)  # ORT's own record says NpuEP ran
    assert outcomes["node/test_strnormalizer_nostopwords_nochangecase"].npu_nodes == 0
    assert "Adagrad" in outcomes["node/test_adagrad"].message
    assert "CPU EP:" in outcomes["node/test_reduce_max_empty_set_bool"].message  # both sessions' errors
    assert outcomes["node/test_castlike_INT4_to_FLOAT"].cpu_matches_expected  # the int4 values arrived as ONNX's


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2", "uint2", "float4_e2m1fn", "bfloat16", "float8_e5m2"])
def test_ml_dtypes_values_round_trip_through_ort_values(dtype):
    """Values numpy's bridge cannot carry go in and out of ORT as OrtValues of their ONNX type (sub-byte ones packed
    as ONNX packs them); an odd count leaves a padded last byte."""
    import ml_dtypes

    from npu_ep.tools.conformance_io import _from_ort_value, _ort_value

    info = ml_dtypes.finfo if "float" in dtype else ml_dtypes.iinfo
    limits = info(getattr(ml_dtypes, dtype))
    values = np.linspace(float(limits.min), float(limits.max), 7).reshape(7, 1).astype(getattr(ml_dtypes, dtype))
    back = _from_ort_value(_ort_value(values))
    assert back.dtype == values.dtype and back.shape == (7, 1)
    np.testing.assert_array_equal(back.view(np.uint8), values.view(np.uint8))


def test_a_claimed_case_is_wrong_only_if_it_matches_neither_the_expected_nor_the_cpu_outputs(cases):
    """NpuEP's real Add against doctored references (ONNX's outputs plus one as expected, plus two as the CPU EP's):
    wrong, with both comparisons in the message; with the CPU EP's true outputs it is right (NpuEP follows ORT
    where ORT differs from ONNX), and the disagreement is recorded."""
    add = cases["node/test_add"]
    inputs, outputs = add.data_sets[0]
    doctored = dataclasses.replace(add, data_sets=[(inputs, [o + 1 for o in outputs])])
    wrong = classify(doctored, [[o + 2 for o in outputs]], "")
    assert wrong.kind == "wrong" and wrong.npu_nodes == 1 and wrong.cpu_matches_expected is False
    assert "vs expected: output 0: " in wrong.message and "| vs CPU EP: output 0: " in wrong.message, wrong.message
    right = classify(doctored, [outputs], "")
    assert right.kind == "right" and right.cpu_matches_expected is False


def test_constant_inputs_variant_gives_npuep_the_inputs_as_initializers(cases):
    """--constant-inputs: the fed values become initializers and ORT's folding is off, so NpuEP itself runs the
    node on constants (with ORT's folding the CPU EP would have computed the whole graph at load)."""
    const = with_constant_inputs(cases["node/test_add"])
    model = onnx.load_from_string(const.model)
    assert const.key == "node/test_add[const]" and not model.graph.input and len(model.graph.initializer) == 2
    (outcome,) = conformance.run_pool([const], jobs=1)
    assert (outcome.kind, outcome.npu_nodes) == ("right", 1), outcome


def test_cases_without_data_or_loadable_model_are_counted_apart():
    assert conformance.run_case(Case("node", "no_sets", b"")).kind == "no_data"
    assert conformance.run_case(Case("simple", "gone", load_error="no model.onnx")).message == "no model.onnx"
    garbage = Case("node", "garbage", b"not a model", [([np.zeros(1, np.float32)], [np.zeros(1, np.float32)])])
    assert conformance.run_case(garbage).kind == "cpu_cannot_load"


class _ExitOnUnpickle:
    """Kills the worker that receives it (exit code 3): a case that crashes its process."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_dying_worker_is_classed_and_replaced(cases):
    crash = Case("node", "test_crash", b"x", [([_ExitOnUnpickle()], [])])
    outcomes = {o.key: o for o in conformance.run_pool([crash, cases["node/test_add"]], jobs=1)}
    assert "worker died (exit code 3)" in outcomes["node/test_crash"].message
    assert outcomes["node/test_add"].kind == "right"  # the next case ran in a fresh worker


def test_a_hanging_case_times_out():
    outcomes = conformance.run_pool([Case("node", f"slow_{i}", b"x", [([], [])]) for i in range(2)], jobs=1,
                                    timeout_s=0.001)
    assert [o.message for o in outcomes] == ["timed out after 0.001 s in the CPU EP's session"] * 2


@pytest.mark.parametrize("cpu, kind", [(None, "cpu_cannot_load"), ({"cpu_ran": True, "cpu_error": ""}, "npu_error"),
                                       ({"cpu_ran": False, "cpu_error": "boom"}, "both_fail")])
def test_a_lost_case_is_blamed_on_the_session_that_was_running(cpu, kind):
    assert conformance._lost(Case("node", "t"), cpu, "worker died (exit code -11)", 1.0).kind == kind


def test_cli_prints_the_summary_and_writes_json(tmp_path, capsys):
    out = tmp_path / "conformance.json"
    assert conformance.main(["--filter", "^node/test_(add|adagrad)$", "--json", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("2 cases: right 1, not_claimed 0, wrong 0, npu_error 0"), text
    assert "node/test_adagrad: Fail:" in text  # the cases counted apart are listed with their reason
    report = json.loads(out.read_text())
    assert report["summary"]["counts"]["right"] == 1 and report["summary"]["failing"] == []
    assert [c["key"] for c in report["cases"]] == ["node/test_adagrad", "node/test_add"]


@pytest.mark.slow
@pytest.mark.parametrize("constant_inputs", [False, True], ids=["fed-inputs", "constant-inputs"])
def test_the_whole_backend_suite_has_no_wrong_claims_and_no_npuep_errors(constant_inputs):
    """Every case of the installed onnx's backend suite and its light real models (as fed, and with the inputs as
    initializers): nothing NpuEP claims is wrong, and NpuEP never fails where the CPU EP runs (cases the CPU EP
    cannot run are counted, not asserted)."""
    cases = load_cases(SUITES + EXTRA_SUITES)
    outcomes = conformance.run_pool([with_constant_inputs(c) for c in cases] if constant_inputs else cases,
                                    timeout_s=600)
    failing = [o for o in outcomes if o.kind in ("wrong", "npu_error")]
    assert not failing, "\n" + conformance.render(outcomes)
