"""Capability on what ONNX's backend conformance suite and hostile models throw at it (issue 38): graphs ORT
inlines (SequenceMap), tensors that cannot cross a partition boundary (int4), attributes the plugin API cannot hand
over (TYPE_PROTO, string tensors), types numpy lacks named in declines, and partitions that would only copy data.
Each is a decline with a reason; the session builds and gives the CPU EP's answer."""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session

from npu_ep.ep.capability import analyze
from npu_ep.ep.graph_convert import node_from_dict
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.support import why_not
from npu_ep.kernels.target import Target

from test_policy import target_without


@functools.cache
def conformance_cases() -> dict[str, onnx.backend.test.case.test_case.TestCase]:
    """onnx's node conformance tests by name (built once: ~6 s)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in collect_testcases()}


def _same(got, want) -> None:
    """Outputs equal, tensors or sequences of tensors (these conformance models compute exactly)."""
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


SEQUENCE_MAP = ["test_sequence_map_identity_1_sequence", "test_sequence_map_identity_2_sequences",
                "test_sequence_map_identity_1_sequence_1_tensor", "test_sequence_map_add_2_sequences",
                "test_sequence_map_add_1_sequence_1_tensor", "test_sequence_map_extract_shapes"]


@pytest.mark.parametrize("name", SEQUENCE_MAP)
def test_sequence_map_body_is_not_claimed_and_the_model_runs(name):
    """ORT inlines a SequenceMap nobody takes into a Loop; a fused NpuEP node claimed in its body was copied along
    and the session failed with INVALID_GRAPH "No opset import for domain 'NpuEP'"."""
    case = conformance_cases()[name]
    feeds = {i.name: v for i, v in zip(case.model.graph.input, case.data_sets[0][0])}
    sess = npu_session(case.model)
    _same(sess.run(None, feeds), cpu_run(case.model, feeds))


def test_sequence_map_body_declines_with_the_reason():
    case = conformance_cases()["test_sequence_map_add_1_sequence_1_tensor"]
    (smap,) = nodes_from_model(case.model)
    body = smap.attrs["body"]
    result = analyze(list(body.nodes), Target.load("npu-ref"), parent=smap)
    assert not result.partitions
    assert all("inside a graph of node 'SequenceMap_0' (SequenceMap), which ORT inlines as a function" in d.reason
               for d in result.decisions)
    loop = dataclasses.replace(smap, op_type="Loop")
    kept = analyze(list(body.nodes), Target.load("npu-ref"), parent=loop)
    assert kept.partitions  # a Loop's body stays a graph: its nodes may be claimed


@pytest.mark.parametrize("name", ["test_if_opt", "test_if_seq", "test_ai_onnx_ml_label_encoder_tensor_mapping",
                                  "test_string_concat", "test_regex_full_match_basic"])
def test_unreadable_attributes_and_strings_are_declines_not_capability_errors(name, capfd, caplog):
    """An Optional's TYPE_PROTO attribute ("Unexpected attribute type.") and a string tensor attribute ("tensor
    element type 8 cannot be handed to the NPU runtime") made GetCapability fail for the whole graph."""
    case = conformance_cases()[name]
    feeds = {i.name: v for i, v in zip(case.model.graph.input, case.data_sets[0][0])}
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        sess = npu_session(case.model)
    err = capfd.readouterr().err
    assert "GetCapability" not in err and "cannot be handed" not in err, err
    reports = [r.getMessage() for r in caplog.records if r.name == "npu_ep" and r.levelno >= logging.WARNING]
    assert len(reports) == 1 and "stay on the CPU" in reports[0], reports
    _same(sess.run(None, feeds), cpu_run(case.model, feeds))


def _listed_node(attrs: dict) -> dict:
    value = {"name": "x", "elem_type": 1, "shape": [4]}
    return {"index": 0, "name": "relu", "op_type": "Relu", "domain": "", "inputs": [value],
            "outputs": [dict(value, name="y")], "attrs": attrs}


def test_an_unreadable_attribute_declines_the_node_naming_it():
    target = Target.load("npu-ref")
    assert why_not(node_from_dict(_listed_node({})), target) is None
    string_tensor = why_not(node_from_dict(_listed_node({"table": {"unreadable": 8}})), target)
    assert string_tensor == "node 'relu' (Relu): attribute 'table' is a string tensor, which the NPU cannot carry"
    type_proto = why_not(node_from_dict(_listed_node({"type": {"unreadable": -1}})), target)
    assert "attribute 'type' has a type the plugin API does not hand over" in type_proto


@pytest.mark.parametrize("elem_type, name", [(TensorProto.BFLOAT16, "bfloat16"),
                                             (TensorProto.FLOAT8E4M3FN, "float8e4m3fn"),
                                             (TensorProto.INT4, "int4"), (TensorProto.STRING, "string")])
