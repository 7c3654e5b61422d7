"""The measured CPU<->NPU boundaries of ``npu-report --run``: bytes that crossed against bytes already resident in
NPU memory, from the shim's counters (partition inputs/outputs by where they live, ep/native/partition_kernel.h; the
copies ORT made through NpuEP's data transfer and NpuEP's allocator, ep/native/device_memory.h)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def boundaries(parts: Sequence[dict], before: Mapping[str, Any], after: Mapping[str, Any], runs: int
               ) -> dict[str, Any]:
    """Per run, what crossed the CPU<->NPU boundary and what stayed in NPU memory (``ep.device_memory``):

    - partition inputs/outputs in host memory crossed at the call, with no copy (the emulated NPU reads host RAM);
    - copies ORT made through NpuEP's data transfer crossed as copies (count, bytes, emulated DMA us);
    - resident: partition inputs/outputs found in NPU memory that no copy of this run moved (bound with IOBinding
      to NPU memory, or produced and consumed there)."""
    io = sum((p["bytes_in_per_call"] + p["bytes_out_per_call"]) * p["calls_per_run"] for p in parts)
    io_npu = sum((p["bytes_in_npu_per_call"] + p["bytes_out_npu_per_call"]) * p["calls_per_run"] for p in parts)
    delta = {k: (after[k] - before[k]) / max(runs, 1) for k in after if isinstance(after[k], (int, float))}
    copied = delta["bytes_to_npu"] + delta["bytes_to_host"] + delta["bytes_on_npu"]
    host_io = io - io_npu
    return {"memory": after["memory"], "crossed_bytes": host_io + delta["bytes_to_npu"] + delta["bytes_to_host"],
            "host_io_bytes": host_io, "resident_bytes": max(0.0, io_npu - copied),
            "copies": {d: delta[f"copies_{d}"] for d in ("to_npu", "to_host", "on_npu")},
            "copy_bytes": {d: delta[f"bytes_{d}"] for d in ("to_npu", "to_host", "on_npu")},
            "dma_us": {d: delta[f"dma_us_{d}"] for d in ("to_npu", "to_host", "on_npu")},
            "allocator_peak_bytes": after["peak_bytes"], "allocator_live_bytes": after["live_bytes"]}


def boundaries_line(b: Mapping[str, Any]) -> str:
    """One sentence on the measured boundaries per run: bytes that crossed (read/written by partitions in host
    memory, or copied by ORT through NpuEP's data transfer) against bytes already resident in NPU memory."""
    where = "NPU memory" if b["memory"] == "npu" else "host memory"
    c, cb = b["copies"], b["copy_bytes"]
    dma = sum(b["dma_us"].values())
    return (f"boundaries per run (partition inputs/outputs in {where}): {b['crossed_bytes']:,.0f} B crossed "
            f"({b['host_io_bytes']:,.0f} B read/written by partitions in host memory; {c['to_npu']:g} copies to the "
            f"NPU, {cb['to_npu']:,.0f} B, and {c['to_host']:g} to the host, {cb['to_host']:,.0f} B, emulated DMA "
            f"{dma:.2f} us), {b['resident_bytes']:,.0f} B already resident in NPU memory; NPU allocator peak "
            f"{b['allocator_peak_bytes']:,} B")
