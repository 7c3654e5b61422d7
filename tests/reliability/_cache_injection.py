"""Cache-injection soak: P processes x S NpuEP sessions on ONE cache folder while entries are replaced by hostile
ones (issue 14's target). Invariants: every session's outputs equal the no-cache outputs bit for bit, no session
or ``npu-cache list`` hangs, no traceback anywhere.

    python _cache_injection.py run P S [--json]   # parent: warm-up, workers, injector, final pass; one JSON line
    python _cache_injection.py worker CONFIG ID   # one worker process (started by ``run``)

Injection kinds, each renamed atomically over a live entry name (so a reader sees a whole hostile object):
swapped (another model's valid entry), corrupt (one byte flipped), truncated, fifo, oversized (the valid entry
followed by a 1 GiB hole), dev_zero (a symlink to /dev/zero). The injector cycles through the kinds in order,
so any run of at least six injections covers every kind.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from npu_ep.tools.bench.peak_rss import peak_rss_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, HERE]

KINDS = ("swapped", "corrupt", "truncated", "fifo", "oversized", "dev_zero")
SESSION_TIMEOUT_S = 120  # a session (create + run) taking longer than this counts as a hang
N_STATIC = 3  # one-partition models with the same signature and different weights: a swap changes the outputs


def _models(folder: Path) -> list[tuple[str, str]]:
    """(model path, input shape tag) for the soak: three same-signature one-partition models, one two-partition."""
    from _child import static_model, two_partition_model
    from npu_testing import save

    out = [(save(static_model(seed=i), folder, f"static{i}.onnx"), "static") for i in range(N_STATIC)]
    out.append((save(two_partition_model(seed=7), folder, "two.onnx"), "two"))
    return out


def _feeds(tag: str):
    import numpy as np

    if tag == "static":
        return {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}
    return {"x": np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)}


# ------------------------------------------------------------------------------------------------------- worker


def worker(config_path: str, wid: int) -> int:
    """Run S sessions over the shared cache; print one JSON line per session and a summary line."""
    import faulthandler
    import traceback
    import warnings

    import numpy as np

    from npu_testing import npu_session

    cfg = json.loads(Path(config_path).read_text())
    expected = {m: np.load(e) for m, e in cfg["expected"].items()}
    summary = {"worker": wid, "sessions": 0, "ok": 0, "wrong": 0, "errors": 0, "cache_warnings": 0,
               "error_examples": []}
    for i in range(cfg["sessions"]):
        model, tag = cfg["models"][(wid + i) % len(cfg["models"])]
        faulthandler.dump_traceback_later(SESSION_TIMEOUT_S, exit=True)  # a hang ends the worker, named in stderr
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                sess = npu_session(model, {"cache_dir": cfg["cache"]})
                out = sess.run(None, _feeds(tag))[0]
                del sess
                verdict = "ok" if np.array_equal(out, expected[model]) else "wrong"
            except Exception:  # noqa: BLE001 - counted: the cache must never fail a session
                verdict = "errors"
                summary["error_examples"].append(traceback.format_exc()[-1500:])
        faulthandler.cancel_dump_traceback_later()
        summary["sessions"] += 1
        summary[verdict] += 1
        summary["cache_warnings"] += sum(w.category.__name__ == "CacheWarning" for w in caught)
        print(json.dumps({"worker": wid, "session": i, "verdict": verdict}), flush=True)
    summary["max_rss_mib"] = round(peak_rss_bytes() / 2**20)
    summary["error_examples"] = summary["error_examples"][:3]
    print(json.dumps(summary), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------- injector


class Injector:
    """Replaces live entry names with hostile objects, one kind after the other, via rename (atomic)."""

    def __init__(self, cache: Path, valid: dict[str, bytes], owner: dict[str, str], seed: int) -> None:
        self.cache, self.valid, self.owner = cache, valid, owner
        self.rng = random.Random(seed)
        self.counts = {k: 0 for k in KINDS}
        self.n = 0

    def inject(self) -> str:
        kind = KINDS[self.n % len(KINDS)]
        self.n += 1
        name = self.rng.choice(sorted(self.valid))
        tmp = self.cache / f"inject-{os.getpid()}-{self.n}.part"  # not a name the cache would ever sweep or read
        good = self.valid[name]
        if kind == "swapped":
            other = [n for n in self.valid if self.owner[n] != self.owner[name]]
            tmp.write_bytes(self.valid[self.rng.choice(sorted(other))])
        elif kind == "corrupt":
            bad = bytearray(good)
            bad[self.rng.randrange(len(bad))] ^= 1 << self.rng.randrange(8)
            tmp.write_bytes(bytes(bad))
        elif kind == "truncated":
            tmp.write_bytes(good[: self.rng.randrange(len(good))])
        elif kind == "fifo":
            os.mkfifo(tmp)
        elif kind == "oversized":
            with open(tmp, "wb") as f:
                f.write(good)
                f.truncate(1 << 30)
        else:
            os.symlink("/dev/zero", tmp)
        os.replace(tmp, self.cache / name)
        self.counts[kind] += 1
        return kind


class CacheLister:
    """``npu-cache list`` on the folder now and then, in the background (the injector keeps going meanwhile)."""

    TIMEOUT_S = 120

    def __init__(self, cache: Path) -> None:
        self.cache, self.proc, self.started = cache, None, 0.0
        self.figures = {"runs": 0, "hangs": 0, "tracebacks": 0}

    def poll(self, start: bool) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                if time.monotonic() - self.started < self.TIMEOUT_S:
                    return
                self.proc.kill()
                self.figures["hangs"] += 1
            _, err = self.proc.communicate()
            self.figures["tracebacks"] += int("Traceback" in err or self.proc.returncode not in (0, -9))
            self.proc = None
        if start:
            self.proc = subprocess.Popen([sys.executable, "-m", "npu_ep.tools.npu_cache", "--dir", str(self.cache),
                                          "list"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.started = time.monotonic()
            self.figures["runs"] += 1


# ------------------------------------------------------------------------------------------------------- parent


def run(processes: int, sessions: int, seed: int = 0) -> dict:
    """Warm up, start the workers, inject until they finish, then one clean pass; returns the figures."""
    import numpy as np

    from npu_testing import npu_session

    from npu_ep.context_cache.store import SUFFIX, CacheStore

    t0 = time.perf_counter()
    figures: dict = {"processes": processes, "sessions_per_process": sessions}
    with tempfile.TemporaryDirectory(prefix="npu_soak_inject_") as d:
        folder = Path(d)
        cache = folder / "cache"
        models = _models(folder)
        expected, valid, owner = {}, {}, {}
        for model, tag in models:  # reference outputs without a cache; then each model's valid entries
            exp = folder / (Path(model).stem + ".npy")
            np.save(exp, npu_session(model).run(None, _feeds(tag))[0])
            expected[model] = str(exp)
            before = set(os.listdir(cache)) if cache.exists() else set()
            npu_session(model, {"cache_dir": str(cache)})
            for name in set(os.listdir(cache)) - before:
                if name.endswith(SUFFIX):
                    valid[name], owner[name] = (cache / name).read_bytes(), model
        config = folder / "config.json"
        config.write_text(json.dumps({"cache": str(cache), "sessions": sessions, "models": models,
                                      "expected": expected}))
        procs = [subprocess.Popen([sys.executable, __file__, "worker", str(config), str(w)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for w in range(processes)]
        injector = Injector(cache, valid, owner, seed)
        rng = random.Random(seed + 1)
        lister = CacheLister(cache)
        deadline = time.monotonic() + sessions * SESSION_TIMEOUT_S + 60
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            kind = injector.inject()
            lister.poll(start=kind == "fifo" and lister.proc is None)  # list a folder that just got a FIFO
            time.sleep(rng.uniform(0.005, 0.03))
        while lister.proc is not None:
            lister.poll(start=False)
            time.sleep(0.1)
        lists = lister.figures
        figures["injections"] = dict(injector.counts, total=injector.n)
        workers, hangs, tracebacks = [], 0, 0
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                hangs += 1
            lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            summary = next((ln for ln in lines if "sessions" in ln), None)
            if summary is None or "Timeout (" in err:  # faulthandler fired: a session hung
                hangs += 1
                summary = summary or {"sessions": len(lines), "ok": 0, "wrong": 0, "errors": 0, "cache_warnings": 0}
            tracebacks += err.count("Traceback") + summary.get("errors", 0)
            summary["returncode"] = p.returncode
            workers.append(summary)
        # one clean pass: every model correct from the cache folder, after which every entry verifies
        final_ok = True
        for model, tag in models:
            out = npu_session(model, {"cache_dir": str(cache)}).run(None, _feeds(tag))[0]
            final_ok &= bool(np.array_equal(out, np.load(expected[model])))
        entries = CacheStore(cache).verify_all()
        figures.update({
            "sessions": sum(w["sessions"] for w in workers),
            "sessions_ok": sum(w["ok"] for w in workers),
            "wrong_results": sum(w["wrong"] for w in workers),
            "hangs": hangs + lists["hangs"],
            "tracebacks": tracebacks + lists["tracebacks"],
            "cache_warnings": sum(w["cache_warnings"] for w in workers),
            "npu_cache_list_runs": lists["runs"],
            "max_worker_rss_mib": max((w.get("max_rss_mib", 0) for w in workers), default=0),
            "final_pass_correct": final_ok,
            "final_entries_ok": f"{sum(e.ok for e in entries)}/{len(entries)}",
            "error_examples": [x for w in workers for x in w.get("error_examples", [])][:2],
        })
        figures["ok"] = (figures["sessions"] == processes * sessions and figures["sessions_ok"] == figures["sessions"]
                         and figures["wrong_results"] == 0 and figures["hangs"] == 0 and figures["tracebacks"] == 0
                         and final_ok and all(e.ok for e in entries))
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    return figures


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2], int(sys.argv[3])))
    f = run(int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(f))
    sys.exit(0 if f["ok"] else 1)
