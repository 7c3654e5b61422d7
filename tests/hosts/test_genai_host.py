"""onnxruntime-genai's C API generating on NpuEP in a C++ program (tests/hosts/genai_host.cc): the same greedy
tokens as genai's Python API on NpuEP, and ORT's profile of the decoder session shows NpuEP ran a node per token.

onnxruntime-genai 0.18's wheel ships ``libonnxruntime-genai.so`` but not ``ort_genai_c.h``: the program declares
the few functions it calls from the upstream header's signatures. Skips without onnxruntime-genai, torch or
transformers (genai's model builder makes the tiny Llama folder), or when that build fails here. Slow (the folder
is built again, ~1-2 min): ``.ci/run`` runs it after the suite.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

og = pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.slow

import npu_ep
from npu_ep.ep.registration import register_with_genai
from tests.hosts.cpp_host import ort_library

PROMPT = [1, 5, 6, 7, 8, 9]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from npu_ep.models.genai_llama import GenaiBuildError, build_genai_llama

    try:
        return build_genai_llama(tmp_path_factory.mktemp("genai") / "tiny_llama")
    except (GenaiBuildError, subprocess.CalledProcessError, ImportError) as exc:
        pytest.skip(f"cannot build the genai model folder here: {exc}")


@pytest.fixture(scope="module")
def genai_host(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    out = tmp_path_factory.mktemp("genai_host")
    genai_lib = Path(og.__file__).parent / "libonnxruntime-genai.so"
    if not genai_lib.is_file():
        pytest.skip(f"onnxruntime-genai ships no {genai_lib.name}")
    (out / "lib").mkdir()
    (out / "lib" / "libonnxruntime.so.1").symlink_to(ort_library())
    binary = out / "genai_host"
    # --no-as-needed: genai looks for an already loaded libonnxruntime.so.1 before searching for one itself
    subprocess.run([compiler, "-std=c++17", "-O2", "-o", str(binary), str(Path(__file__).with_name("genai_host.cc")),
                    "-Wl,--no-as-needed", str(out / "lib" / "libonnxruntime.so.1"), str(genai_lib),
                    f"-Wl,-rpath,{genai_lib.parent}", f"-Wl,-rpath,{out / 'lib'}"], check=True)
    return binary


def _python_tokens(folder: Path) -> list[int]:
    register_with_genai(og)  # once per process, whichever test registered it first
    cfg = og.Config(str(folder))
    cfg.clear_providers()
    cfg.append_provider("NpuEP")
    cfg.set_provider_option("NpuEP", "cache_dir", "")
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    length = len(PROMPT) + NEW_TOKENS
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)][len(PROMPT):]


def test_genai_c_api_generates_the_python_apis_tokens_on_npu_ep(folder, genai_host, tmp_path):
    expected = _python_tokens(folder)
    assert len(expected) == NEW_TOKENS
    prefix = tmp_path / "profile"
    proc = subprocess.run([str(genai_host), npu_ep.get_plugin_library_path(), str(folder), str(NEW_TOKENS),
                           str(prefix), *map(str, PROMPT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("tokens"))
    assert [int(t) for t in line.split()[1:]] == expected
    (profile,) = tmp_path.glob("profile*.json")
    events = json.loads(profile.read_text())
    on_npu = [e for e in events if e.get("cat") == "Node" and e.get("args", {}).get("provider") == "NpuEP"]
    assert len(on_npu) == NEW_TOKENS, "one NpuEP partition run per generated token (prefill, then each decode)"
