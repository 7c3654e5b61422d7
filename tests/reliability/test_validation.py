"""Validation gaps found by the hostile-user pass (issue 14 items 7 and 8): bad provider options and bad target
descriptions are refused at session creation with one message naming the key; ``~`` in paths is expanded."""

from __future__ import annotations

import os
import re

import pytest
from _child import static_model
from npu_testing import assignment, npu_session

from npu_ep.ep.options import OptionError, parse
from npu_ep.kernels.target import BUILTIN_DIR, MAX_FILE_BYTES, Target, TargetError


def _creation_error(provider_options: dict) -> str:
    with pytest.raises(Exception) as info:
        npu_session(static_model(), provider_options)
    return str(info.value)


@pytest.mark.parametrize("key,value,expected", [
    ("host_threads", "-7", "host_threads='-7': expected an integer between 1 and 2"),
    ("host_threads", "0", "host_threads='0': expected an integer between 1 and 2"),
    ("blas_threads", "-1", "blas_threads='-1': expected an integer >= 0"),
    ("bridge_cost_us", "nan", "bridge_cost_us='nan': expected a finite number of microseconds >= 0"),
    ("bridge_cost_us", "inf", "bridge_cost_us='inf': expected a finite number"),
    ("bridge_cost_us", "-3", "bridge_cost_us='-3': expected a finite number"),
    ("cache_max_bytes", "-1", "cache_max_bytes='-1': expected an integer >= 0"),
])
def test_bad_provider_option_is_refused_naming_the_key(key, value, expected):
    with pytest.raises(OptionError, match=re.escape(expected)):
        parse({f"ep.npuep.{key}": value})
    assert f"OptionError: NpuEP option {expected}" in _creation_error({key: value})


def test_valid_thread_and_cost_options_still_pass():
    opts = parse({"ep.npuep.host_threads": "1", "ep.npuep.blas_threads": "0", "ep.npuep.bridge_cost_us": "2.5"})
    assert (opts.host_threads, opts.blas_threads, opts.bridge_cost_us) == (1, 0, 2.5)


def test_tilde_in_cache_dir_is_the_home_folder_not_a_folder_named_tilde(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert parse({"ep.npuep.cache_dir": "~/x"}).cache_dir == str(home / "x")
    sess = npu_session(static_model(), {"cache_dir": "~/x"})
    assert set(assignment(sess).values()) == {"NpuEP"}
    assert (home / "x").is_dir() and any((home / "x").iterdir())  # the compiled entry landed there
    assert list(cwd.iterdir()) == []  # no "~" folder in the working directory
    assert parse({"ep.npuep.cache_dir": ""}).cache_dir == ""  # "" still disables the cache


def _ref_toml() -> str:
    return (BUILTIN_DIR / "npu-ref.toml").read_text()


def _write_target(tmp_path, text: str) -> str:
    path = tmp_path / "bad_target.toml"
    path.write_text(text)
    return str(path)


def _replace_line(text: str, prefix: str, new: str) -> str:
    lines = text.splitlines()
    hits = [i for i, ln in enumerate(lines) if ln.startswith(prefix)]
    assert len(hits) == 1, prefix
    lines[hits[0]] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("prefix,line,expected", [
    ("clock_mhz", "clock_mhz = nan", "clock_mhz: expected a positive float (finite), got nan"),
    ("clock_mhz", "clock_mhz = inf", "clock_mhz: expected a positive float (finite), got inf"),
    ("outstanding", "outstanding = 0", "dma.outstanding: expected a positive int, got 0"),
    ("static_shapes", 'static_shapes = "no"', "static_shapes: expected true or false, got 'no'"),
    ("sram_bytes", "sram_bytes = 1.5", "sram_bytes: expected a positive int, got 1.5"),
    ("lanes", "lanes = true", "vector.lanes: expected a positive int, got True"),
    ("transcendental_cycles", "transcendental_cycles = -1", "vector.transcendental_cycles: expected a non-negative"),
    ("latency_cycles", "latency_cycles = nan", "dma.latency_cycles: expected a non-negative number (finite)"),
    ("bytes_per_cycle", "bytes_per_cycle = 0", "dma.bytes_per_cycle: expected a positive float, got 0"),
    ("description", "description = 1979-05-27", "description: expected a string"),
    ("clock_mhz", "clock_mhz = 1000\nclockmhz = 5", "unknown field(s) ['clockmhz']"),
    ('"Gemm"', '"Gemm" = { dtypes = ["float32"], static_shapes = "yes" }', "ops.Gemm.static_shapes: expected true"),
    ('"Gemm"', '"Gemm" = { dtypes = ["float32"], max_dim = 0 }', "ops.Gemm.max_dim: expected a positive int"),
    ('"Gemm"', '"Gemm" = { dtypes = "float32" }', "ops.Gemm.dtypes: expected a list of dtype names"),
    ('"Gemm"', '"Gemm" = { dtypes = [["float32"]] }', "ops.Gemm: expected a dtype name"),
])
def test_bad_target_field_is_refused_naming_the_field(tmp_path, prefix, line, expected):
    """Before: nan/0/"no" were accepted; outstanding = 0 raised ZeroDivisionError in the cost model, which
    declined every matmul to the CPU without saying why."""
    path = _write_target(tmp_path, _replace_line(_ref_toml(), prefix, line))
    with pytest.raises(TargetError, match=re.escape(expected)):
        Target.load(path)
    msg = _creation_error({"target": path})
    assert "TargetError" in msg and expected in msg


def test_deeply_nested_target_toml_is_one_line_error(tmp_path):
    path = _write_target(tmp_path, 'name = "x"\nclock_mhz = 1\nx = ' + "[" * 50000 + "]" * 50000 + "\n")
    with pytest.raises(TargetError) as info:
        Target.load(path)
    assert str(info.value) == f"cannot read target description {path}: nested too deeply"
    assert "RecursionError" not in _creation_error({"target": path})


def test_target_that_is_a_fifo_or_too_big_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(TargetError, match="not a regular file"):
        Target.load(str(fifo))  # used to block forever in open()
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse
    with pytest.raises(TargetError, match="more than the"):
        Target.load(str(big))


def test_builtin_targets_pass_the_full_schema():
    for name in ("npu-ref", "npu-edge"):
        t = Target.load(name)
        assert t.dma.get("outstanding", 1) >= 1 and t.clock_hz > 0
