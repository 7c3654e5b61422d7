"""bench.llm --growing-past: the exporter's own loop (the past one longer every token) on both EPs, tokens
compared, ratios printed (no timing is asserted)."""

from __future__ import annotations

from npu_ep.tools.bench import llm


def test_growing_past_runs_both_eps_with_identical_tokens_and_prints_the_ratios(capsys):
    assert llm.main(["--growing-past", "3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "tokens identical" in out
    for line in ("inter-token, first calls of each past length:", "TTFT (prompt signature seen):",
                 "inter-token, lengths seen before:"):
        assert line in out and "x" in out.split(line)[1].splitlines()[0]
    # the demo's Llama: every step's native step takes a past one longer (no Python kernel per token)
    assert "Python steps on the last new past length (NpuEP): none" in out
