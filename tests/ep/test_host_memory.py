"""retain_host_memory: after an NpuEP session is created, freed KV-cache-sized arrays are reused without page
faults (glibc thresholds raised once per process); with the option off the process keeps glibc's defaults, which
give such memory back to the OS and fault it in again."""

from __future__ import annotations

import json
import sys

import pytest

from tests.reliability._child import run_child

CHILD = """
    import json, resource
    import numpy as np
    from onnx import helper
    from npu_testing import F32, make_model, npu_session

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F32, [4])],
                       [helper.make_tensor_value_info("y", F32, [4])])
    sess = npu_session(model, {{"retain_host_memory": "{flag}"}})

    def step():  # a decode step's worth of fresh 1 MiB outputs, all freed at its end
        arrays = [np.ones(1 << 18, np.float32) for _ in range(8)]
        del arrays

    step(); step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    print(json.dumps({{"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}}))
"""


def _faults(flag: str) -> int:
    child = run_child(CHILD.format(flag=flag))
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.last_line())["faults"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc thresholds")
def test_freed_step_buffers_are_reused_without_page_faults():
    retained, default = _faults("1"), _faults("0")
    # 5 steps x 8 MiB = 10240 pages: with glibc's defaults most of them fault in again every step
    assert retained < 200, retained
    assert default > 5000, default
