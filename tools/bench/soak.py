"""``python -m npu_ep.tools.bench.soak``: the long reliability runs (issue 8), with figures.

- threads: 8 threads x N runs on one two-partition session, then 8 threads over 4 sessions; every result must
  equal the single-threaded one.
- sessions: create + run + destroy N sessions in a fresh process; RSS growth must stay under 20 MB.
- fuzz: N mutated EPContext payloads (every changed payload must be refused), M re-signed hostile headers
  (no crash, no output of the wrong signature) and C hostile cache entries (mutated, swapped, FIFO, /dev/zero,
  sparse: the session's outputs never change), each fuzzer in its own process.
- kills: SIGKILL compiling processes at random moments; every cache entry left on disk must verify.
- inject: P processes x S sessions on one cache folder while swapped, corrupt, truncated, FIFO, oversized and
  /dev/zero entries replace live ones; every output must equal the no-cache output, nothing may hang or print a
  traceback, and after one clean pass every entry verifies (``python -m npu_ep.tools.bench.soak --inject``: only this).

Uses the helpers of ``tests/reliability`` (a development tool: run it from the repository). Exit code 0 when
every invariant held, 1 otherwise; ``--json`` prints the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RELIABILITY = REPO / "tests" / "reliability"


def _paths() -> None:
    if not RELIABILITY.is_dir():
        sys.exit(f"soak: error: {RELIABILITY} not found (run from a source checkout of npu_ep)")
    sys.path[:0] = [str(REPO / "tests"), str(RELIABILITY)]


def soak_threads(runs: int) -> dict[str, Any]:
    import numpy as np

    from _child import two_partition_model  # type: ignore[import-not-found] - tests/ on sys.path
    from test_concurrency import _hammer  # type: ignore[import-not-found] - tests/ on sys.path
    from npu_testing import npu_session  # type: ignore[import-not-found] - tests/ on sys.path

    model = two_partition_model().SerializeToString()
    out: dict[str, Any] = {}
    for label, n_sessions in (("one_session", 1), ("four_sessions", 4)):
        sessions = [npu_session(model) for _ in range(n_sessions)]
        t0 = time.perf_counter()
        failures = _hammer(sessions, 8, runs)
        dt = time.perf_counter() - t0
        out[label] = {"threads": 8, "runs_per_thread": runs, "total_runs": 8 * runs, "seconds": round(dt, 1),
                      "runs_per_s": round(8 * runs / dt), "failures": len(failures), "first_failure":
                      failures[0] if failures else None}
    out["ok"] = all(v["failures"] == 0 for v in out.values() if isinstance(v, dict))
    del np
    return out


def _script(name: str, *args: str, timeout: float = 7200) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, str(RELIABILITY / name), *args], capture_output=True, text=True,
                       timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    figures = json.loads(lines[-1]) if lines else {"stderr_tail": p.stderr[-1500:]}
    figures["returncode"] = p.returncode
    return p.returncode, figures


def soak_sessions(n: int) -> dict[str, Any]:
    rc, f = _script("_leak.py", str(n))
    f["limit_mb"] = 20
    f["ok"] = rc == 0 and f.get("growth_mb", 1e9) < 20 and f.get("live_ep_sessions") == 0
    return f


def soak_fuzz(n_bytes: int, n_header: int, n_cache: int) -> dict[str, Any]:
    rc_b, fb = _script("_fuzz_epcontext.py", "bytes", str(n_bytes))
    rc_h, fh = _script("_fuzz_epcontext.py", "header", str(n_header))
    rc_c, fc = _script("_fuzz_cache.py", str(n_cache))
    fb["ok"] = rc_b == 0 and fb.get("accepted_changed") == 0 and fb.get("cases") == n_bytes
    fh["ok"] = rc_h == 0  # 1: an accepted program produced an output of the wrong signature; <0: crash
    fc["ok"] = rc_c == 0 and fc.get("cases") == n_cache  # 1: a wrong output, a failed session or a changed entry used
    return {"payload_bytes": fb, "hostile_headers": fh, "cache_entries": fc,
            "ok": fb["ok"] and fh["ok"] and fc["ok"]}


def soak_kills(rounds: int) -> dict[str, Any]:
    import numpy as np

    from _child import two_partition_model  # type: ignore[import-not-found] - tests/ on sys.path
    from test_cache_faults import _kill_at_random_times, _run  # type: ignore[import-not-found] - tests/ on sys.path
    from npu_testing import npu_session, save  # type: ignore[import-not-found] - tests/ on sys.path

    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        model = save(two_partition_model(seed=11), folder)
        x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)
        expected = npu_session(model).run(None, {"x": x})[0]
        f = _kill_at_random_times(model, folder / "cache", folder, rounds=rounds, seed=int(time.time()))
        _, out = _run(model, folder / "cache", folder)
        f["final_result_identical"] = bool(np.array_equal(out, expected))
    f["ok"] = f["bad_entries"] == 0 and f["final_result_identical"]
    return f


def soak_inject(processes: int, sessions: int) -> dict[str, Any]:
    rc, f = _script("_cache_injection.py", "run", str(processes), str(sessions))
    f["ok"] = rc == 0 and bool(f.get("ok"))
    return f


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="npu-soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000, help="runs per thread (8 threads)")
    p.add_argument("--sessions", type=int, default=500, help="sessions created and destroyed")
    p.add_argument("--fuzz", type=int, default=5000, help="mutated EPContext payloads")
    p.add_argument("--header-fuzz", type=int, default=2000, help="re-signed hostile program headers")
    p.add_argument("--cache-fuzz", type=int, default=2000, help="hostile cache entries")
    p.add_argument("--kills", type=int, default=10, help="compiling processes SIGKILLed at random moments")
    p.add_argument("--inject-processes", type=int, default=4, help="processes sharing one cache folder (inject)")
    p.add_argument("--inject-sessions", type=int, default=20, help="sessions per process (inject)")
    p.add_argument("--only", choices=["threads", "sessions", "fuzz", "kills", "inject"], action="append",
                   help="run only these parts (repeatable)")
    p.add_argument("--inject", action="store_true", help="shorthand for --only inject")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    if args.inject:
        args.only = (args.only or []) + ["inject"]
    _paths()
    parts = {"threads": lambda: soak_threads(args.runs), "sessions": lambda: soak_sessions(args.sessions),
             "fuzz": lambda: soak_fuzz(args.fuzz, args.header_fuzz, args.cache_fuzz),
             "kills": lambda: soak_kills(args.kills),
             "inject": lambda: soak_inject(args.inject_processes, args.inject_sessions)}
    figures: dict[str, Any] = {}
    for name, fn in parts.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        if not args.json:
            print(f"== {name} ...", flush=True)
        figures[name] = fn()
        figures[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        if not args.json:
            print(json.dumps(figures[name], indent=1), flush=True)
    ok = all(f["ok"] for f in figures.values())
    if args.json:
        print(json.dumps({"ok": ok, **figures}))
    else:
        print("soak:", "all invariants held" if ok else "FAILED: " + ", ".join(k for k, v in figures.items()
                                                                              if not v["ok"]))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
