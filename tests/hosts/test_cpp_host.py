"""NpuEP in a C++ host (tests/hosts/host.cc): ORT's C API with the onnxruntime wheel's libonnxruntime, registration
of ``npu_ep.get_plugin_library_path()`` (the loader that starts Python itself), the V2 append, and outputs bitwise
equal to the Python host's. The host's own ORT profile proves NpuEP ran nodes (the C API of ORT 1.23 has no graph
assignment record); the Python side proves it with ``npu_partitions``.

Before the loader existed, registering the plugin in such a host failed with ``undefined symbol:
PyInstanceMethod_Type`` (``test_the_python_extension_alone_cannot_load_there`` keeps that fact visible).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, TensorProto, helper

import npu_ep
from tests.hosts.cpp_host import build_host, run_host, write_steps
from tests.npu_testing import assignment, make_model, npu_partitions, npu_session

EP_OPTIONS = ("--ep-option", "cache_dir=")  # the Python side passes {"cache_dir": ""} too: no compiled-context cache
F32 = TensorProto.FLOAT


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    try:
        return build_host(tmp_path_factory.mktemp("cpp_host"))
    except FileNotFoundError as exc:
        pytest.skip(f"cannot build the C++ host: {exc}")


def _npu_profile_nodes(profile) -> list[str]:
    """Names of the nodes ORT's profile says NpuEP ran."""
    events = json.loads(profile.read_text())
    return [e["name"] for e in events if e.get("cat") == "Node" and e.get("args", {}).get("provider") == "NpuEP"]


def _mlp() -> ModelProto:
    rng = np.random.default_rng(7)
    inits = {"w1": rng.standard_normal((64, 96)).astype(np.float32), "b1": rng.standard_normal(96).astype(np.float32),
             "w2": rng.standard_normal((96, 32)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 64])],
                      [helper.make_tensor_value_info("y", F32, ["n", 32])], inits)


def _assert_bitwise(cpp: dict[str, np.ndarray], python: dict[str, np.ndarray], where: str) -> None:
    assert list(cpp) == list(python), where
    for name, value in python.items():
        assert cpp[name].dtype == value.dtype and cpp[name].shape == value.shape, f"{where}: {name}"
        assert cpp[name].tobytes() == value.tobytes(), f"{where}: output {name} differs from the Python host's"


def test_mlp_matches_python_host_with_two_threads_and_reregistration(host, tmp_path):
    model = _mlp()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (expected,) = sess.run(None, {"x": x})

    run = run_host(host, npu_ep.get_plugin_library_path(), path, write_steps(tmp_path / "io", [{"x": x}]),
                   *EP_OPTIONS, "--threads", "2", "--repeat", "25", "--reregister", "--profile", str(tmp_path / "p"))
    assert run.returncode == 0, run.stderr
    for round_ in (0, 1):  # registered, unregistered and registered again: the interpreter is reused
        for thread in (0, 1):  # two host threads, each with its own session, concurrently
            _assert_bitwise(run.outputs(0, round_, thread), {"y": expected}, f"round {round_} thread {thread}")
    assert sorted(_npu_profile_nodes(run.profile())) != [], "ORT's profile shows no node run by NpuEP"


@pytest.mark.parametrize("name", ["ocr-cls", "vad"])
def test_corpus_model_matches_python_host(host, tmp_path, name):
    from npu_ep.models.corpus import by_name

    real = by_name(name)
    path = real.path()
    if path is None:
        pytest.skip(f"{real.package} is not installed (./run installs the corpus)")
    sess = npu_session(str(path))
    assert npu_partitions(sess), f"NpuEP took no node of {name} in the Python host"
    feeds = real.feeds(np.random.default_rng(0))
    names = [o.name for o in sess.get_outputs()]
    steps, expected = [], []
    for _ in range(2 if real.state else 1):  # a stream carries its state from one call to the next
        outs = dict(zip(names, sess.run(None, feeds)))
        steps.append(dict(feeds))
        expected.append(outs)
        feeds = {**feeds, **{inp: outs[out] for out, inp in real.state}}

    run = run_host(host, npu_ep.get_plugin_library_path(), path, write_steps(tmp_path / "io", steps), *EP_OPTIONS,
                   "--profile", str(tmp_path / "p"))
    assert run.returncode == 0, run.stderr
    for k, outs in enumerate(expected):
        _assert_bitwise(run.outputs(k), outs, f"{name} step {k}")
    assert _npu_profile_nodes(run.profile()), "ORT's profile shows no node run by NpuEP"


