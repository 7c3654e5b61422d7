"""onnxruntime-genai as a client of NpuEP, on a tiny Llama folder built by genai's own model builder (random
weights, no download): greedy tokens on NpuEP equal the CPU provider's, the options in genai_config.json reach
NpuEP, ``npu-generate`` reads the folder, and ``npu-report --compare`` sizes its symbolic dims.

Skips without onnxruntime-genai, torch or transformers (they build the model). genai reports no graph assignment,
so NpuEP's own record proves it ran: the EpSession created for the genai model (found by its unique ``cache_dir``
option) claimed every node ORT offered it, in one partition, and its program ran once per generated token.
"""

from __future__ import annotations

import json
import shutil

import pytest

og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("torch")
pytest.importorskip("transformers")

import npu_ep
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.registration import register_with_genai
from npu_ep.models.genai_llama import EOS, build_genai_llama
from npu_ep.tools.npu_generate import main as generate_main
from npu_ep.tools.npu_report import main as report_main

PROMPT = [1, 5, 6, 7, 8, 9]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    register_with_genai(og)  # once per process, whichever test module registered it first
    return build_genai_llama(tmp_path_factory.mktemp("genai") / "tiny_llama")


def _genai_generate(model_folder, provider: str | None, options: dict[str, str] | None = None, *,
                    to_the_end: bool = False) -> tuple[list[int], object]:
    """Greedy ids after PROMPT (genai stops at the end-of-sequence id and leaves it out, unless ``to_the_end``
    masks it until NEW_TOKENS), and the genai model (NpuEP's sessions live as long as it does)."""
    cfg = og.Config(str(model_folder))
    cfg.clear_providers()
    if provider:
        cfg.append_provider(provider)
        for key, value in (options or {}).items():
            cfg.set_provider_option(provider, key, value)
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    length = len(PROMPT) + NEW_TOKENS
    params.set_search_options(max_length=length, do_sample=False, **({"min_length": length} if to_the_end else {}))
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)][len(PROMPT):], model


def _ep_session(cache_dir: str):
    found = [s for s in list(LIVE_SESSIONS) if s.config.get("ep.npuep.cache_dir") == cache_dir]
    assert len(found) == 1, f"{len(found)} NpuEP sessions with cache_dir {cache_dir}"
    return found[0]


def test_greedy_tokens_on_npu_ep_equal_the_cpu_providers_and_npu_ep_ran_every_node(folder, tmp_path):
    cpu, _ = _genai_generate(folder, None, to_the_end=True)
    cache = str(tmp_path / "cache")
    npu, _model = _genai_generate(folder, "NpuEP", {"cache_dir": cache}, to_the_end=True)
    assert npu == cpu and len(cpu) == NEW_TOKENS, (cpu, npu)
    ep = _ep_session(cache)
    decisions = ep.capabilities[-1][1].decisions
    assert decisions and all(d.claimed for d in decisions), [d.node.op_type for d in decisions if not d.claimed]
    assert len(ep.programs) == 1
    (program,) = ep.programs.values()
    assert program.calls == len(npu)  # the prefill, then one decode step per later token
    ops = {d.node.op_type for d in decisions}
    assert {"MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= ops


def test_provider_options_in_genai_config_reach_npu_ep(folder, tmp_path):
    """genai 0.18 reads ``"provider_options": [{"NpuEP": {...}}]`` and ORT hands them over as ``ep.npuep.*``."""
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    cache = str(tmp_path / "cache")
    cfg_path = copy / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = [
        {"NpuEP": {"target": "npu-ref", "cache_dir": cache, "partition_policy": "max_coverage"}}]
    cfg_path.write_text(json.dumps(cfg))
    model = og.Model(str(copy))  # no append_provider: the file alone selects NpuEP
    ep = _ep_session(cache)  # alive while the genai model is
    assert ep.options.target == "npu-ref" and ep.options.cache_dir == cache and ep.programs
    del model, ep
    cfg["model"]["decoder"]["session_options"]["provider_options"] = [{"NpuEP": {"no_such_option": "1"}}]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(Exception, match=r"unknown NpuEP provider option.s. no_such_option"):
        og.Model(str(copy))


def _generate_json(capsys, argv) -> dict:
    assert generate_main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_npu_generate_reads_a_genai_folder(folder, capsys, tmp_path):
    cpu_tokens, _ = _genai_generate(folder, None)
    argv = [str(folder), "--prompt-ids", *map(str, PROMPT), "--max-new-tokens", str(NEW_TOKENS), "--json"]
    on_cpu = _generate_json(capsys, argv + ["--cpu"])
    on_npu = _generate_json(capsys, argv + ["--target", "npu-ref"])
    # generation stops at the end-of-sequence id genai_config.json declares and leaves it out, as genai does
    assert on_cpu["tokens"] == on_npu["tokens"] == cpu_tokens and EOS not in cpu_tokens
    assert len(cpu_tokens) < NEW_TOKENS  # this prompt meets the end-of-sequence id early: the stop is exercised
    assert on_npu["compile"]["npu_partitions"] == 1
    # the KV capacity defaults to what the context leaves after the largest prefill bucket
    context = json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]
    assert on_cpu["kv_capacity"] == context - 128  # default buckets up to half the context: 32, 128


