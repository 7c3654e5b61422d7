"""models/torch_export.py: importable without torch, clear errors, the graph contract, seeds, the CLI.

The exporter-vs-torch numerics and the rewriter on every arch x exporter live in
tests/rewriter/test_exported_models.py (each model is exported once there). Here only the TorchScript exporter
is used where an export is needed (about a second each).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npu_ep.models import torch_export
from npu_ep.models.torch_export import ExportError


@pytest.fixture
def torch_stack():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_the_module_and_models_package_does_not_import_torch():
    res = _python("import sys, npu_ep, npu_ep.models, npu_ep.models.torch_export, npu_ep.rewriter\n"
                  "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_without_torch_export_raises_a_clear_error(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` fail like a missing install
            "from npu_ep.models.torch_export import export_tiny_hf, ExportError\n"
            f"try:\n    export_tiny_hf('llama', {str(tmp_path / 'm.onnx')!r})\n"
            "except ExportError as e:\n    print('ExportError:', e)\n")
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert "ExportError: exporting needs torch and transformers" in res.stdout
    assert "pip install torch==2.13.0" in res.stdout


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="mistral"), "unknown arch 'mistral'"),
    (dict(arch="llama", exporter="fx"), "unknown exporter 'fx'"),
    (dict(arch="llama", heads=3), "hidden must be a multiple of heads"),
    (dict(arch="llama", heads=4, kv_heads=3), "heads a multiple of kv_heads"),
    (dict(arch="gptj", heads=4, kv_heads=2), "gptj has no grouped KV heads"),
])
def test_bad_arguments_are_refused_before_torch_is_needed(kwargs, message):
    with pytest.raises(ExportError, match=message):
        torch_export.check_args(**kwargs)


def test_io_names_follow_optimum():
    ins, outs = torch_export.io_names(2)
    assert ins == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key",
                   "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"]
    assert outs == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]


def _dims(v: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def test_torchscript_export_has_the_kv_cache_contract(torch_stack, tmp_path):
    path = torch_export.export_tiny_hf("qwen2", tmp_path / "q.onnx", exporter="torchscript", layers=1,
                                       hidden=32, heads=4, kv_heads=1, vocab=100)
    model = onnx.load(str(path))
    dims = {v.name: _dims(v) for v in (*model.graph.input, *model.graph.output)}
    assert dims == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "total_sequence"],
                    "position_ids": ["batch", "sequence"],
                    "past_key_values.0.key": ["batch", 1, "past_sequence", 8],
                    "past_key_values.0.value": ["batch", 1, "past_sequence", 8],
                    "logits": ["batch", "sequence", 100],
                    "present.0.key": ["batch", 1, "total_sequence", 8],
                    "present.0.value": ["batch", 1, "total_sequence", 8]}
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["npu_ep.arch"] == "qwen2" and meta["npu_ep.exporter"] == "torchscript"
    assert meta["max_position_embeddings"] == "256"


def _weights(path) -> list[np.ndarray]:
    return [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer if t.data_type == 1]


def test_seed_makes_exports_deterministic(torch_stack, tmp_path):
    kw = dict(exporter="torchscript", layers=1, hidden=32, heads=2, kv_heads=1, vocab=64)
    a = _weights(torch_export.export_tiny_hf("llama", tmp_path / "a.onnx", seed=3, **kw))
    b = _weights(torch_export.export_tiny_hf("llama", tmp_path / "b.onnx", seed=3, **kw))
    c = _weights(torch_export.export_tiny_hf("llama", tmp_path / "c.onnx", seed=4, **kw))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c) if x.shape == y.shape)
    # weights are ~1/sqrt(fan_in), not HF's std 0.02, so attention and logits are far from uniform
    big = max(a, key=lambda w: w.size)
    assert 0.05 < float(big.std()) < 1.0


def test_exporter_failure_becomes_an_export_error(torch_stack, tmp_path, monkeypatch):
    import torch

    def broken(*args, **kwargs):
        raise RuntimeError("Unsupported: something torch could not trace\nlong traceback")

    monkeypatch.setattr(torch.onnx, "export", broken)
    with pytest.raises(ExportError, match=r"^phi3 with the dynamo exporter: dynamo export failed: RuntimeError: "
                                          r"Unsupported: something torch could not trace$"):
        torch_export.export_tiny_hf("phi3", tmp_path / "p.onnx", exporter="dynamo", layers=1)


def test_cli_writes_the_model_and_refuses_bad_arguments(torch_stack, tmp_path):
    out = tmp_path / "g.onnx"
    res = subprocess.run([sys.executable, "-m", "npu_ep.models.torch_export", "gptj", str(out), "--exporter",
                          "torchscript", "--layers", "1"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"wrote {out}") and "gptj, torchscript exporter" in res.stdout
    assert {v.name for v in onnx.load(str(out)).graph.output} == {"logits", "present.0.key", "present.0.value"}
    res = subprocess.run([sys.executable, "-m", "npu_ep.models.torch_export", "llama", str(tmp_path / "x.onnx"),
                          "--heads", "5"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: hidden 64 / heads 5 / kv_heads 2: hidden must be a multiple of heads, the head dim even, and heads "
        "a multiple of kv_heads"]
    assert not (tmp_path / "x.onnx").exists()
