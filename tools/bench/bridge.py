"""Bridge overhead per partition call: what crossing from ORT into the Python NPU runtime and back costs.

Runs a one-node graph (Relu on [1, 4]) on NpuEP and on ORT's CPU EP in the same process and prints:
- session.run's thread CPU time of each (the fastest of 7 blocks of runs) and their difference;
- from the shim's own counters: time inside the Compute callback, time inside the Python program, and the
  difference = the bridge (GIL, zero-copy input views, the call, output copy);
- a native step's loop overhead: a StepLoop of bound call steps whose kernel does nothing, per step (issue 40
  target: <= 0.3 us), and the same with a ufunc on [1, 8].
Usage: ``python -m npu_ep.tools.bench.bridge [--runs N]``. Target: bridge < 5 us per call.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from npu_ep.kernels.runtime import extension


def tiny_model() -> bytes:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def _best_run_us(sess: ort.InferenceSession, feeds, runs: int) -> float:
    """session.run's thread CPU time per call, the fastest of 7 blocks of ``runs`` (a shared machine only adds time;
    a one-node call on [1, 4] runs no task on ORT's pool, so the calling thread's time is the call's)."""
    for _ in range(200):
        sess.run(None, feeds)
    best = float("inf")
    for _ in range(7):
        t0 = time.thread_time_ns()
        for _ in range(runs):
            sess.run(None, feeds)
        best = min(best, (time.thread_time_ns() - t0) / runs / 1e3)
    return best


def measure(runs: int = 2000) -> dict[str, float]:
    model = tiny_model()
    feeds = {"x": np.arange(4, dtype=np.float32).reshape(1, 4) - 2}
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    npu = ort.InferenceSession(model, so, providers=[(get_ep_name(), {"cache_dir": ""})], enable_fallback=0)
    assert {sg.ep_name for sg in npu.get_provider_graph_assignment_info()} == {"NpuEP"}, "NpuEP did not take Relu"
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    t_cpu = _best_run_us(cpu, feeds, runs)
    extension().reset_stats()
    t_npu = _best_run_us(npu, feeds, runs)
    stats = [s for s in extension().partition_stats().values() if s["calls"]]
    calls = sum(s["calls"] for s in stats)
    total = sum(s["total_ns"] for s in stats) / calls / 1e3
    program = sum(s["program_ns"] for s in stats) / calls / 1e3
    return {"cpu_ep_run_us": t_cpu, "npu_ep_run_us": t_npu, "run_delta_us": t_npu - t_cpu,
            "compute_callback_us": total, "python_program_us": program, "bridge_us": total - program}


def _best_us(fn, calls: int, rounds: int = 7) -> float:
    """The fastest of ``rounds`` blocks of ``calls`` calls, per call (the shared machine only ever adds time)."""
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def step_overhead(steps: int = 64, runs: int = 2000) -> dict[str, float]:
    """Per step of a program's C++ loop running bound native steps (CallStep, input checked, out= by keyword): with
    a kernel that does no work (``type``, a C call of ~20 ns), which is the loop's own overhead, and with a ufunc on
    [1, 8]."""
    ext = extension()
    x = np.ones((1, 8), np.float32)
    counter = np.zeros(1, np.int64)  # a guard that always holds

    def per_step(fn, template: tuple, keywords: tuple) -> float:
        step = ext.CallStep(fn, template, [(0, 0, x.dtype, x.shape, None)], [(-1, None)], [(counter, 0)], [], [],
                            keywords)
        long, empty = (ext.StepLoop([(None, None, [0], ((0, 1),), [], step)] * n, 2, (1,), lambda j, a, e: e)
                       for n in (steps, 0))
        args = (x,)
        return (_best_us(lambda: long(args), max(1, runs // steps)) - _best_us(lambda: empty(args), runs)) / steps

    return {"loop_overhead_us": per_step(type, (None,), ()),
            "ufunc_step_us": per_step(np.negative, (None, None), ("out",))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    r = measure(ap.parse_args(argv).runs)
    print(f"{'measurement (per call)':44s} {'us':>8s}")
    labels = {"cpu_ep_run_us": "session.run, CPU EP", "npu_ep_run_us": "session.run, NpuEP",
              "run_delta_us": "session.run delta NpuEP - CPU EP", "compute_callback_us": "Compute callback (shim)",
              "python_program_us": "  of which the Python program", "bridge_us": "  bridge = callback - program"}
    for k, label in labels.items():
        print(f"{label:44s} {r[k]:8.2f}")
    print(f"bridge overhead {r['bridge_us']:.2f} us per partition call (target < 5 us): "
          f"{'OK' if r['bridge_us'] < 5 else 'OVER TARGET'}")
    s = step_overhead()
    print(f"native step loop overhead {s['loop_overhead_us']:.2f} us per step (a kernel doing nothing; target <= 0.3 "
          f"us): {'OK' if s['loop_overhead_us'] <= 0.3 else 'OVER TARGET'}; a ufunc step on [1, 8] "
          f"{s['ufunc_step_us']:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
