"""Issue 14 item 13: a chain of many one-node partitions (Relu on NpuEP, Atan on the CPU between them).

Where session creation time goes was measured (README, 'Keep partition counts low'): ORT's own partitioning
between GetCapability and Compile grows faster than linearly; NpuEP's side is one GetCapability call and one
Compile call for all partitions. These tests hold NpuEP to that shape and check the results; no timing asserts.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session

from npu_ep.ep import entry_points


def chain_model(n: int):
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
        if i < n - 1:
            nodes.append(helper.make_node("Atan", [prev], [f"a{i}"], name=f"atan{i}"))  # on no target
            prev = f"a{i}"
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                      [helper.make_tensor_value_info(prev, F32, [2, 4])])


@pytest.fixture
def calls(monkeypatch):
    seen = {"get_capability": 0, "compile": 0}
    for name in seen:
        real = getattr(entry_points.EpSession, name)

        def counted(self, *args, _real=real, _name=name):
            seen[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(entry_points.EpSession, name, counted)
    return seen


def _check(n: int, calls) -> None:
    model = chain_model(n)
    sess = npu_session(model)
    where = assignment(sess)
    assert all(where[f"relu{i}"] == "NpuEP" for i in range(n))
    assert len(npu_partitions(sess)) == n
    assert calls == {"get_capability": 1, "compile": n}  # one pass each: nothing on our side is per-pair
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-6, atol=1e-7)


def test_150_partitions_run_and_match_cpu(calls):
    _check(150, calls)


@pytest.mark.slow
def test_1000_partitions_run_and_match_cpu(calls):
    _check(1000, calls)
