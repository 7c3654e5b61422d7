"""Benchmark INT4 packing: the ``npu-rewrite --passes int4`` CLI vs ORT's ``MatMulNBitsQuantizer``, same model.

Builds a seeded float model (default 12 MatMuls of 3072x3072 fp32 = 113M parameters, 453 MB, saved with
external data like real LLM checkpoints, or ``--inline``), then runs each tool as its own process, alternating:
the CLI exactly as a user runs it, ORT's quantizer loading, processing and saving. Wall time is spawn to exit
(interpreter start, imports and I/O included), peak RSS is that process's ``ru_maxrss``. Prints medians, the
wall ratio and peak RSS / model size against the targets (<= 0.5, <= 1.2), and checks the packed tensors are
bit-identical.

    python -m npu_ep.tools.bench.int4 [--layers 12] [--dim 3072] [--block-size 32] [--asymmetric] [--inline]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from .peak_rss import peak_rss_bytes


def build_model(path: pathlib.Path, layers: int, dim: int, seed: int = 0, inline: bool = False) -> int:
    """Write ``layers`` chained MatMuls of ``dim x dim`` float32 weights; returns the weight bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    cur = "x"
    for i in range(layers):
        w = rng.standard_normal((dim, dim), dtype=np.float32) * np.float32(dim ** -0.5)
        inits.append(numpy_helper.from_array(w, f"layers.{i}.weight"))
        nodes.append(helper.make_node("MatMul", [cur, f"layers.{i}.weight"], [f"h{i}"], name=f"layers.{i}.mm"))
        cur = f"h{i}"
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    if inline:
        onnx.save(model, path)
    else:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    return layers * dim * dim * 4


_ORT_SCRIPT = """
import logging, sys
logging.disable(logging.INFO)
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
quant = MatMulNBitsQuantizer(sys.argv[1], block_size=int(sys.argv[3]), is_symmetric=sys.argv[4] == "1")
quant.process()
quant.model.save_model_to_file(sys.argv[2], use_external_data_format=False)
"""


# what the CLI imports before it reads the model (onnx with ml_dtypes, onnx_ir with sympy, onnxscript, npu_ep)
_IMPORTS = "import npu_ep.tools.npu_rewrite, npu_ep.rewriter.int4"


def _env() -> dict[str, str]:
    """The children import this checkout's ``npu_ep`` whatever the working directory."""
    env = dict(os.environ)
    pkg_parent = str(pathlib.Path(__file__).resolve().parents[3])  # tools/bench/int4.py in the npu_ep folder
    link_parent = str(pathlib.Path(__file__).parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (link_parent, pkg_parent, env.get("PYTHONPATH", "")) if p)
    return env


