"""The README's main job runs end to end: build -> rewrite -> NpuEP generate (identical to CPU EP) -> report."""

from __future__ import annotations

import re

from npu_ep.tools import demo


def test_demo_generates_on_npu_identical_to_cpu_and_writes_report(tmp_path, capsys):
    rc = demo.main(["--out", str(tmp_path), "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "tokens IDENTICAL" in out
    assert re.search(r"prefill entries: \d+% padding waste; one \d+-token bucket would waste \d+%", out)
    assert re.search(r"TTFT [\d.]+ ms host, [\d.]+ ms emulated NPU", out)
    assert re.search(r"inter-token [\d.]+ ms host \(mean\), [\d.]+ ms emulated NPU", out)
    on, total = map(int, re.search(r"coverage: (\d+)/(\d+) nodes on NpuEP", out).groups())
    assert 0 < on <= total
    assert (tmp_path / "tiny_llama.npu.onnx").is_file()
    assert (tmp_path / "report.html").is_file() or "HTML report skipped" in out or "HTML report failed" in out


def test_demo_reports_a_missing_pass_instead_of_crashing(tmp_path, monkeypatch):
    from npu_ep.models.tiny_llama import build_tiny_llama
    from npu_ep.rewriter import _core

    real = _core._family_module

    def missing_gqa(name):
        if name == "gqa":
            raise _core.RewriteError("pass 'gqa' is not available: module npu_ep.rewriter.gqa is not installed")
        return real(name)

    monkeypatch.setattr(_core, "_family_module", missing_gqa)
    src = build_tiny_llama(tmp_path / "m.onnx")
    counts, skipped = demo.rewrite_available(src, tmp_path / "m.npu.onnx")
    assert skipped and skipped[0].startswith("gqa:")
    assert counts.get("MatMulToNBits", 0) > 0 and not any(k.startswith("GroupQueryAttention") for k in counts)
