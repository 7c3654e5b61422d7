"""bench.llm_kv's teacher-forced check against the CPU EP (issue 41 item 3): every mode is fed the CPU EP's greedy
tokens, so a step's top-1 and logits compare in the same context; a model that really computes something else shows
as drift and lost agreement, float rounding does not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import npu_ep
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.bench.llm_kv import FLOOR, FORCED_MODES, teacher_forced
from npu_ep.tools.generation import Generator
from npu_testing import assignment

NPU = [(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]
STEPS, CAPACITY = 12, 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The rewritten tiny Llama, and a copy whose embedding table is scaled by 1.5 (another model, not rounding)."""
    d = tmp_path_factory.mktemp("llm_kv")
    rewritten = rewrite(str(build_tiny_llama(d / "t.onnx")), passes=("cleanup", "rope", "gqa", "int4"))
    path = rewritten.save(d / "t.npu.onnx")
    m = onnx.load(str(path))
    inits = {t.name: t for t in m.graph.initializer}
    table = next(inits[n.input[0]] for n in m.graph.node if n.op_type == "Gather" and n.input[0] in inits)
    table.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(table) * np.float32(1.5), table.name))
    other = d / "t.scaled.onnx"
    onnx.save(m, str(other))
    return str(path), str(other)


def test_teacher_forced_agreement_and_drift_against_the_cpu_ep(models):
    path, other = models
    gens = {"CPU EP copying": Generator(path, providers=CPU, max_kv_len=CAPACITY, kv_in_place=False),
            "NpuEP resident NPU memory": Generator(path, providers=NPU, max_kv_len=CAPACITY, kv_memory="npu"),
            "NpuEP resident": Generator(path, providers=NPU, max_kv_len=CAPACITY)}
    gqa = [n.name for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "GroupQueryAttention"]
    for name in FORCED_MODES:
        placed = assignment(gens[name].session)
        assert gqa and all(placed[n] == npu_ep.get_ep_name() for n in gqa), name
    floor = Generator(other, providers=CPU, max_kv_len=CAPACITY, kv_in_place=False)
    r = teacher_forced(gens, list(PROMPTS[1]), STEPS, floor)
    assert r["steps"] == STEPS and r["cpu_margin_min"] >= 0
    for name in FORCED_MODES:  # float rounding only: every top-1 equal, drift at float32's scale
        m = r["modes"][name]
        assert m["agree"] == STEPS and m["max_drift"] < 1e-3 and m["disagree_margin_max"] is None, (name, m)
    scaled = r["modes"][FLOOR]  # (the floor slot, here a different model): its logits drift far beyond rounding
    assert scaled["max_drift"] > 100 * r["modes"]["NpuEP resident"]["max_drift"] and scaled["max_drift"] > 0.01
