"""Nothing NpuEP loads can execute code, and hostile target descriptions are refused cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _child import assert_no_crash, run_child, static_model
from npu_testing import save

ROOT = Path(__file__).resolve().parents[2]  # the npu_ep package root
SHIPPED = ["__init__.py", "ep", "context_cache", "kernels", "rewriter", "quantization", "tools", "models"]
# builtin eval/exec only: ``model.eval()`` (torch's train/eval switch) is not code execution
FORBIDDEN = re.compile(r"\bpickle\b|\bcPickle\b|(?<![\w.])eval\(|(?<![\w.])exec\(|allow_pickle\s*=\s*True|"
                       r"\bmarshal\b|\bshelve\b|yaml\.load\(|yaml\.unsafe_load|torch\.load\(|\bdill\b|__import__\(")


def _sources():
    for entry in SHIPPED:
        p = ROOT / entry
        yield from ([p] if p.is_file() else sorted(p.rglob("*.py")))


def test_no_pickle_eval_or_exec_anywhere_in_the_package():
    hits = []
    for path in _sources():
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("#", 1)[0]
            if FORBIDDEN.search(code) and not re.match(r'\s*("""|\'\'\'|[A-Za-z].*\bno pickle\b)', line):
                hits.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not hits, "code-executing loaders found:\n" + "\n".join(hits)
    assert sum(1 for _ in _sources()) > 30  # the scan really covered the package


def test_native_shim_does_not_eval_python_strings():
    for path in sorted((ROOT / "ep" / "native").glob("*.cc")):
        text = path.read_text(errors="replace")
        assert not re.search(r"PyRun_|py::exec|py::eval|PyEval_EvalCode", text), path.name


TARGET_CASES = {
    "not_toml": "this is ][ not toml",
    "empty": "",
    "zero_sram": None,       # npu-ref with sram_bytes = 0
    "negative_tile": None,   # npu-ref with tile_m = -32
    "huge_numbers": None,    # npu-ref with sram_bytes = 10**30
    "code_in_strings": None,  # npu-ref with name = "__import__('os').system('id')"
}


def _variant(kind: str) -> str:
    ref = (ROOT / "kernels" / "targets" / "npu-ref.toml").read_text()
    return {"zero_sram": ref.replace("sram_bytes = 2097152", "sram_bytes = 0"),
            "negative_tile": ref.replace("tile_m = 32", "tile_m = -32"),
            "huge_numbers": ref.replace("sram_bytes = 2097152", "sram_bytes = 1000000000000000000000000000000"),
            "code_in_strings": ref.replace('name = "npu-ref"', 'name = "__import__(\'os\').system(\'touch PWNED\')"'),
            }.get(kind) or TARGET_CASES[kind]


@pytest.mark.parametrize("kind", sorted(TARGET_CASES))
def test_hostile_target_description_is_refused_or_harmless(tmp_path, kind):
    target = tmp_path / "evil.toml"
    target.write_text(_variant(kind))
    model = save(static_model(), tmp_path)
    child = run_child(f"""
        import numpy as np
        from npu_testing import npu_session
        try:
            s = npu_session({model!r}, {{"target": {str(target)!r}}})
            print("ACCEPTED", s.run(None, {{"x": np.ones((2, 8), np.float32)}})[0].shape)
        except Exception as e:
            print("REFUSED", " ".join(str(e).split())[:300])
    """, timeout=60, cwd=str(tmp_path))
    assert_no_crash(child)
    assert child.returncode == 0, child.stderr[-2000:]
    assert not (tmp_path / "PWNED").exists()
    if kind in ("not_toml", "empty", "zero_sram", "negative_tile"):
        assert child.last_line().startswith("REFUSED"), child.stdout
