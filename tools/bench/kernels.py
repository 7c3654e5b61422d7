"""Kernel benchmarks: host wall time of our kernels vs ORT's CPU EP on the same single-op models, and planner
quality (emulated cycles / roofline bound) per target.

    python -m npu_ep.tools.bench.kernels [--reps 40]

Host time, medians, same process, same inputs: the kernel alone (prepared once, run N times, one BLAS thread),
the single-op model through a real NpuEP session (graph assignment checked), and ORT's CPU EP on the same model,
the two sessions timed in alternating blocks;
ratio = NpuEP session / CPU EP (issue 12 targets: MatMulNBits GEMV 1x2048x2048 <= 1.2x, QLinearMatMul <= 1.0x,
MatMul fp32 <= 1.0x; the level-0 prefills of 8 and 128 rows and the GQA decode row have no target and are printed
for reference). The kernel column runs with
one host thread (native kernels unstamped run on one); a session uses ``host_threads`` (default 2) for its
native kernels and its large BLAS matmuls (``kernels/host_blas.py``).
Planner quality: roofline_cycles(macs, compulsory DMA bytes) / plan cycles (target >= 0.8 for large GEMMs).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import gc
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ...ep.onnx_graph import nodes_from_model
from ...kernels.cost import plan_cycles, roofline_cycles
from ...kernels.planner import PlanError, compulsory_dma_bytes, plan_matmul
from ...kernels.registry import kernel_for
from ...kernels.target import Target, builtin_targets
from ...quantization import quantize_matmul_nbits
from .timing import SETTLE_S, alternating_blocks, medians  # noqa: F401 - SETTLE_S: other benchmarks cite it

RNG = np.random.default_rng(0)


def _model(node: onnx.NodeProto, x: np.ndarray, inits: list, out_type: int, out_shape) -> onnx.ModelProto:
    g = helper.make_graph([node], "bench", [helper.make_tensor_value_info(
        "x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _gqa_decode(past: int = 512, num_heads: int = 32, kv_heads: int = 8, head: int = 128
                ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """GroupQueryAttention, one new token against ``past`` cached ones (B=1, separate Q/K/V)."""
    f32 = np.float32
    feeds = {"q": RNG.standard_normal((1, 1, num_heads * head)).astype(f32),
             "k": RNG.standard_normal((1, 1, kv_heads * head)).astype(f32),
             "v": RNG.standard_normal((1, 1, kv_heads * head)).astype(f32),
             "pk": RNG.standard_normal((1, kv_heads, past, head)).astype(f32),
             "pv": RNG.standard_normal((1, kv_heads, past, head)).astype(f32),
             "sl": np.full((1,), past, np.int32), "tot": np.array(past + 1, np.int32)}
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
           for k, v in feeds.items()]
    # presents declared P + 1, as ORT's CPU kernel returns them (its schema infers P, a shared KV buffer, and
    # warns about the merge: sessions here log errors only)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, num_heads * head]),
            helper.make_tensor_value_info("pk_out", TensorProto.FLOAT, [1, kv_heads, past + 1, head]),
            helper.make_tensor_value_info("pv_out", TensorProto.FLOAT, [1, kv_heads, past + 1, head])]
    node = helper.make_node("GroupQueryAttention", list(feeds), ["y", "pk_out", "pv_out"], domain="com.microsoft",
                            num_heads=num_heads, kv_num_heads=kv_heads)
    g = helper.make_graph([node], "bench", ins, outs)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return model, feeds


def cases() -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    """(label, single-op model, feeds) per benchmarked op."""
    out = []
    x = RNG.standard_normal((128, 1024)).astype(np.float32)
    w = RNG.standard_normal((1024, 1024)).astype(np.float32)
    out.append(("MatMul fp32 128x1024x1024", _model(helper.make_node("MatMul", ["x", "w"], ["y"]), x,
                [numpy_helper.from_array(w, "w")], TensorProto.FLOAT, [128, 1024]), {"x": x}))
    for m, level in ((1, 4), (1, 0), (8, 0), (128, 0), (128, 4)):
        K = N = 2048
        q = quantize_matmul_nbits(RNG.standard_normal((K, N)).astype(np.float32), 32, True)
        xm = RNG.standard_normal((m, K)).astype(np.float32)
        node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=K, N=N, bits=4,
                                block_size=32, accuracy_level=level)
        out.append((f"MatMulNBits int4 {m}x{K}x{N} lvl {level}", _model(node, xm, [numpy_helper.from_array(q.B, "B"),
                    numpy_helper.from_array(q.scales, "S")], TensorProto.FLOAT, [m, N]), {"x": xm}))
    a = RNG.integers(0, 256, (128, 1024)).astype(np.uint8)
    b = RNG.integers(-64, 64, (1024, 1024)).astype(np.int8)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("as", np.array(0.02, np.float32)), ("az", np.array(128, np.uint8)), ("b", b),
        ("bs", np.array(0.01, np.float32)), ("bz", np.array(0, np.int8)), ("ys", np.array(2.0, np.float32)),
        ("yz", np.array(128, np.uint8)))]
    node = helper.make_node("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    out.append(("QLinearMatMul u8s8 128x1024x1024", _model(node, a, inits, TensorProto.UINT8, [128, 1024]), {"x": a}))
    out.append(("GQA decode 512 past, 32/8 heads x 128", *_gqa_decode()))
    return out


def _median_time(fn, reps: int) -> float:
    return _alternating({"fn": fn}, reps)["fn"]


def _alternating(fns: dict, reps: int, rounds: int = 4) -> dict:
    """Median seconds per call of each fn over ``reps`` calls, timed in ``rounds`` alternating blocks (each after
    SETTLE_S), so a slow phase of this shared machine slows every fn alike instead of only the one it caught."""
    return medians(alternating_blocks(fns, reps, rounds))


def _npu_session(model: onnx.ModelProto, target: str) -> ort.InferenceSession:

    from ...ep.sessions import tag_session_options

    so = ort.SessionOptions()
    tag_session_options(so)  # overhead_table finds the program through ep.sessions.session_of
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0,
                                providers=[(get_ep_name(), {"target": target, "cache_dir": ""})])
    eps = {sg.ep_name for sg in sess.get_provider_graph_assignment_info()}
    if eps != {get_ep_name()}:
        raise RuntimeError(f"NpuEP did not take the whole single-op model (assignment: {eps})")
    return sess


def host_table(reps: int, target: Target) -> list[tuple[str, float, float, float, float]]:
    """(label, kernel ms, NpuEP ms, CPU EP ms, NpuEP / CPU EP) per case."""
    from ...kernels.host_blas import blas_threads

    rows = []
    for name, model, feeds in cases():
        so = ort.SessionOptions()
        so.log_severity_level = 3  # ORT's GQA schema assumes a shared KV buffer and warns that present grew
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        npu = _npu_session(model, target.name)
        (node,) = nodes_from_model(model, infer_shapes=False)  # every value is declared in the graph
        k = kernel_for(node.domain, node.op_type)
        p = k.prepare(node, target)
        args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
        ours = k.run(p, args)
        refs = sess.run(None, feeds)
        for got, ref in zip(ours, refs):
            assert got.shape == ref.shape, (name, got.shape, ref.shape)
        # same kernel; BLAS thread counts may reorder float sums
        for got, want in zip(npu.run(None, feeds), ours):
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-4, atol=1e-3)
        del npu  # the kernel column: no live session, so no two-thread split (kernels/host_blas.py)
        gc.collect()
        with blas_threads(1):
            t_ours = _median_time(lambda: k.run(p, args), reps)
        npu = _npu_session(model, target.name)
        t = _alternating({"npu": lambda: npu.run(None, feeds), "cpu": lambda: sess.run(None, feeds)}, reps)
        t_npu, t_ort = t["npu"], t["cpu"]
        rows.append((name, t_ours * 1e3, t_npu * 1e3, t_ort * 1e3, t_npu / t_ort))
    return rows


def _median_us(fn, reps: int) -> float:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def _paired_us(a, b, reps: int, block: int = 100) -> tuple[float, float, float]:
    """(a, b, a - b) in us per call: medians over alternating blocks of ``block`` calls, the difference taken
    block pair by block pair, so the machine's phase changes cancel out of it."""
    for _ in range(20):
        a(), b()
    per: dict = {a: [], b: []}
    for _ in range(max(1, reps // block)):
        for fn in (a, b):
            t0 = time.perf_counter_ns()
            for _ in range(block):
                fn()
            per[fn].append((time.perf_counter_ns() - t0) / block / 1e3)
    deltas = [x - y for x, y in zip(per[a], per[b])]
    return statistics.median(per[a]), statistics.median(per[b]), statistics.median(deltas)


def overhead_table(reps: int, target: Target, chain: int = 64) -> list[str]:
    """Per-step and per-call cost of the Python program (what the native executor removed, PERF.md's executor history):
    a chain of Relu on [1, 8] (kernel work ~nothing) and a one-node partition through session.run."""
    from ...ep.sessions import session_of

    x = np.ones((1, 8), np.float32)

    def relu_chain(n: int) -> onnx.ModelProto:
        nodes = [helper.make_node("Relu", ["x" if i == 0 else f"h{i}"], [f"h{i + 1}" if i < n - 1 else "y"])
                 for i in range(n)]
        g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        return m

    out = []
    for n in (chain, 1):
        model = relu_chain(n)
        npu = _npu_session(model, target.name)
        cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (prog,) = session_of(npu).programs.values()
        step = prog.steps[0]
        t_prog = _median_us(lambda: prog(x), reps)
        t_kernel = _median_us(lambda: step.kernel.run(step.prepared, [x]), reps)
        t_npu, t_cpu, delta = _paired_us(lambda: npu.run(None, {"x": x}),  # noqa: F821 - ruff reads the del below
                                         lambda: cpu.run(None, {"x": x}), reps)  # as unbinding npu
        t_numpy = _median_us(lambda: np.maximum(x, 0), reps)
        out.append(f"Relu x{n:<3} program() {t_prog:7.1f} us = {t_prog / n:5.2f} us/step (Relu kernel.run "
                   f"{t_kernel:4.2f}, numpy alone {t_numpy:4.2f}); session.run NpuEP {t_npu:6.1f} us, CPU EP "
                   f"{t_cpu:6.1f} us, {delta:+.1f} us")
        del npu
    return out


GEMMS = [("fp32 128x1024x1024", 128, 1024, 1024, "float32", "float32", None, None),
         ("fp16 1024x1024x1024", 1024, 1024, 1024, "float16", "float16", None, None),
         ("int8 128x1024x1024", 128, 1024, 1024, "int8", "int8", None, "int8"),
         ("int8 2048x2048x2048", 2048, 2048, 2048, "int8", "int8", None, "int8"),
         ("int4 1x2048x2048", 1, 2048, 2048, "float32", "int4", 32, None),
         ("int4 128x2048x2048", 128, 2048, 2048, "float32", "int4", 32, None)]


def planner_table() -> list[tuple[str, str, str]]:
    rows = []
    for tname in builtin_targets():
        t = Target.load(tname)
        for label, m, n, k, a, b, bs, o in GEMMS:
            try:
                p = plan_matmul(m, n, k, a, b, t, block_size=bs, out_dtype=o)
            except PlanError as exc:
                rows.append((tname, label, f"declined: {exc}"))
                continue
            c = plan_cycles(p, t)
            q = roofline_cycles(p.macs, compulsory_dma_bytes(p), p.mode, t) / c
            rows.append((tname, label, f"{q:.3f}  ({p.tm}x{p.tn}x{p.tk} {p.resident}, {p.sram_bytes // 1024} KiB, "
                                       f"{c / t.clock_hz * 1e6:.1f} us)"))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--target", default="npu-ref")
    ap.add_argument("--overhead-reps", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"host wall time, median of {args.reps} in 4 alternating blocks (target {args.target})")
    print(f"{'op':38} {'kernel ms':>9} {'NpuEP ms':>9} {'CPU EP ms':>9} {'NpuEP/CPU':>9}")
    for name, ours, npu, cpu, ratio in host_table(args.reps, Target.load(args.target)):
        print(f"{name:38} {ours:9.3f} {npu:9.3f} {cpu:9.3f} {ratio:9.2f}")
    print(f"\nPython program overhead, {args.overhead_reps} calls in alternating blocks of 100 (run overhead target: "
          "one-node partition <= 5 us over the CPU EP)")
    for line in overhead_table(args.overhead_reps, Target.load(args.target)):
        print(line)
    print("\nplanner quality: roofline / emulated cycles (>= 0.8 wanted)")
    for tname, label, text in planner_table():
        print(f"{tname:9} {label:22} {text}")


if __name__ == "__main__":
    main()