def test_demo_model_generates_the_python_hosts_tokens(host, tmp_path):
    """The demo's rewritten tiny Llama: every step the Python Generator ran (prefill, then decode with the KV cache
    it fed back) replayed in the C++ host gives bitwise the same outputs, hence the same greedy tokens.

    The Generator runs in the copying mode (``kv_in_place=False``): its default, the KV resident in place, binds
    past and present to one buffer through IOBinding across runs, and the C++ host replays feeds from files with
    ``Run`` (no IOBinding, no buffer kept between steps), so only the copying mode's steps are replayable there."""
    from npu_ep.models.tiny_llama import build_tiny_llama
    from npu_ep.tools.demo import rewrite_available
    from npu_ep.tools.generation import Generator

    model = tmp_path / "tiny_llama.npu.onnx"
    rewrite_available(build_tiny_llama(tmp_path / "tiny_llama.onnx"), model)
    gen = Generator(model, providers=[(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"],
                    kv_in_place=False)
    steps, news = [], []
    run_step, step = gen._runner.run, gen._step

    def recording_run(feeds):
        outs, host_s, npu_s = run_step(feeds)
        steps.append(({k: np.array(v) for k, v in feeds.items()}, outs))
        return outs, host_s, npu_s

    def recording_step(cache, tokens, executed, kind):
        news.append(len(tokens))
        return step(cache, tokens, executed, kind)

    gen._runner.run, gen._step = recording_run, recording_step
    result = gen.generate([1, 5, 6, 7, 8, 9], 6)
    assert result.kv_decode["mode"] == "copying"
    assert len(steps) == len(news) == 1 + 5, "a prefill and a decode step per further token, each through Run"

    run = run_host(host, npu_ep.get_plugin_library_path(), model,
                   write_steps(tmp_path / "io", [feeds for feeds, _ in steps]), *EP_OPTIONS)
    assert run.returncode == 0, run.stderr
    tokens = []
    for k, ((_, outs), new) in enumerate(zip(steps, news)):
        cpp = run.outputs(k)
        _assert_bitwise(cpp, outs, f"demo step {k}")
        tokens.append(int(np.argmax(cpp["logits"][0, new - 1])))
    assert tokens[-len(result.tokens):] == result.tokens


def test_registration_errors_are_one_status_naming_what_is_missing(host, tmp_path):
    model = tmp_path / "mlp.onnx"
    model.write_bytes(_mlp().SerializeToString())
    io = write_steps(tmp_path / "io", [{"x": np.zeros((1, 64), np.float32)}])
    lib = npu_ep.get_plugin_library_path()

    run = run_host(host, lib, model, io, env={"NPU_EP_PYTHON": "/nonexistent/bin/python"})
    assert run.returncode == 3, run.stderr  # an ORT error status, not a crash
    assert "no Python found: /nonexistent/bin/python (from NPU_EP_PYTHON)" in run.stderr

    base_python = os.path.join(sys.base_prefix, "bin", "python3")  # the venv's base interpreter: no npu_ep there
    if sys.prefix != sys.base_prefix and os.path.isfile(base_python):
        run = run_host(host, lib, model, io, env={"NPU_EP_PYTHON": base_python})
        assert run.returncode == 3, run.stderr
        assert "cannot import npu_ep.ep.entry_points (ModuleNotFoundError" in run.stderr

    other = [p for p in ("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0",) if os.path.isfile(p)]
    if other:
        run = run_host(host, lib, model, io, env={"NPU_EP_LIBPYTHON": other[0]})
        assert run.returncode == 3, run.stderr
        assert "NpuEP was built for Python 3.11 but the libpython found is 3.12" in run.stderr


def test_the_python_extension_alone_cannot_load_there(host, tmp_path):
    """Why the loader exists: the extension's Py* symbols come from a Python process."""
    model = tmp_path / "mlp.onnx"
    model.write_bytes(_mlp().SerializeToString())
    io = write_steps(tmp_path / "io", [{"x": np.zeros((1, 64), np.float32)}])
    run = run_host(host, npu_ep.get_library_path(), model, io)
    assert run.returncode == 3 and "undefined symbol: Py" in run.stderr


def _python_us_per_run(sess: ort.InferenceSession, feeds, n: int) -> float:
    for _ in range(200):
        sess.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t0) / n * 1e6


def test_run_overhead_of_the_cpp_host_against_the_python_host(host, tmp_path, capsys):
    """Printed, not asserted (2 shared cores): the time per session.run on NpuEP of a one-node model in the C++ host
    against the Python host, and over the CPU EP's in each. A C++ host thread keeps one Python thread state, so each
    run only takes the GIL (embedded_python.cc)."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [helper.make_tensor_value_info("x", F32, [1, 16])],
                       [helper.make_tensor_value_info("y", F32, [1, 16])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.arange(16, dtype=np.float32).reshape(1, 16) - 8
    n = 5000
    io = write_steps(tmp_path / "io", [{"x": x}])
    lib = npu_ep.get_plugin_library_path()
    npu = npu_session(model, cpu=False)
    assert npu_partitions(npu) == [["relu"]]
    cpu_sess = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"])
    cpp: dict[str, float] = {}
    py: dict[str, float] = {}
    for _ in range(3):  # alternating, the best of three: the machine is shared
        for ep, extra in (("npu", EP_OPTIONS), ("cpu", ("--cpu-only",))):
            run = run_host(host, lib, path, io, *extra, "--bench", str(n))
            assert run.returncode == 0, run.stderr
            us = float(next(ln.split()[2] for ln in run.stdout.splitlines() if ln.startswith("bench ")))
            cpp[ep] = min(cpp.get(ep, us), us)
        for ep, sess in (("npu", npu), ("cpu", cpu_sess)):
            us = _python_us_per_run(sess, {"x": x}, n)
            py[ep] = min(py.get(ep, us), us)
    with capsys.disabled():
        print(f"\n[run overhead, one Relu, best of 3 x {n} runs] per session.run on NpuEP: C++ host "
              f"{cpp['npu']:.2f} us, Python host {py['npu']:.2f} us (C++ - Python {cpp['npu'] - py['npu']:+.2f} us, "
              "target <= +2 us); "
              f"over the CPU EP in the same host: C++ +{cpp['npu'] - cpp['cpu']:.2f} us (CPU EP {cpp['cpu']:.2f} us), "
              f"Python +{py['npu'] - py['cpu']:.2f} us (CPU EP {py['cpu']:.2f} us)")


def test_a_loader_outside_the_environment_it_finds_refuses(host, tmp_path):
    """A copy of the libraries whose environment imports npu_ep from elsewhere (two _native copies would not share
    the plugin's state): one status naming both installs, no crash."""
    import shutil

    copy = tmp_path / "copy"
    copy.mkdir()
    for lib in (npu_ep.get_plugin_library_path(), npu_ep.get_library_path()):
        shutil.copy(lib, copy)
    model = tmp_path / "mlp.onnx"
    model.write_bytes(_mlp().SerializeToString())
    io = write_steps(tmp_path / "io", [{"x": np.zeros((1, 64), np.float32)}])
    run = run_host(host, str(copy / "libnpu_ep_plugin.so"), model, io, env={"NPU_EP_PYTHON": sys.executable})
    assert run.returncode == 3, run.stderr
    assert f"imports npu_ep from another install ({npu_ep.get_library_path()}" in run.stderr


def test_the_embedded_interpreter_leaves_the_onnxruntime_python_package_alone(host, tmp_path):
    """In a C++ host, ``import npu_ep`` must not register the plugin with the onnxruntime Python package's runtime
    (a second ORT in the process). Here any import of that package fails (a sitecustomize the embedded interpreter
    runs): registration and the run still succeed, so nothing imported it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['onnxruntime'] = None\n")
    model = tmp_path / "mlp.onnx"
    model.write_bytes(_mlp().SerializeToString())
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    (expected,) = npu_session(_mlp(), cpu=False).run(None, {"x": x})
    run = run_host(host, npu_ep.get_plugin_library_path(), model, write_steps(tmp_path / "io", [{"x": x}]),
                   *EP_OPTIONS, env={"PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr
    _assert_bitwise(run.outputs(0), {"y": expected}, "without the onnxruntime Python package")