def test_decline_names_the_input_dtype_numpy_lacks(elem_type, name):
    """It read "input dtype None" for every type numpy has no dtype for."""
    nodes = [helper.make_node("Identity", ["x"], ["y"], name="ident")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", elem_type, [4])],
                       [helper.make_tensor_value_info("y", elem_type, [4])], opset=21)
    (decision,) = analyze(nodes_from_model(model), Target.load("npu-ref")).decisions
    assert f"input dtype {name} not supported by target npu-ref" in decision.reason


def _int4_chain() -> onnx.ModelProto:
    """x -> Relu -> QuantizeLinear (int4) -> DequantizeLinear -> Relu -> y: the int4 tensor between Q and DQ."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_in"),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
             helper.make_node("Relu", ["d"], ["y"], name="relu_out")]
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", F32, [8])],
                              [helper.make_tensor_value_info("y", F32, [8])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                               helper.make_tensor("z", TensorProto.INT4, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("cpu_op, on_cpu, declined", [("DequantizeLinear", "dq", "q"), ("QuantizeLinear", "q", "dq")])
def test_int4_tensor_to_or_from_a_cpu_node_is_declined_not_a_failed_compile(tmp_path, cpu_op, on_cpu, declined):
    """With DQ (or Q) on the CPU the int4 tensor crosses the boundary: capability claimed the Q (or DQ) and Compile
    then failed the session ("element type 22 the NPU cannot carry"). Now its other end stays on the CPU too."""
    model = _int4_chain()
    target = target_without(tmp_path, (cpu_op,), name=f"npu-ref-no-{cpu_op.lower()}")
    sess = npu_session(model, {"target": target})
    where = assignment(sess)
    assert where[declined] == where[on_cpu] == "CPUExecutionProvider"
    assert where["relu_in"] == where["relu_out"] == "NpuEP"
    x = np.linspace(-3, 4, 8).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
    (reason,) = [d.reason for d in analyze(nodes_from_model(model), Target.load(target)).declined
                 if d.node.name == declined]
    assert "q (int4) would" in reason and "the NPU runtime cannot carry int4 tensors" in reason


def test_int4_inside_a_partition_stays_claimed():
    model = _int4_chain()
    sess = npu_session(model)
    assert npu_partitions(sess) == [["relu_in", "q", "dq", "relu_out"]]
    x = np.linspace(-3, 4, 8).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])


def test_identity_from_graph_input_to_graph_output_is_left_to_ort():
    nodes = [helper.make_node("Identity", ["x"], ["y"], name="pass"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["z"], name="after_relu")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                       [helper.make_tensor_value_info("y", F32, [4]), helper.make_tensor_value_info("z", F32, [4])])
    sess = npu_session(model)
    assert npu_partitions(sess) == [["relu"]]  # (ORT's optimizer removed 'after_relu')
    assert assignment(sess)["pass"] == "CPUExecutionProvider"
    nodes = nodes_from_model(model)
    result = analyze(nodes, Target.load("npu-ref"))
    assert [[nodes[i].name for i in p] for p in result.partitions] == [["relu", "after_relu"]]  # beside real work
    (reason,) = [d.reason for d in result.declined]
    assert reason == ("node 'pass' (Identity): a partition of Identity nodes alone would only copy data across the "
                      "boundary; ORT forwards it")
    x = np.array([1, -2, 3, -4], np.float32)
    for got, want in zip(sess.run(None, {"x": x}), cpu_run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_compile_refuses_by_the_rule_capability_declines_by(monkeypatch, tmp_path):
    """One rule, dtypes.crosses_boundary: the shim's Compile asks it too. With capability's use of it bypassed (it
    claims the int4 boundary as it did before), Compile refuses the partition naming the value and the type."""
    from npu_ep import dtypes
    from npu_ep.ep import capability

    assert {t for t in range(29) if dtypes.crosses_boundary(t)} == {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13}
    monkeypatch.setattr(capability, "crosses_boundary", lambda elem_type: True)
    target = target_without(tmp_path, ("DequantizeLinear",), name="npu-ref-no-dq")
    with pytest.raises(Exception, match="value 'q' has element type int4, which the NPU runtime cannot carry"):
        npu_session(_int4_chain(), {"target": target})



def test_an_int4_graph_output_declines_its_producer():
    """x -> Relu -> QuantizeLinear (int4) -> graph output: the int4 tensor would leave the partition."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], name="q")]
    graph = helper.make_graph(nodes, "int4_out", [helper.make_tensor_value_info("x", F32, [8])],
                              [helper.make_tensor_value_info("q", TensorProto.INT4, [8])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                               helper.make_tensor("z", TensorProto.INT4, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    nodes_info = nodes_from_model(model)
    result = analyze(nodes_info, Target.load("npu-ref"))
    assert [[nodes_info[i].name for i in p] for p in result.partitions] == [["relu"]]
    (reason,) = [d.reason for d in result.declined]
    assert reason == ("node 'q' (QuantizeLinear): q (int4) would leave the NPU partition, and the NPU runtime "
                      "cannot carry int4 tensors")
