"""Benchmark INT4 packing: ``npu-rewrite --passes int4`` vs ORT's ``MatMulNBitsQuantizer`` on the same model.

Builds a seeded float model (default 12 MatMuls of 3072x3072 fp32 = 113M parameters, 453 MB, saved with
external data like real LLM checkpoints), runs each tool in its own subprocess (so peak RSS is per tool:
``ru_maxrss`` of that child), checks the packed tensors are bit-identical, and prints wall-time ratio and peak RSS.

    python -m npu_ep.tools.bench_int4 [--layers 12] [--dim 3072] [--block-size 32] [--asymmetric]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def build_model(path: pathlib.Path, layers: int, dim: int, seed: int = 0) -> int:
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
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=1024)
    return layers * dim * dim * 4


def _child(tool: str, src: str, dst: str, block_size: int, symmetric: bool) -> None:
    """Run one tool in this (child) process and print its wall time and peak RSS as JSON."""
    t0 = time.perf_counter()
    if tool == "build":
        layers, dim = (int(v) for v in dst.split("x"))
        print(json.dumps({"bytes": build_model(pathlib.Path(src), layers, dim)}))
        return
    if tool == "npu-rewrite":
        from npu_ep.tools.npu_rewrite import main

        argv = [src, "-o", dst, "--passes", "int4", "--int4-block-size", str(block_size), "--json",
                "--int4-symmetric" if symmetric else "--int4-asymmetric"]
        with open(os.devnull, "w") as devnull:
            stdout, sys.stdout = sys.stdout, devnull
            try:
                code = main(argv)
            finally:
                sys.stdout = stdout
        if code != 0:
            raise SystemExit(f"npu-rewrite exited with {code}")
    else:
        import logging

        logging.disable(logging.INFO)
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quant = MatMulNBitsQuantizer(src, block_size=block_size, is_symmetric=symmetric)
        quant.process()
        quant.model.save_model_to_file(dst, use_external_data_format=False)
    seconds = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_kb * 1024}))


def _run_child(tool: str, src: pathlib.Path, dst: pathlib.Path, block_size: int, symmetric: bool,
               extra: list[str] | None = None) -> dict:
    """Run ``--child`` in a fresh interpreter. The parent stays small (the model is built in a child too), since
    Linux carries ``ru_maxrss`` across fork+exec."""
    import npu_ep

    env = dict(os.environ)
    pkg_parent = str(pathlib.Path(npu_ep.__file__).resolve().parent.parent)
    link_parent = str(pathlib.Path(npu_ep.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (link_parent, pkg_parent, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "npu_ep.tools.bench_int4", "--child", tool, str(src), str(dst),
           "--block-size", str(block_size)] + ([] if symmetric else ["--asymmetric"]) + (extra or [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _same_tensors(a: pathlib.Path, b: pathlib.Path) -> bool:
    import onnx
    from onnx import numpy_helper

    ta = {t.name: numpy_helper.to_array(t, base_dir=str(a.parent)) for t in onnx.load(str(a)).graph.initializer}
    tb = {t.name: numpy_helper.to_array(t, base_dir=str(b.parent)) for t in onnx.load(str(b)).graph.initializer}
    return ta.keys() == tb.keys() and all(ta[k].dtype == tb[k].dtype and ta[k].tobytes() == tb[k].tobytes()
                                          for k in ta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_int4", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=3072)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--asymmetric", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("TOOL", "SRC", "DST"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    symmetric = not args.asymmetric
    if args.child:
        _child(args.child[0], args.child[1], args.child[2], args.block_size, symmetric)
        return 0

    with tempfile.TemporaryDirectory(prefix="bench_int4_") as tmp:
        tmp = pathlib.Path(tmp)
        src = tmp / "model.onnx"
        size = _run_child("build", src, f"{args.layers}x{args.dim}", args.block_size, symmetric)["bytes"]
        params = args.layers * args.dim * args.dim
        print(f"model: {args.layers} MatMuls of {args.dim}x{args.dim} fp32 = {params / 1e6:.1f}M parameters, "
              f"{size / 1e6:.0f} MB; block {args.block_size}, {'symmetric' if symmetric else 'asymmetric'}")
        ort_res = _run_child("ort", src, tmp / "ort.onnx", args.block_size, symmetric)
        ours = _run_child("npu-rewrite", src, tmp / "ours.onnx", args.block_size, symmetric)
        identical = _same_tensors(tmp / "ours.onnx", tmp / "ort.onnx")
    ratio = ours["seconds"] / ort_res["seconds"]
    print(f"MatMulNBitsQuantizer : {ort_res['seconds']:7.2f} s, peak RSS {ort_res['peak_rss_bytes'] / 1e6:7.0f} MB "
          f"({ort_res['peak_rss_bytes'] / size:.2f}x model)")
    print(f"npu-rewrite int4     : {ours['seconds']:7.2f} s, peak RSS {ours['peak_rss_bytes'] / 1e6:7.0f} MB "
          f"({ours['peak_rss_bytes'] / size:.2f}x model)")
    print(f"wall-time ratio (npu-rewrite / ORT): {ratio:.2f}  (target <= 1.0)")
    print(f"packed tensors bit-identical: {identical}")
    ok = ratio <= 1.0 and ours["peak_rss_bytes"] <= 2 * size and identical
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
