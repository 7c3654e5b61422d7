"""Names from a hostile model never reach a message raw (issue 38 item 18): a newline in a node name forged a
"NpuEP WARNING" line, ANSI/OSC escapes recoloured the terminal or set its title. ``log.escape`` writes every
control, format and separator character as a Python escape; decline warnings, capability reasons, compile and run
errors use it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper
from npu_testing import F32, make_model, npu_session

from npu_ep.ep.capability import analyze
from npu_ep.log import escape
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.target import Target


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORGED_LINE = "atan\nNpuEP WARNING: 0 of 0 nodes: all is well"
OSC_TITLE = "\x1b]0;pwned\x07\x1b[31mred"


@pytest.mark.parametrize("raw, shown", [
    ("plain name/with:punct", "plain name/with:punct"),
    ("é ü 中文", "é ü 中文"),
    (FORGED_LINE, "atan\\nNpuEP WARNING: 0 of 0 nodes: all is well"),
    (OSC_TITLE, "\\x1b]0;pwned\\x07\\x1b[31mred"),
    ("tab\there\rcr", "tab\\there\\rcr"),
    ("rtl\u202eoverride\u2028sep\x85", "rtl\\u202eoverride\\u2028sep\\x85"),
])
def test_escape_writes_control_characters_as_escapes(raw, shown):
    assert escape(raw) == shown
    assert escape(shown) == shown  # idempotent: a message may escape a name describe() already escaped


def test_decline_warning_cannot_be_forged_nor_drive_the_terminal():
    """In a child process with no logging configured: the warning goes to stderr, the terminal."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        from onnx import helper
        from npu_testing import F32, make_model, npu_session
        nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
                 helper.make_node("Atan", ["r"], ["a"], name={FORGED_LINE!r}),
                 helper.make_node("Atan", ["a"], ["b"], name={OSC_TITLE!r}),
                 helper.make_node("Relu", ["b"], ["y"], name="relu_2")]
        npu_session(make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                               [helper.make_tensor_value_info("y", F32, [2, 4])]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert next(ln for ln in r.stderr.splitlines() if "NpuEP WARNING" in ln).startswith("NpuEP WARNING: 2 of 4")
    assert sum(ln.startswith("NpuEP WARNING") for ln in r.stderr.splitlines()) == 1, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr)
    assert "'atan\\nNpuEP WARNING: 0 of 0 nodes: all is well'" in r.stderr
    assert "'\\x1b]0;pwned\\x07\\x1b[31mred'" in r.stderr


def test_capability_reasons_escape_node_and_value_names():
    nodes = [helper.make_node("Relu", ["x\x1b[2J"], ["r"], name="relu\nforged"),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q\r"], name="q"),
             helper.make_node("Atan", ["q\r"], ["y"], name="atan")]
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x\x1b[2J", F32, None)],
                              [helper.make_tensor_value_info("y", F32, None)],
                              [helper.make_tensor("s", F32, [], [0.5]),
                               helper.make_tensor("z", TensorProto.INT4, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    result = analyze(nodes_from_model(model, infer_shapes=False), Target.load("npu-edge"))
    reasons = [d.reason for d in result.declined]
    assert reasons and all(r.isprintable() for r in reasons), reasons
    assert any("relu\\nforged" in r for r in reasons), reasons


def test_run_error_escapes_the_node_name():
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=0, name="gather\x1b[2J\nNpuEP ERROR: forged"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 3])],
                       [helper.make_tensor_value_info("y", F32, [3])], {"idx": np.array(1, np.int64)})
    sess = npu_session(model)
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": np.zeros((1, 3), np.float32)})  # index 1 out of range at run time
    msg = str(info.value)
    assert "node 'gather\\x1b[2J\\nNpuEP ERROR: forged' (Gather)" in msg, msg
    assert "\x1b" not in msg and "\nNpuEP ERROR" not in msg, msg
