"""KV cache formats in generation (issue 41 item 4): npu-generate --compare-kv reports greedy token agreement and
logit drift against float32 KV on the tiny decoders (float32 and int4 weights, both with GroupQueryAttention);
a format needs GroupQueryAttention's KV (an exporter graph's Concat KV is refused by name)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import npu_ep
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator
from npu_ep.tools.generation.kv_compare import compare_kv_formats, kv_bytes_per_token
from npu_ep.tools.npu_generate import main
from npu_testing import assignment

STEPS = 16
ARGS = {"buckets": (16, 32, 128), "max_kv_len": 128}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvfmt")
    src = build_tiny_llama(d / "tiny.onnx")
    gqa = rewrite(str(src), passes=("cleanup", "rope", "gqa")).save(d / "tiny.gqa.onnx")
    int4 = rewrite(str(src), passes=("cleanup", "rope", "gqa", "int4")).save(d / "tiny.npu.onnx")
    return {"exported": src, "gqa": gqa, "int4": int4}


@pytest.mark.parametrize("kind", ["gqa", "int4"])
def test_compare_reports_agreement_and_drift_against_float32_kv(models, kind, capsys):
    formats = ["float16", "int8_per_head", "int8_per_token", "int4_per_head"]
    effects = {e.kv_cache_dtype: e for e in compare_kv_formats(models[kind], PROMPTS[2], STEPS, formats, **ARGS)}
    assert list(effects) == ["float32", *formats]
    base = effects["float32"]
    assert base.agreement == base.free_agreement == 1.0 and base.first_divergence is None
    assert base.max_abs_drift == 0.0
    for fmt in formats:
        e = effects[fmt]
        assert 0.0 < e.max_abs_drift and e.mean_abs_drift <= e.max_abs_drift  # the format changed the numerics
        assert e.kv_bytes_per_token < base.kv_bytes_per_token
        assert e.free_agreement == sum(a == b for a, b in zip(e.tokens, base.tokens)) / STEPS
        assert (e.first_divergence is None) == (e.free_agreement == 1.0)
    # float16 keeps the tokens of this small model; teacher-forced drift grows as the format narrows
    assert effects["float16"].agreement == effects["float16"].free_agreement == 1.0
    assert effects["float16"].max_abs_drift < effects["int8_per_head"].max_abs_drift < \
        effects["int4_per_head"].max_abs_drift
    assert effects["float16"].mean_abs_drift < effects["int8_per_head"].mean_abs_drift < \
        effects["int4_per_head"].mean_abs_drift
    with capsys.disabled():
        print(f"\n{kind}: " + "; ".join(f"{f} drift max {e.max_abs_drift:.2e} mean {e.mean_abs_drift:.2e}, top-1 "
                                        f"{e.agreement:.0%}, free {e.free_agreement:.0%}" for f, e in effects.items()))


def test_int8_kv_generation_runs_on_npuep(models):
    npu = [(npu_ep.get_ep_name(), {"cache_dir": "", "kv_cache_dtype": "int8_per_head"}), "CPUExecutionProvider"]
    gen = Generator(models["int4"], providers=npu, **ARGS)
    placed = assignment(gen.session)
    import onnx

    gqa = [n.name for n in onnx.load(str(models["int4"])).graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa and all(placed[n] == npu_ep.get_ep_name() for n in gqa)
    assert gen._runner.eps[0].target.kv_cache_dtype == "int8_per_head"
    res = gen.generate(PROMPTS[1], 4)
    assert len(res.tokens) == 4 and all(np.isfinite(r).all() for r in res.logits)
    assert kv_bytes_per_token("int8_per_head", 4, 2, 32) == 2 * 4 * (2 * 32 + 2 * 4)


def test_cli_compare_and_refusals(models, capsys):
    argv = [str(models["int4"]), "--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "4", "--buckets", "16", "32",
            "--max-kv-len", "64"]
    assert main([*argv, "--compare-kv", "int8_per_head", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["kv_cache_dtype"] for r in rows] == ["float32", "int8_per_head"]
    assert main([*argv, "--kv-cache-dtype", "int4_per_head", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache"]["dtype"] == "int4_per_head"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--compare-kv", "int3"])
    assert exc.value.code == 2 and "unknown KV cache format 'int3'" in capsys.readouterr().err
    assert main([str(models["exported"]), *argv[1:], "--compare-kv", "int8_per_head"]) == 2
    assert "GroupQueryAttention" in capsys.readouterr().err


def test_teacher_forcing_feeds_the_given_tokens(models):
    """feed_tokens: decode step i reads feed_tokens[i]; its own tokens give the free run's logits bit for bit."""
    gen = Generator(models["int4"], providers=[(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"],
                    **ARGS)
    free = gen.generate(PROMPTS[1], 6)
    same = gen.generate(PROMPTS[1], 6, feed_tokens=free.tokens)
    assert same.tokens == free.tokens and all(np.array_equal(a, b) for a, b in zip(same.logits, free.logits))
    other = gen.generate(PROMPTS[1], 6, feed_tokens=[(t + 1) % 1024 for t in free.tokens])
    assert np.array_equal(other.logits[0], free.logits[0])  # the prefill reads only the prompt
    assert not np.array_equal(other.logits[1], free.logits[1])
    with pytest.raises(ValueError, match="feed_tokens holds 2 ids; 5 decode steps"):
        gen.generate(PROMPTS[1], 6, feed_tokens=free.tokens[:2])
