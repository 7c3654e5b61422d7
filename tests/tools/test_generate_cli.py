"""``npu-generate`` arguments: prompt ids space- or comma-separated (the README's form is ``--prompt-ids 1 2 3``),
and bad ids refused in one line with exit 2 before any session runs (issue 14 items 7 and 12)."""

from __future__ import annotations

import json

import pytest

from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.tools.npu_generate import main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("gen_cli") / "tiny.onnx"))


def _tokens(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["tokens"]


def test_prompt_ids_space_and_comma_separated_give_the_same_tokens(model, capsys):
    spaced = _tokens(capsys, [model, "--prompt-ids", "1", "2", "3", "--max-new-tokens", "4", "--cpu", "--json"])
    comma = _tokens(capsys, [model, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--cpu", "--json"])
    mixed = _tokens(capsys, [model, "--prompt-ids", "1,2", "3", "--max-new-tokens", "4", "--cpu", "--json",
                             "--buckets", "16", "32"])
    assert spaced == comma == mixed and len(spaced) == 4


@pytest.mark.parametrize("ids,message", [
    (["1", "99999"], "prompt token id 99999 at position 1 is outside the vocabulary [0, "),
    (["-1"], "prompt token id -1 at position 0 is outside the vocabulary"),
    ([""], "the prompt is empty"),
    (["1", "x"], "expected integers (space- or comma-separated), got 'x'"),
])
def test_bad_prompt_ids_are_one_line_exit_2(model, capsys, ids, message):
    try:
        code = main([model, "--prompt-ids", *ids, "--max-new-tokens", "2"])
    except SystemExit as e:  # argparse errors exit from inside main, as for the console script
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_vocabulary_known_from_a_session_too(model):
    import onnxruntime as ort

    from npu_ep.tools.generation import Generator

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    gen = Generator(sess, max_kv_len=64)
    with pytest.raises(ValueError, match="prompt token id 1024 at position 0 is outside the vocabulary"):
        gen.generate([1024], 2)


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def test_kv_cache_larger_than_memory_is_refused_before_allocating(model, capsys):
    code, err = _run([model, "--prompt-ids", "1", "--max-kv-len", "1000000000", "--cpu"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "a KV cache of 1000000000 tokens needs 1,907.3 GiB" in err[0] and "--max-kv-len" in err[0]


def test_onnx_runtime_failure_is_one_line(model, capsys, monkeypatch):
    """ORT failing a run (here: a failed allocation, injected) is one line with exit 1, not a traceback."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from npu_ep.tools.generation import generator

    def failing_run(self, feeds):
        raise Fail("[ONNXRuntimeError] : 1 : FAIL : Failed to allocate memory for requested buffer of size 10")

    monkeypatch.setattr(generator._Runner, "run", failing_run)
    code, err = _run([model, "--prompt-ids", "1", "--cpu"], capsys)
    assert code == 1 and err == [f"npu-generate: {model}: ONNX Runtime failed: FAIL : Failed to allocate memory "
                                 "for requested buffer of size 10"], err


def _genai_folder(folder, model: str, **model_fields) -> str:
    """A genai-style folder around the exporter model: genai_config.json naming its file and I/O (torch-free;
    the folder genai's own builder makes is tested in test_genai.py)."""
    import shutil

    folder.mkdir()
    shutil.copy(model, folder / "decoder.onnx")
    decoder = {"filename": "decoder.onnx", "session_options": {"provider_options": [{"NpuEP": {"target": "npu-ref"}}]},
               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                          "past_value_names": "past_key_values.%d.value"},
               "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                           "present_value_names": "present.%d.value"}}
    cfg = {"model": {"decoder": decoder, "context_length": 256, **model_fields}}
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_a_genai_folder_generates_what_its_decoder_file_does_and_stops_at_eos(model, tmp_path, capsys):
    argv = ["--prompt-ids", "1", "2", "3", "--max-new-tokens", "8", "--json"]
    plain = _tokens(capsys, [model, *argv, "--cpu"])
    folder = _genai_folder(tmp_path / "g", model, eos_token_id=[plain[3], 99999])
    on_cpu = _tokens(capsys, [folder, *argv, "--cpu"])
    assert on_cpu == plain[:3]  # the end-of-sequence id ends generation and is left out, as genai does
    assert _tokens(capsys, [folder, *argv]) == on_cpu  # NpuEP with the options from genai_config.json
    no_eos = _genai_folder(tmp_path / "g2", model)
    assert _tokens(capsys, [no_eos, *argv, "--cpu"]) == plain


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["model"]["decoder"].update(filename="../x.onnx"), "model.decoder.filename '../x.onnx' points outside"),
    (lambda c: c["model"]["decoder"].update(filename="missing.onnx"), "'missing.onnx': no such file in"),
    (lambda c: c["model"]["decoder"]["inputs"].update(past_key_names="past.key"), "need one %d (the layer index)"),
    (lambda c: c["model"].update(eos_token_id="2"), "model.eos_token_id: expected an integer or a list"),
    (lambda c: c["model"]["decoder"]["session_options"].update(provider_options={"NpuEP": {}}),
     "provider_options must be a list"),
    (lambda c: c["model"]["decoder"]["inputs"].update(input_ids="tokens"), "model has no input 'tokens'"),
    (lambda c: c["model"].pop("decoder"), "no model.decoder object"),
])
def test_a_bad_genai_config_is_one_line_exit_2(model, tmp_path, capsys, edit, message):
    folder = _genai_folder(tmp_path / "g", model)
    cfg = json.loads((tmp_path / "g" / "genai_config.json").read_text())
    edit(cfg)
    (tmp_path / "g" / "genai_config.json").write_text(json.dumps(cfg))
    code, err = _run([folder, "--prompt-ids", "1", "--cpu"], capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert "genai_config.json" in err[0] or "tokens" in err[0]


def test_a_folder_without_genai_config_or_with_bad_json_is_one_line_exit_2(tmp_path, capsys):
    code, err = _run([str(tmp_path), "--prompt-ids", "1", "--cpu"], capsys)
    assert code == 2 and len(err) == 1 and "a folder without genai_config.json" in err[0], err
    (tmp_path / "genai_config.json").write_text("{not json")
    code, err = _run([str(tmp_path), "--prompt-ids", "1", "--cpu"], capsys)
    assert code == 2 and len(err) == 1 and "genai_config.json: not valid JSON" in err[0], err
