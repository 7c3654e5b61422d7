"""Helpers for reliability tests: small models, and running hostile cases in a child process so that a segfault,
abort or hang shows up as a return code / timeout instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
from onnx import helper

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
PYTHON = sys.executable


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str

    @property
    def crashed(self) -> bool:  # killed by a signal (segfault, abort) or the interpreter died hard
        return self.returncode < 0 or self.returncode > 2

    def last_line(self) -> str:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def run_child(code: str, *, timeout: float = 120, env: dict | None = None, preexec_fn=None,
              cwd: str | None = None) -> Child:
    """Run ``code`` in a fresh interpreter with tests/ and tests/reliability on sys.path."""
    prelude = f"import sys; sys.path[:0] = [{TESTS!r}, {HERE!r}]\n"
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        p = subprocess.run([PYTHON, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout, env=full_env, preexec_fn=preexec_fn, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"child hung for more than {timeout}s; stderr tail: {str(exc.stderr)[-2000:]}") from exc
    return Child(p.returncode, p.stdout, p.stderr)


def assert_no_crash(child: Child) -> None:
    assert not child.crashed, (f"child crashed with return code {child.returncode}\nstdout:\n{child.stdout[-3000:]}"
                               f"\nstderr:\n{child.stderr[-3000:]}")


def static_model(n: int = 8, seed: int = 0):
    """Add -> Mul -> Relu with static shapes: every target takes it (one NpuEP partition)."""
    from npu_testing import F32, make_model

    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Add", ["x", "B"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "C"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, n])],
                      [helper.make_tensor_value_info("y", F32, [2, n])],
                      {"B": rng.standard_normal((2, n)).astype(np.float32),
                       "C": rng.standard_normal((2, n)).astype(np.float32)})


def two_partition_model(seed: int = 0):
    """MatMul -> Relu | CPU-only op | Add -> Tanh: two NpuEP partitions with a CPU node between them."""
    from npu_testing import F32, make_model

    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Atan", ["r"], ["s"], name="cpu_atan"),  # on no target (Sin is, since 1780427)
             helper.make_node("Add", ["s", "B"], ["a"], name="add"),
             helper.make_node("Tanh", ["a"], ["y"], name="tanh")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                      [helper.make_tensor_value_info("y", F32, ["N", 8])],
                      {"W": rng.standard_normal((16, 8)).astype(np.float32),
                       "B": rng.standard_normal((8,)).astype(np.float32)})


def probe(model_path: str, feeds_path: str | None = None, out_path: str | None = None,
          provider_options: dict | None = None) -> None:
    """Child side: create a NpuEP session (no silent CPU retry), optionally run it; print one JSON line.

    Keys: created, error (first line of the exception), assignment, ran, run_error; outputs go to ``out_path``."""
    import json

    from npu_testing import assignment, npu_session

    res: dict = {"created": False, "error": None, "assignment": {}, "ran": False, "run_error": None}
    try:
        sess = npu_session(model_path, provider_options)
        res["created"] = True
        res["assignment"] = assignment(sess)
    except Exception as exc:  # noqa: BLE001 - the point is that it is an exception, not a crash
        res["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        res["error_full"] = str(exc)[:4000]
    if res["created"] and feeds_path:
        feeds = dict(np.load(feeds_path))
        try:
            outs = sess.run(None, feeds)
            res["ran"] = True
            if out_path:
                np.savez(out_path, *outs)
        except Exception as exc:  # noqa: BLE001 - the parent asserts on the error text
            res["run_error"] = f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
    print(json.dumps(res))


def probe_in_child(model_path: str, feeds: dict | None = None, provider_options: dict | None = None, *,
                   tmp_path=None, timeout: float = 120, mem_limit_gb: float | None = 8) -> tuple[Child, dict]:
    """Run ``probe`` in a child with an address-space cap (a hostile model must not allocate terabytes)."""
    import json

    feeds_path = out_path = None
    if feeds is not None:
        feeds_path = os.path.join(str(tmp_path), "feeds.npz")
        np.savez(feeds_path, **feeds)
        out_path = os.path.join(str(tmp_path), "outs.npz")
    limit = ""
    if mem_limit_gb:
        limit = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({int(mem_limit_gb * 2**30)}, "
                 f"{int(mem_limit_gb * 2**30)}))\n")
    child = run_child(limit + f"from _child import probe; probe({model_path!r}, {feeds_path!r}, {out_path!r}, "
                      f"{provider_options!r})", timeout=timeout)
    assert_no_crash(child)
    res = json.loads(child.last_line())
    if res.get("ran") and out_path:
        with np.load(out_path) as z:
            res["outputs"] = [z[f"arr_{i}"] for i in range(len(z.files))]
    return child, res


def probe_batch(model_paths: dict[str, str], *, timeout: float = 300, mem_limit_gb: float = 8) -> dict[str, dict]:
    """``probe`` (create only) for many models in ONE child; a crash fails the batch and names the running case."""
    import json

    code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({int(mem_limit_gb * 2**30)},) * 2)\n"
            "import sys\nfrom _child import probe\n"
            f"for name, path in {model_paths!r}.items():\n"
            "    print('CASE', name, flush=True)\n"
            "    probe(path)\n    sys.stdout.flush()\n")
    child = run_child(code, timeout=timeout)
    assert_no_crash(child)
    assert child.returncode == 0, child.stderr[-3000:]
    results, name = {}, None
    for line in child.stdout.splitlines():
        if line.startswith("CASE "):
            name = line[5:]
        elif line.startswith("{") and name:
            results[name] = json.loads(line)
    return results
