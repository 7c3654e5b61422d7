"""onnxruntime-genai's past_present_share_buffer on NpuEP (issue 41 item 2): genai binds each layer's past and
present to one buffer of max_length slots, and NpuEP's GroupQueryAttention appends in place: tokens equal genai's
CPU provider's, every GQA call in place with no copy of the past (the nodes' KV counters); with the option off,
every call copies the past into a fresh present.

What genai (0.18) lacks: it picks the device its buffers live on from the provider's name among those it knows
(CUDA, DML, WebGPU, QNN, OpenVINO, NvTensorRtRtx, ...); for any other name, NpuEP's included, the KV cache is
allocated in host memory, never with an EP's own device allocator. NpuEP on its NPU-memory device
(``NpuEPNpuMemory``) then gets the same tokens, with ORT copying every KV tensor into NPU memory and back on every
run (NpuEP's data-transfer counters): the second test pins that down, so a genai that learns to use an EP's
allocator shows up here.

Skips without onnxruntime-genai, torch or transformers (they build the model), as test_genai does.
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
from npu_ep.kernels.ops import _kv_traffic
from npu_ep.models.genai_llama import build_genai_llama

PROMPT = [1, 5, 6, 7, 8, 9]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    register_with_genai(og)  # once per process, whichever test module registered it first
    return build_genai_llama(tmp_path_factory.mktemp("genai_kv") / "tiny_llama")


def _with_share_buffer(folder, tmp_path, share: bool):
    copy = tmp_path / f"share_{int(share)}"
    shutil.copytree(folder, copy)
    cfg_path = copy / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["search"]["past_present_share_buffer"] = share
    cfg_path.write_text(json.dumps(cfg))
    return copy


def _generate(model_folder, provider: str | None, cache_dir: str = "") -> tuple[list[int], object]:
    cfg = og.Config(str(model_folder))
    cfg.clear_providers()
    if provider:
        cfg.append_provider(provider)
        cfg.set_provider_option(provider, "cache_dir", cache_dir)
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    length = len(PROMPT) + NEW_TOKENS
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)][len(PROMPT):], model


def _ep_session(cache_dir: str):
    (ep,) = [s for s in list(LIVE_SESSIONS) if s.config.get("ep.npuep.cache_dir") == cache_dir or
             s.config.get("ep.npuepnpumemory.cache_dir") == cache_dir]
    return ep


def _traffic(ep) -> dict[str, int]:
    steps = [st.prepared for program in ep.programs.values() for st in program.steps
             if st.op == "com.microsoft::GroupQueryAttention"]
    return {**_kv_traffic.total(steps), "nodes": len(steps)}


@pytest.mark.parametrize("share", [True, False])
def test_genai_share_buffer_appends_in_place_on_npu_ep(folder, tmp_path, share):
    model_folder = _with_share_buffer(folder, tmp_path, share)
    cpu, _ = _generate(model_folder, None)
    cache = str(tmp_path / f"cache_{int(share)}")
    npu, _model = _generate(model_folder, npu_ep.get_ep_name(), cache)
    assert npu == cpu
    traffic = _traffic(_ep_session(cache))
    calls = traffic["nodes"] * NEW_TOKENS  # the prefill, then one decode step per later token
    if share:
        assert traffic["in_place"] == calls and traffic["copied_bytes"] == traffic["full_copies"] == 0
    else:
        assert traffic["in_place"] == 0 and traffic["full_copies"] == calls - traffic["nodes"]  # past: no prefill


def test_genai_keeps_its_kv_in_host_memory_even_on_npu_memory(folder, tmp_path):
    """NpuEP's NPU-memory device: the same tokens, but genai's KV is host memory, so ORT copies it into NPU memory
    before every run and the presents back after it."""
    model_folder = _with_share_buffer(folder, tmp_path, True)
    cpu, _ = _generate(model_folder, None)
    cache = str(tmp_path / "cache_npu_memory")
    npu, _model = _generate(model_folder, npu_ep.get_ep_name() + "NpuMemory", cache)
    assert npu == cpu
    ep = _ep_session(cache)
    counters = ep.device_counters()
    assert counters["memory"] == "npu"
    layers = _traffic(ep)["nodes"]
    assert counters["copies_to_npu"] >= 2 * layers * NEW_TOKENS  # every past, every run
    assert counters["copies_to_host"] >= 2 * layers * NEW_TOKENS  # every present, every run