def _measure(cmd: list[str]) -> dict:
    """Run ``cmd`` as a process: wall time from spawn to exit (interpreter start, imports and I/O included) and
    its own peak RSS (``ru_maxrss`` from ``wait4``; valid only above this process's own peak, which it checks)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=_env())
        _, status, usage = os.wait4(proc.pid, 0)  # reaps the child itself: Popen.wait would lose its rusage
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {tail[-1] if tail else ''}")
    peak = usage.ru_maxrss * 1024
    if peak <= peak_rss_bytes():  # Linux carries the parent's RSS into the child's ru_maxrss (tools/bench/peak_rss.py)
        raise SystemExit(f"{cmd[:4]}: its peak RSS is hidden below this benchmark's own "
                         f"({peak_rss_bytes() >> 20} MiB); use a larger model")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": peak,
            "stdout": stdout}


def _ort_cmd(src: pathlib.Path, dst: pathlib.Path, block_size: int, symmetric: bool) -> list[str]:
    return [sys.executable, "-c", _ORT_SCRIPT, str(src), str(dst), str(block_size), "1" if symmetric else "0"]


def _cli_cmd(src: pathlib.Path, dst: pathlib.Path, block_size: int, symmetric: bool) -> list[str]:
    """``npu-rewrite`` exactly as the console script runs it."""
    return [sys.executable, "-m", "npu_ep.tools.npu_rewrite", str(src), "-o", str(dst), "--passes", "int4",
            "--int4-block-size", str(block_size), "--int4-symmetric" if symmetric else "--int4-asymmetric", "--json"]


def _build(src: pathlib.Path, layers: int, dim: int, inline: bool) -> int:
    code = ("import pathlib, sys; from npu_ep.tools.bench.int4 import build_model; "
            f"print(build_model(pathlib.Path(sys.argv[1]), {layers}, {dim}, inline={inline}))")
    return int(_measure([sys.executable, "-c", code, str(src)])["stdout"].strip().splitlines()[-1])


def _same_tensors(a: pathlib.Path, b: pathlib.Path) -> bool:
    import onnx
    from onnx import numpy_helper

    ta = {t.name: numpy_helper.to_array(t, base_dir=str(a.parent)) for t in onnx.load(str(a)).graph.initializer}
    tb = {t.name: numpy_helper.to_array(t, base_dir=str(b.parent)) for t in onnx.load(str(b)).graph.initializer}
    return ta.keys() == tb.keys() and all(ta[k].dtype == tb[k].dtype and ta[k].tobytes() == tb[k].tobytes()
                                          for k in ta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.int4", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=3072)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--asymmetric", action="store_true")
    ap.add_argument("--inline", action="store_true", help="weights inside the .onnx instead of an external file")
    ap.add_argument("--repeats", type=int, default=3, help="runs per tool, alternating; medians are reported")
    args = ap.parse_args(argv)
    symmetric = not args.asymmetric

    with tempfile.TemporaryDirectory(prefix="bench_int4_") as tmp:
        tmp = pathlib.Path(tmp)
        src = tmp / "model.onnx"
        size = _build(src, args.layers, args.dim, args.inline)
        params = args.layers * args.dim * args.dim
        print(f"model: {args.layers} MatMuls of {args.dim}x{args.dim} fp32 = {params / 1e6:.1f}M parameters, "
              f"{size / 1e6:.0f} MB {'inline' if args.inline else 'in an external data file'}; block "
              f"{args.block_size}, {'symmetric' if symmetric else 'asymmetric'}; {args.repeats} runs each")
        runs: dict[str, list[dict]] = {"ort": [], "cli": [], "imports": []}
        for _ in range(args.repeats):  # alternating, so a change in host load hits both tools
            time.sleep(0.25)
            runs["ort"].append(_measure(_ort_cmd(src, tmp / "ort.onnx", args.block_size, symmetric)))
            time.sleep(0.25)
            runs["cli"].append(_measure(_cli_cmd(src, tmp / "ours.onnx", args.block_size, symmetric)))
            time.sleep(0.25)
            runs["imports"].append(_measure([sys.executable, "-c", _IMPORTS]))
        identical = _same_tensors(tmp / "ours.onnx", tmp / "ort.onnx")
    med = {tool: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu_seconds", "peak_rss_bytes")}
           for tool, rs in runs.items()}
    wall = med["cli"]["seconds"] / med["ort"]["seconds"]
    rss = med["cli"]["peak_rss_bytes"] / size
    for tool, label in (("ort", "MatMulNBitsQuantizer"), ("cli", "npu-rewrite CLI     ")):
        walls = ", ".join(f"{r['seconds']:.2f}" for r in runs[tool])
        print(f"{label}: wall {med[tool]['seconds']:6.2f} s (runs {walls}), CPU {med[tool]['cpu_seconds']:5.2f} s, "
              f"peak RSS {med[tool]['peak_rss_bytes'] / 1e6:6.0f} MB = {med[tool]['peak_rss_bytes'] / size:.2f}x model")
    imp = med["imports"]
    print(f"of which the CLI's imports alone (a process that only imports it): wall {imp['seconds']:.2f} s, "
          f"CPU {imp['cpu_seconds']:.2f} s = {imp['seconds'] / med['ort']['seconds']:.2f}x ORT's wall")
    print(f"wall ratio npu-rewrite / ORT (whole processes): {wall:.2f}  (target <= 0.5); CPU-time ratio "
          f"{med['cli']['cpu_seconds'] / med['ort']['cpu_seconds']:.2f}")
    print(f"peak RSS / model size, npu-rewrite: {rss:.2f}  (target <= 1.2)")
    print(f"packed tensors bit-identical: {identical}")
    return 0 if wall <= 0.5 and rss <= 1.2 and identical else 1


if __name__ == "__main__":
    sys.exit(main())
