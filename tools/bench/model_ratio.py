"""One real model's host time on NpuEP against the CPU EP, by rounds: the figure the zoo's per-model ratio gives
from a few short blocks, taken with enough rounds to show its spread.

    python -m npu_ep.tools.bench.model_ratio lcnet-orientation [--threads 1] [--rounds 8] [--reps 20]
        [--npu-option conv_layout=auto]

The model is a corpus model's name (``models/corpus.py``, with its realistic inputs; its package must be
installed). Both sessions run in this process with default options except ``intra_op_num_threads`` (and NpuEP's
provider options given by ``--npu-option``); they alternate
in ``--rounds`` blocks of ``--reps`` calls after a pause (``timing.alternating_blocks``). Printed: each round's ratio
of medians, the median over rounds, and the ratio of the fastest calls; NpuEP must have taken every node of the
optimized graph (ORT's assignment record), else it is an error: ORT would have run the rest on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from ...ep.registration import get_ep_name
from ...models.corpus import by_name
from .timing import alternating_blocks, block_ratios


def sessions(path: str, threads: int, npu_options: dict[str, str] | None = None
             ) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """(NpuEP with the CPU EP behind it, the CPU EP alone), ``threads`` intra-op threads each (0: ORT's default),
    NpuEP with ``npu_options``."""
    from ...ep.sessions import tag_session_options

    def options(npu: bool) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        if npu:
            tag_session_options(so)
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        return so

    npu = ort.InferenceSession(path, options(True), providers=[(get_ep_name(), dict(npu_options or {})),
                                                               "CPUExecutionProvider"])
    return npu, ort.InferenceSession(path, options(False), providers=["CPUExecutionProvider"])


def nodes_off_npu(sess: ort.InferenceSession) -> int:
    return sum(len(g.get_nodes()) for g in sess.get_provider_graph_assignment_info() if g.ep_name != get_ep_name())


def measure(name: str, threads: int, rounds: int, reps: int, npu_options: dict[str, str] | None = None
            ) -> dict[str, Any]:
    model = by_name(name)
    path = model.path()
    if path is None:
        raise SystemExit(f"model_ratio: {name}: package {model.package} is not installed")
    feeds = model.feeds(np.random.default_rng(0))
    npu, cpu = sessions(str(path), threads, npu_options)
    off = nodes_off_npu(npu)
    if off:
        raise SystemExit(f"model_ratio: {name}: {off} nodes of the optimized graph are not on NpuEP")
    blocks = alternating_blocks({"npu": lambda: npu.run(None, feeds), "cpu": lambda: cpu.run(None, feeds)},
                                reps * rounds, rounds=rounds)
    ratios = block_ratios(blocks, "npu", "cpu")
    fastest = {k: min(min(b) for b in v) for k, v in blocks.items()}
    return {"model": name, "threads": threads, "round_ratios": ratios, "median_ratio": statistics.median(ratios),
            "fastest_ratio": fastest["npu"] / fastest["cpu"],
            "npu_ms": statistics.median(t for b in blocks["npu"] for t in b) * 1e3,
            "cpu_ms": statistics.median(t for b in blocks["cpu"] for t in b) * 1e3}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.model_ratio", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a corpus model's name (models/corpus.py), e.g. lcnet-orientation")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of both sessions (0: ORT's default)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20, help="calls per block")
    ap.add_argument("--npu-option", action="append", default=[], metavar="KEY=VALUE",
                    help="NpuEP provider option (repeatable), e.g. conv_layout=auto")
    a = ap.parse_args(argv)
    bad = [o for o in a.npu_option if "=" not in o]
    if bad:
        ap.error(f"--npu-option {bad[0]!r}: expected KEY=VALUE")
    r = measure(a.model, a.threads, a.rounds, a.reps, dict(o.split("=", 1) for o in a.npu_option))
    print(f"{r['model']}, {r['threads']} thread(s): NpuEP {r['npu_ms']:.2f} ms, CPU EP {r['cpu_ms']:.2f} ms "
          f"(medians of all calls)")
    print("round ratios: " + " ".join(f"{x:.2f}" for x in r["round_ratios"]))
    print(f"median of rounds {r['median_ratio']:.2f}x, fastest calls {r['fastest_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
