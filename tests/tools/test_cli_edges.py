"""The command-line tools at their edges (issue 38, item 22): flags their messages suggest exist, contradictory or
zero values are refused in one line, a FIFO is named for what it is, Ctrl-C during the imports exits 130 without a
traceback, ``--json``/``--html`` land as a set, and ``NPU_EP_TARGET`` is named when it is wrong."""

from __future__ import annotations

import importlib.abc
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.tools import npu_cache, npu_generate, npu_report, npu_rewrite
from tests.npu_testing import make_model, save

F32 = TensorProto.FLOAT


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("cli_edges") / "tiny.onnx"))


@pytest.fixture
def relu(tmp_path):
    return save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                           [helper.make_tensor_value_info("x", F32, ["batch", 8])],
                           [helper.make_tensor_value_info("y", F32, ["batch", 8])]), tmp_path, "relu.onnx")


def _exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse errors exit from inside main, as for the console script
        return e.code


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_too_long_prompt_suggests_only_flags_npu_generate_has(llm, capsys):
    code = _exit_code(npu_generate.main, [llm, "--prompt-ids", *map(str, range(1, 40)), "--buckets", "8",
                                          "--no-chunked-prefill", "--cpu"])
    line = _one_error_line(capsys)
    assert code == 2 and "longer than the largest prefill bucket (8)" in line, line
    flags = set(re.findall(r"--[a-z][a-z-]+", line))
    known = {o for a in npu_generate.build_parser()._actions for o in a.option_strings}
    assert flags and flags <= known, f"{line} suggests {flags - known}, which npu-generate does not have"


@pytest.mark.parametrize("value", ["0", "-4"])
def test_max_kv_len_below_one_is_refused_not_the_default(llm, capsys, value):
    code = _exit_code(npu_generate.main, [llm, "--prompt-ids", "1", "2", "--max-kv-len", value, "--cpu"])
    assert code == 2 and "--max-kv-len must be >= 1" in _one_error_line(capsys)


def test_contradictory_static_dims_name_both_values(relu, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    code = _exit_code(npu_rewrite.main, [relu, "-o", str(out), "--passes", "cleanup", "--static-dim", "batch=2",
                                         "--static-dim", "batch=3"])
    line = _one_error_line(capsys)
    assert code == 2 and "batch=2" in line and "batch=3" in line, line
    assert not out.exists()
    assert _exit_code(npu_rewrite.main, [relu, "-o", str(out), "--passes", "cleanup", "--static-dim", "batch=2",
                                         "--static-dim", "batch=2"]) == 0  # the same value twice is no conflict


def test_contradictory_report_dims_name_both_values(relu, capsys):
    code = _exit_code(npu_report.main, [relu, "--dim", "batch=2", "--dim", "batch=3", "--quiet"])
    line = _one_error_line(capsys)
    assert code == 2 and "batch=2" in line and "batch=3" in line, line


@pytest.mark.parametrize("main, prog", [(npu_report.main, "npu-report"), (npu_rewrite.main, "npu-rewrite")])
def test_a_fifo_is_named_as_one_not_as_a_missing_file(tmp_path, capsys, main, prog):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    argv = [str(fifo)] + (["-o", str(tmp_path / "out.onnx")] if prog == "npu-rewrite" else [])
    assert _exit_code(main, argv) == 2
    assert _one_error_line(capsys) == f"{prog}: error: {fifo}: is a FIFO, not a regular file"


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C arriving while ``name`` is being imported."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


@pytest.mark.parametrize("main, argv, module", [
    (npu_report.main, ["{model}"], "npu_ep.tools.report.build"),
    (npu_rewrite.main, ["{model}", "-o", "{out}"], "npu_ep.rewriter"),
    (npu_generate.main, ["{model}", "--prompt-ids", "1"], "npu_ep.tools.generation"),
    (npu_cache.main, ["list"], "npu_ep.context_cache.store"),
])
def test_ctrl_c_during_the_imports_exits_130_without_a_traceback(relu, tmp_path, capsys, monkeypatch, main, argv,
                                                                 module):
    monkeypatch.delitem(sys.modules, module, raising=False)  # imported again by main: the finder below sees it
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(module), *sys.meta_path])
    assert main([a.format(model=relu, out=tmp_path / "out.onnx") for a in argv]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip() == "" and captured.out == ""


_SIGTERM_SELF = """
import os, signal, sys
import npu_ep._atomic, npu_ep.tools.report.html
from npu_ep.tools.npu_report import main

where, model, out = sys.argv[1:]
if where == "rendering":
    real_render = npu_ep.tools.report.html.render_html
    def render_html(doc):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_render(doc)
    npu_ep.tools.report.html.render_html = render_html
else:  # writing: the first output file is open
    real_writer = npu_ep._atomic.atomic_writer
    def atomic_writer(path, *args):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_writer(path, *args)
    npu_ep._atomic.atomic_writer = atomic_writer
sys.exit(main([model, "--json", out + ".json", "--html", out + ".html", "--quiet"]))
"""


@pytest.mark.parametrize("where", ["rendering", "writing"])
def test_sigterm_while_outputs_are_produced_leaves_both_or_neither(relu, tmp_path, where):
    """SIGTERM between the outputs left report.json written and report.html missing."""
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_SIGTERM_SELF), where, relu, str(out)],
                          capture_output=True, text=True, timeout=300, cwd="/")
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("report"))
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr)
    assert written == ([] if where == "rendering" else ["report.html", "report.json"]), written
    if written:
        assert out.with_suffix(".html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("main, argv", [
    (npu_report.main, ["{model}", "--quiet"]),
    (npu_generate.main, ["{llm}", "--prompt-ids", "1"]),
    (npu_rewrite.main, ["{model}", "-o", "{out}", "--passes", "cleanup"]),
])
def test_a_wrong_npu_ep_target_is_named_in_the_error(relu, llm, tmp_path, capsys, monkeypatch, main, argv):
    monkeypatch.setenv("NPU_EP_TARGET", "npu-nope")
    assert _exit_code(main, [a.format(model=relu, llm=llm, out=tmp_path / "o.onnx") for a in argv]) == 2
    line = _one_error_line(capsys)
    assert "NPU_EP_TARGET='npu-nope'" in line and "unknown target 'npu-nope'" in line, line


def test_npu_ep_target_is_in_the_readme_options_table():
    readme = Path(npu_report.__file__).parent.parent.joinpath("README.md").read_text()
    assert re.search(r"^\| `target` \|.*`NPU_EP_TARGET`", readme, re.M)


def test_node_names_with_terminal_escapes_reach_the_terminal_escaped_in_one_line(tmp_path, capsys):
    """A hostile model's names (newline, OSC title escape, ANSI clear screen) in npu-report's one-line error."""
    x = helper.make_tensor_value_info("x", F32, [2, 4])
    y = helper.make_tensor_value_info("y", F32, [2, 4])
    evil = "n1\x1b]0;owned\x07\nnpu-report: all good\x1b[2J"
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["a"], name=evil),
                                                 helper.make_node("Relu", ["a"], ["b"], name="n2"),
                                                 helper.make_node("Identity", ["a"], ["y"], name="n3")],
                                                "cycle", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "evil.onnx"
    path.write_bytes(model.SerializeToString())
    assert _exit_code(npu_report.main, [str(path)]) == 2
    line = _one_error_line(capsys)
    assert "\x1b" not in line and "\x07" not in line
    assert "node 'n1\\x1b]0;owned\\x07\\nnpu-report: all good\\x1b[2J' (Add) reads 'b' before" in line, line
