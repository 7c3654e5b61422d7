"""The decline report: one warning per session naming every op under its reason, reaching the user whatever the
application did with logging (nothing: our stderr fallback; its own handlers: those, and only those).

The logging tests run in child processes: logging configuration is process-wide, and pytest configures it."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session
from test_capability_conformance import conformance_cases

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD_PRELUDE = textwrap.dedent("""
    import logging, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from onnx import helper
    from npu_testing import F32, make_model, npu_session

    def session():
        nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
                 helper.make_node("Atan", ["r"], ["a1"], name="atan_1"),
                 helper.make_node("Atan", ["a1"], ["a2"], name="atan_2"),
                 helper.make_node("Relu", ["a2"], ["y"], name="relu_2")]
        m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                       [helper.make_tensor_value_info("y", F32, [2, 4])])
        return npu_session(m)
""").format(tests=TESTS)


def _child(body: str) -> subprocess.CompletedProcess:
    code = CHILD_PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_logging_config_the_report_goes_to_stderr_once():
    r = _child("session()\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("stay on the CPU") == 1, r.stderr
    assert "Atan x2 ('atan_1', 'atan_2')" in r.stderr


def test_an_application_handler_on_npu_ep_gets_the_report_and_stderr_stays_quiet():
    r = _child("""
        got = []
        class Keep(logging.Handler):
            def emit(self, record):
                got.append(record.getMessage())
        logging.getLogger("npu_ep").addHandler(Keep())
        session()
        assert sum("stay on the CPU" in m for m in got) == 1, got
        assert any("Atan x2" in m for m in got), got
        print("OK")
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    assert "stay on the CPU" not in r.stderr  # not printed a second time by our fallback


def test_basic_config_of_the_application_prints_the_report_once_in_its_format():
    r = _child("""
        logging.basicConfig(format="APP %(name)s %(levelname)s %(message)s")
        session()
    """)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("stay on the CPU") == 1, r.stderr
    assert "APP npu_ep WARNING" in r.stderr


def test_log_level_option_lists_every_declined_node_at_debug():
    r = _child("""
        nodes = [helper.make_node("Atan", ["x"], ["y"], name="only_atan")]
        m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2])],
                       [helper.make_tensor_value_info("y", F32, [2])])
        npu_session(m, {"log_level": "debug"})
    """)
    assert r.returncode == 0, r.stderr
    assert "declined: node 'only_atan' (Atan): op not listed" in r.stderr


