"""Issue 14's target: processes sharing one cache folder while swapped, corrupt, truncated, FIFO, oversized and
/dev/zero entries are injected: zero wrong results, zero hangs, zero tracebacks (``_cache_injection.py``)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _child import HERE, PYTHON


def _soak(processes: int, sessions: int, timeout: float) -> dict:
    p = subprocess.run([PYTHON, os.path.join(HERE, "_cache_injection.py"), "run", str(processes), str(sessions)],
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"rc={p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(lines[-1])


def _assert_invariants(f: dict, processes: int, sessions: int) -> None:
    assert f["sessions"] == processes * sessions and f["sessions_ok"] == f["sessions"], f
    assert f["wrong_results"] == 0 and f["hangs"] == 0 and f["tracebacks"] == 0, f
    assert f["final_pass_correct"] and f["ok"], f
    assert all(f["injections"][k] >= 1 for k in ("swapped", "corrupt", "truncated", "fifo", "oversized",
                                                  "dev_zero")), f["injections"]


def test_short_cache_injection_soak():
    f = _soak(2, 3, timeout=600)
    _assert_invariants(f, 2, 3)


@pytest.mark.slow
def test_full_cache_injection_soak_4_processes_x_20_sessions():
    f = _soak(4, 20, timeout=3600)
    _assert_invariants(f, 4, 20)
