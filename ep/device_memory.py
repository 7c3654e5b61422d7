"""NPU memory from Python: sessions whose partitions keep their inputs and outputs in NPU memory, OrtValues that
live there, and the counters of what crossed (ep/native/device_memory.h).

NpuEP offers two OrtEpDevices on the CPU (``onnxruntime.get_ep_devices()``, metadata ``npu_ep.memory``), from two
factories of the same library, both creating the EP named "NpuEP" (ORT's graph assignment shows that name):

- ``host``, device ep_name "NpuEP" (what ``providers=["NpuEP"]`` selects): partition inputs and outputs stay in host
  memory, no copies;
- ``npu``, device ep_name "NpuEPNpuMemory": NPU memory is the EP's device memory. ORT allocates partition outputs
  there (NpuEP's allocator) and copies through NpuEP's data transfer where a tensor crosses: graph inputs fed from
  host memory, NPU outputs read by CPU nodes or fetched to host memory. Values bound with IOBinding to NPU memory
  cross nothing. Its own ep_name keeps hosts that append every device of a name (onnxruntime-genai) on one memory.

The memory is host RAM underneath (the NPU is emulated), so NpuEP's kernels read it in place either way.

API::

    so = ort.SessionOptions()
    add_npu_ep(so, {"target": "npu-ref"})                   # the "npu" device: placement by ORT, copies counted
    sess = ort.InferenceSession(model, so, enable_fallback=0)  # else Python retries on the CPU EP after an error
    kv = device_value(sess, [1, 8, 128, 64], np.float32)   # an OrtValue in this session's NPU memory
    binding = sess.io_binding(); binding.bind_ortvalue_input("past", kv); ...
    device_counters(sess)   # {copies_to_npu, bytes_to_npu, dma_us_to_npu, ..., live_bytes, peak_bytes, ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from .registration import get_ep_name

MEMORY_KEY = "npu_ep.memory"  # OrtEpDevice metadata: "host" or "npu"
NPU_MEMORY_SUFFIX = "NpuMemory"  # the NPU-memory device's ep_name: the EP's registered name + this (factory.cc)
NPU_VENDOR_ID = 0x4E50  # NpuEP's vendor id ("NP"), as in its OrtMemoryInfo and OrtEpFactory::GetVendorId
SHARED_KEY = 0  # counters of the environment's shared NPU allocator (values created outside a session)


def npu_ep_device(memory: str = "npu") -> Any:
    """NpuEP's OrtEpDevice whose partition memory is ``memory`` ("npu" or "host")."""
    if memory not in ("npu", "host"):
        raise ValueError(f"NpuEP device memory {memory!r}: expected 'npu' or 'host'")
    name = get_ep_name() + (NPU_MEMORY_SUFFIX if memory == "npu" else "")
    for device in ort.get_ep_devices():
        if device.ep_name == name and device.ep_metadata.get(MEMORY_KEY) == memory:
            return device
    raise LookupError(f"no NpuEP OrtEpDevice with {MEMORY_KEY}={memory} (is the plugin registered? import npu_ep)")


def add_npu_ep(so: ort.SessionOptions, provider_options: Mapping[str, str] | None = None,
               memory: str = "npu") -> ort.SessionOptions:
    """Append NpuEP on its ``memory`` device to ``so`` (ORT's SessionOptionsAppendExecutionProvider_V2); nodes
    NpuEP declines run on the CPU EP, which ORT adds last. Returns ``so``."""
    so.add_provider_for_devices([npu_ep_device(memory)], dict(provider_options or {}))
    return so


def device_value(session: ort.InferenceSession, shape: Sequence[int], dtype: Any = np.float32) -> ort.OrtValue:
    """An uninitialized OrtValue of ``shape`` and ``dtype`` in NPU memory, for IOBinding with ``session``.

    ORT 1.31 serves it from the environment's shared NPU allocator (NpuEP's factory allocator), also for a
    session on the "npu" device: its bytes and the copies into it (``onnxruntime.copy_tensors``, ``numpy()``) count
    under ``device_counters(None)``, and a partition reading it counts the bytes as resident, not crossed."""
    try:
        return session.create_ortvalue_from_shape_and_type(list(shape), dtype, "npu", 0, NPU_VENDOR_ID)
    except Exception:  # noqa: BLE001 - ORT raises RuntimeError or its own types; the session has no NPU allocator
        memory_info = npu_ep_device("npu").memory_info(ort.OrtDeviceMemoryType.DEFAULT)
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, memory_info=memory_info)


def device_counters(session: ort.InferenceSession | None) -> dict[str, Any]:
    """NPU-memory counters of one session (its options tagged by ``npu_ep.ep.sessions.tag_session_options``), or of
    the environment's shared allocator when ``session`` is None. See ``EpSession.device_counters``."""
    if session is None:
        from ..kernels.target import Target
        from .entry_points import counters_with_dma
        from .options import parse

        return counters_with_dma(SHARED_KEY, Target.load(parse({}).target), "shared")
    from .sessions import session_of

    return session_of(session).device_counters()
