"""Run NpuEP on several onnxruntime (and onnx/onnxscript/onnx-ir) versions, each in its own virtual environment.

``python -m npu_ep.tools.version_matrix --wheel dist/npu_ep-*.whl [--set NAME=pkg==ver,pkg==ver ...]`` makes one venv
per set under ``--workdir`` (default /tmp/npu_ep_matrix; kept and reused), installs the wheel with the set's pins
(pip resolves them against pyproject.toml's ranges, so an out-of-range pin fails loudly), then runs ``--check`` in
it: the demo (tiny Llama rewritten, greedy tokens on NpuEP against the CPU EP), a QDQ MLP quantized by ORT's
own ``quantize_static`` (NpuEP's outputs against the CPU EP's) and an If whose branches read the outer graph
(claimed whole by NpuEP; onnxruntime before 1.27 hands the fused node none of those outer values). It prints one
line per set and a verdict: every set must give the CPU EP's tokens and If output, and the same tokens and the same
NpuEP QDQ output bytes as every other set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# The lowest versions pyproject.toml declares, the versions the project was developed on, and the newest published
# when this was written. --set replaces them.
DEFAULT_SETS = {
    "lowest": "onnxruntime==1.27.0,onnx==1.19.0,onnxscript==0.5.4,onnx-ir==0.1.12",
    "dev": "onnxruntime==1.31.1,onnx==1.23.2,onnxscript==0.7.2,onnx-ir==1.1.0",
    "newest": "onnxruntime==1.32.0",
}
PROMPT = (1, 5, 6, 7, 8, 9)
NEW_TOKENS = 8


def _qdq_mlp(folder: Path) -> Path:
    """A float MLP quantized to QDQ (uint8 activations, per-channel int8 weights) by ORT's quantizer."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.2, n)
             for n, s in (("w1", (32, 64)), ("b1", (64,)), ("w2", (64, 16)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    src, dst = folder / "mlp.onnx", folder / "mlp.qdq.onnx"
    onnx.save(model, src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal((4, 32)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return dst


def _if_model(folder: Path) -> Path:
    """An If whose branches read an input of the outer graph no outer node reads (as in Silero VAD): NpuEP claims it
    whole."""
    import onnx
    from onnx import TensorProto, helper

    def branch(name: str, op: str):
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4, 8])])

    nodes = [helper.make_node("Not", ["cond"], ["flip"]),  # x is read only inside the branches
             helper.make_node("If", ["flip"], ["y"], then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg"))]
    graph = helper.make_graph(nodes, "if_outer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                                                  helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = folder / "if_outer.onnx"
    onnx.save(model, path)
    return path


def _nodes_on_npu(session) -> int | str:
    """How many nodes ORT placed on NpuEP, or why this onnxruntime cannot say."""
    if not hasattr(session, "get_provider_graph_assignment_info"):
        return "unknown: this onnxruntime has no get_provider_graph_assignment_info"
    return sum(len(sg.get_nodes()) for sg in session.get_provider_graph_assignment_info() if sg.ep_name == "NpuEP")


def check() -> dict:
    """Run inside one environment: the demo's generation and the QDQ MLP, on NpuEP and on the CPU EP."""
    import numpy as np
    import onnxruntime as ort

    from npu_ep.models.tiny_llama import build_tiny_llama
    from npu_ep.tools.demo import rewrite_available
    from npu_ep.tools.generation import Generator

    out: dict = {"onnxruntime": ort.__version__, "npu_ep": str(Path(__file__).resolve().parents[1] / "__init__.py")}
    for dist in ("onnx", "onnxscript", "onnx-ir", "numpy"):
        from importlib.metadata import version

        out[dist] = version(dist)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = folder / "tiny_llama.npu.onnx"
        rewrite_available(build_tiny_llama(folder / "tiny_llama.onnx"), model)
        npu = Generator(model, providers=[("NpuEP", {"cache_dir": ""}), "CPUExecutionProvider"])
        tokens = npu.generate(list(PROMPT), NEW_TOKENS).tokens
        cpu = Generator(model, providers=["CPUExecutionProvider"]).generate(list(PROMPT), NEW_TOKENS).tokens
        out["demo"] = {"tokens": tokens, "cpu_tokens": cpu, "nodes_on_npu": _nodes_on_npu(npu.session)}

        qdq = _qdq_mlp(folder)
        x = np.random.default_rng(5).standard_normal((4, 32)).astype(np.float32)
        so = ort.SessionOptions()
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sess = ort.InferenceSession(str(qdq), sess_options=so, providers=[("NpuEP", {"cache_dir": ""})],
                                    enable_fallback=0)
        (y,) = sess.run(None, {"x": x})
        (ref,) = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        out["qdq"] = {"sha256": hashlib.sha256(y.tobytes()).hexdigest()[:16], "nodes_on_npu": _nodes_on_npu(sess),
                      "max_abs_diff_vs_cpu": float(np.abs(y - ref).max()),
                      "identical_to_cpu": bool(y.tobytes() == ref.tobytes())}
        model = _if_model(folder)
        feeds = {"x": np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8), "cond": np.array(False)}
        try:
            sess = ort.InferenceSession(str(model), sess_options=so, providers=[("NpuEP", {"cache_dir": ""})],
                                        enable_fallback=0)
            (y,) = sess.run(None, feeds)
            (ref,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
            out["if"] = {"identical_to_cpu": bool(y.tobytes() == ref.tobytes()), "nodes_on_npu": _nodes_on_npu(sess)}
        except Exception as exc:  # noqa: BLE001 - reported per set: which runtimes cannot run a claimed If
            out["if"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def _venv(folder: Path, wheel: Path, pins: Sequence[str]) -> Path:
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--only-binary=:all:", "--force-reinstall",
                           "--no-deps", str(wheel)], capture_output=True, text=True)
    if proc.returncode == 0:  # then its dependencies, with the set's pins, resolved against the wheel's ranges
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--only-binary=:all:", str(wheel), *pins],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(pins)} failed in {folder}:\n{proc.stderr[-2000:]}")
    return python


def run_set(name: str, pins: Sequence[str], wheel: Path, workdir: Path) -> dict:
    t0 = time.perf_counter()
    try:
        python = _venv(workdir / name, wheel, pins)
    except RuntimeError as exc:
        return {"set": name, "pins": list(pins), "error": str(exc)}
    proc = subprocess.run([str(python), "-m", "npu_ep.tools.version_matrix", "--check"], capture_output=True,
                          text=True, cwd=workdir)  # outside any checkout: the wheel's npu_ep is the one imported
    result = {"set": name, "pins": list(pins), "seconds": round(time.perf_counter() - t0, 1)}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-3000:]
        return result
    result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return result