def many_if_model(n_ifs: int):
    """n_ifs If nodes, each with two branches holding a declined Atan and a claimed Relu."""
    def branch(tag: str, i: int):
        return helper.make_graph([helper.make_node("Atan", ["x"], [f"{tag}{i}_a"], name=f"{tag}{i}_atan"),
                                  helper.make_node("Relu", [f"{tag}{i}_a"], [f"{tag}{i}_out"], name=f"{tag}{i}_relu")],
                                 f"{tag}{i}", [], [helper.make_tensor_value_info(f"{tag}{i}_out", F32, [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="greater")]
    outs = []
    for i in range(n_ifs):
        nodes.append(helper.make_node("If", ["c"], [f"y{i}"], name=f"if{i}", then_branch=branch("then", i),
                                      else_branch=branch("else", i)))
        outs.append(f"y{i}")
    nodes.append(helper.make_node("Sum", outs, ["y"], name="total"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                      [helper.make_tensor_value_info("y", F32, [4])], {"zero": np.array(0.0, np.float32)})


def test_many_if_branches_give_one_short_report(caplog):
    n = 40
    model = many_if_model(n)
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        sess = npu_session(model)
    reports = [r.getMessage() for r in caplog.records if r.name == "npu_ep" and r.levelno >= logging.WARNING]
    assert len(reports) == 1, reports
    lines = reports[0].splitlines()
    assert len(lines) <= 4, reports[0]  # header + one line per reason, not one block per branch
    assert f"Atan x{2 * n}" in reports[0] and f"If x{n}" in reports[0]
    assert f"{2 * n} subgraph(s)" in lines[0]
    where = assignment(sess)
    assert where["then0_relu"] == where["else7_relu"] == "NpuEP"
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-6)


def test_a_handler_added_before_importing_npu_ep_gets_the_report():
    code = textwrap.dedent("""
        import logging
        got = []
        class Keep(logging.Handler):
            def emit(self, record):
                got.append(record.getMessage())
        logging.getLogger("npu_ep").addHandler(Keep())
    """) + CHILD_PRELUDE + textwrap.dedent("""
        session()
        assert sum("stay on the CPU" in m for m in got) == 1, got
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    assert "stay on the CPU" not in r.stderr


def test_log_level_is_the_sessions_not_the_processes():
    """log_level=error silenced the decline warnings of every later default session, and a debug session left
    every later session at DEBUG: the level was set on the process-wide logger."""
    r = _child("""
        def atan_session(name, options=None):
            nodes = [helper.make_node("Atan", ["x"], ["y"], name=name)]
            m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2])],
                           [helper.make_tensor_value_info("y", F32, [2])])
            return npu_session(m, options or {})

        atan_session("quiet_atan", {"log_level": "error"})
        atan_session("default_atan_1")
        atan_session("debug_atan", {"log_level": "debug"})
        atan_session("default_atan_2")
    """)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("NpuEP WARNING")]
    assert len(warnings) == 3, r.stderr  # default_atan_1, debug_atan, default_atan_2; not quiet_atan
    assert "quiet_atan" not in r.stderr
    assert "NpuEP DEBUG: declined: node 'debug_atan' (Atan)" in r.stderr
    assert not any("DEBUG" in ln and "default_atan" in ln for ln in r.stderr.splitlines()), r.stderr


def test_log_level_debug_reaches_an_application_handler_only_for_its_session():
    r = _child("""
        got = []
        class Keep(logging.Handler):
            def emit(self, record):
                got.append((record.levelname, record.getMessage()))
        logging.getLogger("npu_ep").addHandler(Keep())

        def atan_session(name, options=None):
            nodes = [helper.make_node("Atan", ["x"], ["y"], name=name)]
            m = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2])],
                           [helper.make_tensor_value_info("y", F32, [2])])
            return npu_session(m, options or {})

        atan_session("debug_atan", {"log_level": "debug"})
        atan_session("plain_atan")
        debug = [m for level, m in got if level == "DEBUG"]
        assert any("debug_atan" in m for m in debug), got
        assert not any("plain_atan" in m for m in debug), got
        assert sum(level == "WARNING" for level, _ in got) == 2, got
        print("OK")
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


@pytest.mark.parametrize("name, declined", [
    ("test_sce_NCd1_mean_weight_negative_ii", "GatherElements x1"),  # SoftmaxCrossEntropyLoss -> NLLLoss -> ...
    ("test_nllloss_NC", "GatherElements x1"),
    ("test_sequence_map_add_1_sequence_1_tensor", "SequenceAt x1"),
    ("test_swish", None),  # inlined twice (Swish, then CastLike): everything ends on NpuEP, nothing to report
])
def test_one_report_per_session_when_ort_inlines_functions(name, declined, caplog):
    """ORT inlines a function no EP takes and asks again: each pass printed its own warning (2-3 per session),
    naming nodes (SoftmaxCrossEntropyLoss, Swish) that no longer existed once inlined."""
    case = conformance_cases()[name]
    feeds = {i.name: v for i, v in zip(case.model.graph.input, case.data_sets[0][0])}
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        sess = npu_session(case.model)
    reports = [r.getMessage() for r in caplog.records if r.name == "npu_ep" and r.levelno >= logging.WARNING]
    assert len(reports) == (declined is not None), reports
    if declined:
        assert declined in reports[0] and "SoftmaxCrossEntropyLoss" not in reports[0], reports[0]
    for got, want in zip(sess.run(None, feeds), cpu_run(case.model, feeds)):
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                                   rtol=1e-5, atol=1e-6)


def test_a_session_ort_fails_after_inlining_still_reports_once(caplog):
    """Bernoulli inlines to a RandomUniformLike(22) the CPU EP has no kernel for: ORT gives up before calling
    GetCapability again, so the report is written when the session is released."""
    case = conformance_cases()["test_bernoulli"]
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        with pytest.raises(Exception, match="RandomUniformLike"):
            npu_session(case.model)
        gc.collect()
    reports = [r.getMessage() for r in caplog.records if r.name == "npu_ep" and r.levelno >= logging.WARNING]
    assert len(reports) == 1 and "RandomUniformLike x1" in reports[0], reports
