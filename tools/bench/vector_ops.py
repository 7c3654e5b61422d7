"""One-node benchmark of the vector-unit ops of issue 40 item 3 (pools, Softmax/LogSoftmax, reductions): host wall
time of an NpuEP session vs ORT's CPU EP on the same single-node model and input.

    python -m npu_ep.tools.bench.vector_ops [--reps 40] [--rounds 4] [CASE ...]

Both sessions run in this process with default options (NpuEP's host threads, the CPU EP's intra-op threads); they
alternate in ``--rounds`` timed blocks after a warm-up (``timing.alternating_blocks``: the machine is shared); a
case whose node ORT did not assign to NpuEP is an error, and Python's silent CPU fallback is off (an EP failure
raises instead of timing the CPU twice). Per case: the
medians, their ratio (NpuEP / CPU EP) with its spread over the blocks, and the largest difference of the outputs.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import statistics

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from .timing import alternating_blocks, block_ratios, medians

CASES: dict[str, tuple[str, list[int], dict]] = {
    "maxpool_3x3s2p1_64x112": ("MaxPool", [1, 64, 112, 112], dict(kernel_shape=[3, 3], strides=[2, 2],
                                                                  pads=[1, 1, 1, 1])),
    "maxpool_3x3s2p1_32x56": ("MaxPool", [1, 32, 56, 56], dict(kernel_shape=[3, 3], strides=[2, 2],
                                                              pads=[1, 1, 1, 1])),
    "maxpool_2x2s2_64x56": ("MaxPool", [1, 64, 56, 56], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "avgpool_3x3s1p1_64x56": ("AveragePool", [1, 64, 56, 56], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "avgpool_2x2s2_64x56": ("AveragePool", [1, 64, 56, 56], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "globalavgpool_512x7x7": ("GlobalAveragePool", [1, 512, 7, 7], {}),
    "globalmaxpool_512x7x7": ("GlobalMaxPool", [1, 512, 7, 7], {}),
    "softmax_axis1_1000x49": ("Softmax", [1, 1000, 49], dict(axis=1)),
    "softmax_axis2_8x128x128": ("Softmax", [1, 8, 128, 128], dict(axis=2)),
    "softmax_last_8x128x128": ("Softmax", [1, 8, 128, 128], dict(axis=-1)),
    "logsoftmax_last_32000": ("LogSoftmax", [1, 32000], dict(axis=-1)),
    "reducemean_axis1_64x56x56": ("ReduceMean", [1, 64, 56, 56], dict(axes=[1])),
    "reducemax_axis1_64x56x56": ("ReduceMax", [1, 64, 56, 56], dict(axes=[1])),
    "reducemean_axis1_128x768": ("ReduceMean", [1, 128, 768], dict(axes=[1])),
    "reducemax_axis1_128x768": ("ReduceMax", [1, 128, 768], dict(axes=[1])),
    "reducemax_last_128x768": ("ReduceMax", [1, 128, 768], dict(axes=[2])),
}


def _model(op: str, shape: list[int], attrs: dict) -> bytes:
    node = helper.make_node(op, ["x"], ["y"], name="node", **attrs)
    graph = helper.make_graph([node], "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def run_case(name: str, reps: int, rounds: int) -> dict[str, float]:
    """Medians (seconds), the ratio's median and spread, the outputs' largest difference of one case."""
    op, shape, attrs = CASES[name]
    model = _model(op, shape, attrs)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    npu = ort.InferenceSession(model, sess_options=so, providers=[(get_ep_name(), {"cache_dir": ""}),
                                                                   "CPUExecutionProvider"], enable_fallback=0)
    ran = {n.name: sg.ep_name for sg in npu.get_provider_graph_assignment_info() for n in sg.get_nodes()}
    if ran.get("node") != get_ep_name():
        raise RuntimeError(f"{name}: ORT assigned the {op} node to {ran.get('node')}, not NpuEP")
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    diff = float(np.max(np.abs(npu.run(None, feeds)[0] - cpu.run(None, feeds)[0])))
    blocks = alternating_blocks({"npu": lambda: npu.run(None, feeds), "cpu": lambda: cpu.run(None, feeds)}, reps,
                                rounds)
    med, ratios = medians(blocks), block_ratios(blocks, "npu", "cpu")
    return {"npu": med["npu"], "cpu": med["cpu"], "ratio": statistics.median(ratios), "low": min(ratios),
            "high": max(ratios), "diff": diff}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("cases", nargs="*", choices=[[], *CASES], default=[], metavar="CASE")
    args = ap.parse_args(argv)
    for name in args.cases or CASES:
        r = run_case(name, args.reps, args.rounds)
        print(f"{name:28s} NpuEP {r['npu'] * 1e6:8.1f} us  CPU EP {r['cpu'] * 1e6:8.1f} us  ratio {r['ratio']:5.2f} "
              f"[{r['low']:.2f}-{r['high']:.2f}]  max |diff| {r['diff']:.1e}", flush=True)


if __name__ == "__main__":
    main()