def verdict(results: Sequence[dict]) -> list[str]:
    """What is wrong across the sets (empty: all good)."""
    problems = [f"{r['set']}: {r['error'].strip().splitlines()[-1]}" for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    for r in ok:
        if r["demo"]["tokens"] != r["demo"]["cpu_tokens"]:
            problems.append(f"{r['set']}: NpuEP tokens {r['demo']['tokens']} != CPU EP {r['demo']['cpu_tokens']}")
    if len({tuple(r["demo"]["tokens"]) for r in ok}) > 1:
        problems.append("the demo's tokens differ between sets")
    if len({r["qdq"]["sha256"] for r in ok}) > 1:
        problems.append("NpuEP's QDQ outputs differ between sets")
    for r in ok:
        if "error" in r["if"] or not r["if"]["identical_to_cpu"]:
            problems.append(f"{r['set']}: If with outer-scope reads: {r['if'].get('error', 'differs from the CPU EP')}")
    return problems


def _if_summary(result: dict) -> str:
    if "error" in result:
        return "ERROR " + result["error"][:160]
    return f"{'=' if result['identical_to_cpu'] else '!='} CPU EP, {result['nodes_on_npu']} nodes on NpuEP"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.version_matrix", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="run the checks in this environment, print JSON")
    ap.add_argument("--wheel", type=Path, help="the npu-ep wheel to install (pip wheel . --no-deps -w dist)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=PINS",
                    help="a version set, e.g. lowest=onnxruntime==1.23.0,onnx==1.19.0 (repeatable)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "npu_ep_matrix")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.check:
        print(json.dumps(check()))
        return 0
    if args.wheel is None or not args.wheel.is_file():
        ap.error("--wheel must name a built npu-ep wheel")
    sets = dict(s.split("=", 1) for s in args.set) if args.set else DEFAULT_SETS
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for name, pins in sets.items():
        r = run_set(name, [p for p in pins.split(",") if p], args.wheel.resolve(), args.workdir)
        results.append(r)
        if "error" in r:
            print(f"{name:8s} {','.join(r['pins'])}: ERROR {r['error'].strip().splitlines()[-1]}", flush=True)
        else:
            d, q = r["demo"], r["qdq"]
            same = "=" if d["tokens"] == d["cpu_tokens"] else "!="
            print(f"{name:8s} onnxruntime {r['onnxruntime']}, onnx {r['onnx']}, onnxscript {r['onnxscript']}, "
                  f"onnx-ir {r['onnx-ir']}: demo tokens {d['tokens']} ({same}"
                  f" CPU EP, {d['nodes_on_npu']} nodes on NpuEP); QDQ {q['sha256']} ({q['nodes_on_npu']} nodes on "
                  f"NpuEP, max |diff| vs CPU EP {q['max_abs_diff_vs_cpu']:.3g}); If: {_if_summary(r['if'])}; "
                  f"{r['seconds']} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    problems = verdict(results)
    print("verdict: " + ("all sets agree" if not problems else "; ".join(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
