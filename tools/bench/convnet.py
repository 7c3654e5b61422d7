"""Conv-net benchmark: host wall time of whole CNNs on NpuEP vs ORT's CPU EP, fp32 and QDQ u8s8.

    python -m npu_ep.tools.bench.convnet [--reps 10] [--rounds 3] [--only small|det] [--kernels native|reference]
                                         [--host-threads N] [--npu-no-spin]

Models (issue 12 target: <= 1.5x the CPU EP for each):
- ``small``: conv/relu/maxpool x3 + Gemm at 1x3x64x64, built here with the onnx helper (random weights);
- ``det``: the real PP-OCRv4 DBNet text detector from ``models/corpus.py`` (rapidocr-onnxruntime) at 640x640
  on a synthetic text page; skipped with a note when the package is not installed.
Each comes in fp32 and as QDQ from ORT's own ``quantize_static`` (uint8 activations, per-channel int8 weights,
calibrated on a few generated inputs of the model's size).

Both EPs run in this process on the same inputs with default session options (NpuEP with its defaults too). The
EPs alternate in timed blocks of ``--reps`` runs for ``--rounds`` rounds (the machine is shared; its load moves
timings by 2-4x), each block after a 0.25 s pause so it does not pay for the other EP's spinning threads; the
numbers are medians over all runs of each EP. The NpuEP column also gives the fraction of the optimized graph's
nodes that ORT assigned to NpuEP and the partition count, read from ORT's own graph assignment record (a model
with no node on NpuEP is an error: ORT would silently have run it on the CPU).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import logging
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SETTLE_S = 0.25  # ORT's intra-op workers spin ~50 ms after a run; each timed block starts after this pause


def small_net(seed: int = 0) -> onnx.ModelProto:
    """x[1,3,64,64] -> (Conv 3x3 pad 1 -> Relu -> MaxPool 2x2) x3 (16, 32, 64 channels) -> Flatten -> Gemm 10."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    chans = [3, 16, 32, 64]
    for i in range(3):
        w = rng.normal(0, (2.0 / (9 * chans[i])) ** 0.5, (chans[i + 1], chans[i], 3, 3)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, chans[i + 1]).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], name=f"pool{i}", kernel_shape=[2, 2],
                                   strides=[2, 2])]
        prev = f"p{i}"
    inits += [numpy_helper.from_array(rng.normal(0, 0.02, (10, 64 * 8 * 8)).astype(np.float32), "wf"),
              numpy_helper.from_array(np.zeros(10, np.float32), "bf")]
    nodes += [helper.make_node("Flatten", [prev], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


class _Calibration:
    """quantize_static's CalibrationDataReader over a fixed list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def quantize_qdq(src: str, dst: str, calibration: list[dict[str, np.ndarray]]) -> None:
    """ORT's quantize_static, QDQ format: uint8 activations, per-channel int8 weights."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer warns per BatchNorm-fed bias and suggests pre-processing
    try:
        quantize_static(src, dst, _Calibration(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def models(workdir: str, only: str | None) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    """(label, model path, feeds) per benchmarked model; QDQ variants quantized into ``workdir``."""
    rng = np.random.default_rng(0)
    out = []
    if only in (None, "small"):
        path = os.path.join(workdir, "small.onnx")
        onnx.save(small_net(), path)
        calib = [{"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(4)]
        quantize_qdq(path, os.path.join(workdir, "small.qdq.onnx"), calib)
        feeds = {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
        out += [("small conv net 64x64 fp32", path, feeds),
                ("small conv net 64x64 QDQ u8s8", os.path.join(workdir, "small.qdq.onnx"), feeds)]
    if only in (None, "det"):
        from ...models.corpus import _text_image, by_name

        det = by_name("ocr-det")
        path = det.path()
        if path is None:
            print(f"(skipped the PP-OCRv4 detector: package {det.package} is not installed)")
        else:
            calib = [{"x": _text_image(np.random.default_rng(s), 640, 640)} for s in (1, 2, 3)]
            qpath = os.path.join(workdir, "det.qdq.onnx")
            quantize_qdq(str(path), qpath, calib)
            feeds = {"x": _text_image(rng, 640, 640)}
            out += [("PP-OCRv4 det 640x640 fp32", str(path), feeds),
                    ("PP-OCRv4 det 640x640 QDQ u8s8", qpath, feeds)]
    return out


def npu_session(path: str, kernels: str, host_threads: int | None = None, no_spin: bool = False
                ) -> tuple[ort.InferenceSession, float, int]:
    """A NpuEP session (CPU EP behind it for what NpuEP declines), the fraction of nodes ORT assigned to NpuEP,
    and NpuEP's partition count."""

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if no_spin:  # ORT's intra-op workers otherwise spin after each parallel section NpuEP's kernels hand them
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options = {"cache_dir": "", "kernels": kernels}
    if host_threads is not None:
        options["host_threads"] = str(host_threads)
    sess = ort.InferenceSession(path, so, enable_fallback=0,
                                providers=[(get_ep_name(), options), "CPUExecutionProvider"])
    counts: dict[str, int] = {}
    parts = 0
    for sg in sess.get_provider_graph_assignment_info():
        counts[sg.ep_name] = counts.get(sg.ep_name, 0) + len(sg.get_nodes())
        parts += sg.ep_name == get_ep_name()
    on_npu = counts.get(get_ep_name(), 0)
    if not on_npu:
        raise RuntimeError(f"{path}: ORT assigned no node to NpuEP ({counts})")
    return sess, on_npu / sum(counts.values()), parts


def _block(fn, reps: int) -> list[float]:
    time.sleep(SETTLE_S)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def measure(path: str, feeds: dict[str, np.ndarray], reps: int, rounds: int, kernels: str,
            host_threads: int | None = None, no_spin: bool = False) -> tuple[float, float, float, int, float]:
    """(NpuEP ms, CPU EP ms, fraction on NpuEP, NpuEP partitions, max |NpuEP - CPU EP| of the first output)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    cpu = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    npu, frac, parts = npu_session(path, kernels, host_threads, no_spin)
    run_npu, run_cpu = (lambda: npu.run(None, feeds)), (lambda: cpu.run(None, feeds))
    diff = float(np.max(np.abs(run_npu()[0].astype(np.float64) - run_cpu()[0].astype(np.float64))))
    t_npu, t_cpu = [], []
    for _ in range(rounds):
        t_npu += _block(run_npu, reps)
        t_cpu += _block(run_cpu, reps)
    return statistics.median(t_npu) * 1e3, statistics.median(t_cpu) * 1e3, frac, parts, diff


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10, help="runs per timed block")
    ap.add_argument("--rounds", type=int, default=3, help="alternating NpuEP / CPU EP blocks")
    ap.add_argument("--only", choices=("small", "det"), default=None)
    ap.add_argument("--kernels", choices=("native", "reference"), default="native")
    ap.add_argument("--host-threads", type=int, default=None,
                    help="NpuEP's host_threads option (default: NpuEP's default, 2)")
    ap.add_argument("--npu-no-spin", action="store_true",
                    help="the NpuEP session only: session.intra_op.allow_spinning=0 (the CPU EP keeps the default)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npu_convnet_") as workdir:
        cases = models(workdir, args.only)
        print(f"host wall time, median of {args.rounds} x {args.reps} alternating runs, NpuEP kernels={args.kernels} "
              f"host_threads={args.host_threads or 'default'}{' allow_spinning=0' if args.npu_no_spin else ''} "
              f"(load average "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())})")
        print(f"{'model':32} {'NpuEP ms':>9} {'CPU EP ms':>9} {'NpuEP/CPU':>9} {'on NpuEP':>8} {'parts':>5} "
              f"{'max|diff|':>9}")
        for label, path, feeds in cases:
            npu, cpu, frac, parts, diff = measure(path, feeds, args.reps, args.rounds, args.kernels,
                                                  args.host_threads, args.npu_no_spin)
            print(f"{label:32} {npu:9.2f} {cpu:9.2f} {npu / cpu:9.2f} {frac:8.1%} {parts:5d} {diff:9.2e}",
                  flush=True)
        print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