def test_npu_generate_refuses_a_decoder_file_outside_the_folder(folder, tmp_path, capsys):
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    cfg = json.loads((copy / "genai_config.json").read_text())
    cfg["model"]["decoder"]["filename"] = "../elsewhere.onnx"
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    assert generate_main([str(copy), "--prompt-ids", "1", "--cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "genai_config.json: model.decoder.filename '../elsewhere.onnx' points outside" in err[0]


def test_npu_report_compare_sizes_the_genai_models_dims(folder, tmp_path, capsys):
    out = tmp_path / "report.json"
    rc = report_main([str(folder / "model.onnx"), "--compare", "--dim", "past_sequence_length=5",
                      "--dim", "sequence_length=3", "--json", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["dims"]["kv_cache_dim"] == 32 and doc["dims"]["total_sequence_length"] == 8
    rows = doc["compare"]["nodes"]
    assert rows and all(r["ok"] for r in rows) and doc["compare"]["first_failure"] is None
    assert doc["compare"]["local"] == [] and doc["compare"]["first_kernel_failure"] is None
    assert {f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")} <= {r["tensor"] for r in rows}


def test_readme_genai_snippet_runs(folder, monkeypatch, capsys, tmp_path):
    """The README's onnxruntime-genai block, with ``model_folder`` = the tiny folder: it prints NpuEP's sequence,
    which equals the CPU provider's."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## onnxruntime-genai", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    registered = []
    # the fixture registered the library in this process already (genai refuses a second registration)
    monkeypatch.setattr(og, "register_execution_provider_library", lambda *args: registered.append(args))
    monkeypatch.setenv("NPU_EP_CACHE_DIR", str(tmp_path / "cache"))
    exec(compile(snippet, "README.md:onnxruntime-genai", "exec"), {"model_folder": str(folder)})
    assert registered == [("NpuEP", npu_ep.get_library_path())]
    printed = [int(t) for t in re.findall(r"\d+", capsys.readouterr().out)]
    cfg = og.Config(str(folder))
    cfg.clear_providers()
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens([1, 5, 6, 7])
    while not gen.is_done():
        gen.generate_next_token()
    assert printed == [int(t) for t in gen.get_sequence(0)]


def test_genai_benchmark_runs_both_providers_with_identical_tokens(folder, capsys):
    from npu_ep.tools.bench.genai import main as bench_main

    assert bench_main(["--folder", str(folder), "--repeats", "1", "--new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "tokens identical: True" in out and "per later token" in out and "ratio" in out
