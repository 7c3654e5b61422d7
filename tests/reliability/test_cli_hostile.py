"""Hostile inputs to the CLIs ``npu-rewrite`` and ``npu-report``: exit code 2 with ONE line on stderr, no
traceback (not even on the models a graph tool may process with exit 0), never a crash or hang. All cases of one CLI
run in one child process (a crash fails the whole child; the per-case record says which case was running)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from _child import assert_no_crash, run_child, static_model
from npu_testing import F32

RNG = np.random.default_rng(5)


def _raw(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "hostile", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _cases(tmp_path) -> dict[str, str]:
    good = static_model().SerializeToString()
    files = {"empty": b"", "random_bytes": RNG.bytes(3000), "truncated": good[: len(good) // 2]}
    m = static_model()
    m.opset_import[0].version = 99
    files["opset_99"] = m.SerializeToString()
    x = helper.make_tensor_value_info("x", F32, [2, 4])
    files["missing_initializer"] = _raw([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [x],
                                        [helper.make_tensor_value_info("y", F32, [2, 3])]).SerializeToString()
    files["cycle"] = _raw([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                           helper.make_node("Relu", ["a"], ["b"], name="n2"),
                           helper.make_node("Identity", ["a"], ["y"], name="n3")], [x],
                          [helper.make_tensor_value_info("y", F32, [2, 4])]).SerializeToString()
    w = TensorProto(name="W", data_type=F32, dims=[4, 3], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "../../../../etc/passwd"), ("offset", "0"), ("length", "48")):
        w.external_data.add(key=k, value=v)
    files["external_data_escape"] = _raw([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [x],
                                         [helper.make_tensor_value_info("y", F32, [2, 3])], [w]).SerializeToString()
    big = TensorProto(name="W", data_type=F32, dims=[2**20, 2**20], raw_data=bytes(48))
    files["huge_declared_initializer"] = _raw(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [helper.make_tensor_value_info("x", F32, [2, 2**20])],
        [helper.make_tensor_value_info("y", F32, [2, 2**20])], [big]).SerializeToString()
    files["giant_reshape"] = _raw(
        [helper.make_node("Reshape", ["x", "S"], ["y"], name="r")], [x],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(np.array([10**6] * 3, np.int64), "S")]).SerializeToString()
    files["short_initializer"] = _raw([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [x],
                                      [helper.make_tensor_value_info("y", F32, [2, 3])],
                                      [TensorProto(name="W", data_type=F32, dims=[4, 3], raw_data=bytes(20))]
                                      ).SerializeToString()
    files["negative_initializer_dim"] = _raw([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [x],
                                             [helper.make_tensor_value_info("y", F32, [2, 3])],
                                             [TensorProto(name="W", data_type=F32, dims=[4, -3], raw_data=bytes(48))]
                                             ).SerializeToString()
    files["negative_input_dims"] = _raw([helper.make_node("Relu", ["x"], ["a"], name="r"),
                                         helper.make_node("Neg", ["a"], ["y"], name="n")],
                                        [helper.make_tensor_value_info("x", F32, [-1, 4])],
                                        [helper.make_tensor_value_info("y", F32, [-1, 4])]).SerializeToString()
    paths = {}
    for name, data in files.items():
        p = tmp_path / f"{name}.onnx"
        p.write_bytes(data)
        paths[name] = str(p)
    paths["missing_file"] = str(tmp_path / "does_not_exist.onnx")
    paths["directory"] = str(tmp_path)
    return paths


RUNNER = """
import contextlib, io, json, sys
from npu_ep.tools.{module} import main
results = {{}}
for name, argv in {argvs!r}.items():
    print("CASE", name, file=sys.__stdout__, flush=True)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # an exception escaping main() is a traceback for the user
        code = "uncaught " + type(e).__name__ + ": " + str(e)[:200]
    results[name] = {{"code": code, "stderr": err.getvalue()}}
print(json.dumps(results))
"""

# Models that are invalid for ORT but that a graph tool may legitimately process (exit 0) are allowed to pass;
# everything else must be refused with exit code 2.
MAY_SUCCEED = {"npu_rewrite": {"cycle", "giant_reshape", "missing_initializer", "opset_99", "negative_input_dims"},
               "npu_report": {"giant_reshape", "negative_input_dims"}}


@pytest.mark.parametrize("module", ["npu_rewrite", "npu_report"])
def test_cli_refuses_hostile_models_with_one_line_and_exit_2(tmp_path, module):
    paths = _cases(tmp_path)
    if module == "npu_rewrite":
        argvs = {n: [p, "-o", str(tmp_path / f"out_{n}.onnx")] for n, p in paths.items()}
    else:
        argvs = {n: [p, "--quiet"] for n, p in paths.items()}
    child = run_child("import resource; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
                      + RUNNER.format(module=module, argvs=argvs), timeout=300)
    assert_no_crash(child)
    assert child.returncode == 0, f"{child.stdout[-500:]}\n{child.stderr[-3000:]}"
    results = json.loads(child.last_line())
    problems = []
    for name, r in sorted(results.items()):
        lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
        if r["code"] == 0 and name in MAY_SUCCEED[module]:
            if "Traceback" in r["stderr"]:  # a success must not print a traceback either (warnings are one line)
                problems.append(f"{name}: exit 0 with a traceback: {r['stderr'][-400:]!r}")
            continue
        if r["code"] != 2:
            problems.append(f"{name}: exit {r['code']!r}, stderr {r['stderr'][-300:]!r}")
        elif len(lines) != 1 or "Traceback" in r["stderr"]:
            problems.append(f"{name}: exit 2 but stderr has {len(lines)} lines: {r['stderr'][:400]!r}")
    assert not problems, "\n".join(problems)
