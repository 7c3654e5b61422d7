"""The LLM flow on a model exported by torch from a randomly initialized Hugging Face config (issue 7): rewrite,
then greedy generation on NpuEP is token-identical to ORT's CPU EP. Skipped cleanly without torch/transformers."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import npu_ep
import onnx
from npu_testing import assignment

from npu_ep.models.torch_export import export_tiny_hf
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_export_rewritten_generates_the_cpu_tokens_on_npu(tmp_path, arch):
    src = export_tiny_hf(arch, tmp_path / f"{arch}.onnx", exporter="torchscript", layers=2, hidden=64, heads=4,
                         kv_heads=2, vocab=256, max_positions=256)
    result = rewrite(str(src), passes=("cleanup", "rope", "gqa", "int4"))
    assert result.report.counts["FoldRotaryIntoGQA"] == 2 and result.report.counts["MatMulToNBits"] > 0
    model = result.save(tmp_path / f"{arch}.npu.onnx")
    prompt = [5, 17, 42, 99, 3, 250, 7]
    npu = Generator(model, buckets=(16, 64), max_kv_len=128)
    cpu = Generator(model, providers=["CPUExecutionProvider"], buckets=(16, 64), max_kv_len=128)
    got, ref = npu.generate(prompt, 24), cpu.generate(prompt, 24)
    assert got.tokens == ref.tokens
    placed = assignment(npu.session)
    op_of = {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    on_npu = {op_of.get(n) for n, ep in placed.items() if ep == npu_ep.get_ep_name()}
    assert {"GroupQueryAttention", "MatMulNBits"} <= on_npu, placed
