"""Provider options (``providers=[("NpuEP", {...})]``, arriving as session config ``ep.npuep.<key>``) and the
session-level EPContext keys. Unknown keys are errors that list the valid ones."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

PREFIX = "ep.npuep."


def prefix_for(device_ep_name: str) -> str:
    """The session-config prefix ORT gives provider options appended for an OrtEpDevice of this ep_name: ``ep.``,
    the name in lower case, ``.`` (NpuEP's host-memory device: ``ep.npuep.``; its NPU-memory device has its own)."""
    return f"ep.{device_ep_name.lower()}."


class OptionError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class EpOptions:
    target: str = "npu-ref"  # built-in target name or path to a target TOML file
    cache_dir: str | None = None  # None: default user cache dir; "" disables the on-disk cache
    cache_max_bytes: int | None = None
    partition_policy: str = "max_coverage"  # or "cost_aware"
    bridge_cost_us: float | None = None  # cost of one CPU<->NPU crossing for cost_aware (None: policy default)
    blas_threads: int = 1  # BLAS threads while NpuEP sessions live; 0: leave the process setting alone
    host_threads: int = 2  # host threads one large matmul may use (its halves on the caller's and a helper thread)
    retain_host_memory: bool = True  # keep freed host memory mapped for reuse (glibc thresholds, ep.host_memory)
    kernels: str = "native"  # native kernels, or the numpy reference model (kernels/runtime.py)
    record_tensors: bool = False  # debug: keep every intermediate tensor of the last run (npu-report --compare)
    log_level: str = "warning"
    log_level_given: bool = False  # the session set log_level (else the application's logging decides)
    kv_cache_dtype: str | None = None  # None: the target's (float32 unless it says so); kernels/ops/_kv_format.py
    conv_layout: str | None = None  # None: the target's (nchw: the layout pass off); kernels/layout.py
    # EPContext (ORT's standard session keys)
    context_enable: bool = False
    context_file_path: str = ""
    context_embed_mode: int = 1
    context_node_name_prefix: str = ""
    disable_cpu_fallback: bool = False


_PROVIDER_KEYS = {
    "target": "built-in target name (npu-ref, npu-edge) or path to a target .toml",
    "cache_dir": "directory of the compiled-context cache; empty string disables it",
    "cache_max_bytes": "size cap of the cache in bytes (LRU eviction)",
    "partition_policy": "max_coverage | cost_aware",
    "bridge_cost_us": "cost of one CPU<->NPU crossing in microseconds, used by cost_aware (measure it with "
                      "python -m npu_ep.tools.bench.bridge)",
    "blas_threads": "BLAS threads while NpuEP sessions are alive (default 1; 0 leaves the process "
                    "setting alone)",
    "host_threads": "1 | 2 (default 2): host threads one large matmul may use (kernels/host_blas.py)",
    "retain_host_memory": "0 | 1 (default 1): keep freed host memory mapped for the next run instead of "
                          "returning it to the OS (process-wide glibc malloc thresholds)",
    "kernels": "native | reference (default native): native kernels or the numpy reference model",
    "record_tensors": "0 | 1: record intermediate tensors inside partitions (debug)",
    "log_level": "debug | info | warning | error",
    "kv_cache_dtype": "float32 | float16 | int8_per_head | int8_per_token | int4_per_head: the format attention "
                      "keeps the KV cache in (default: the target's, float32); changes numerics, so opt-in",
    "conv_layout": "nchw | auto | nhwc (default: the target's; npu-ref: auto): the layout pass over regions of "
                   "depthwise and pointwise convs (kernels/layout.py): off, where the cost model says it pays (nchw "
                   "below AVX-512), or every region",
}
_POLICIES = ("max_coverage", "cost_aware")
_LOG_LEVELS = ("debug", "info", "warning", "error")
_KERNELS = ("native", "reference")


def _bool(key: str, value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off", ""):
        return False
    raise OptionError(f"NpuEP option {key}={value!r}: expected 0 or 1")


def _int(key: str, value: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer option, at least ``lo`` and at most ``hi`` when given; the error names the key and the range."""
    try:
        v = int(value)
    except ValueError:
        raise OptionError(f"NpuEP option {key}={value!r}: expected an integer") from None
    if lo is not None and (v < lo or (hi is not None and v > hi)):
        want = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise OptionError(f"NpuEP option {key}={value!r}: expected an integer {want}")
    return v


def _microseconds(key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise OptionError(f"NpuEP option {key}={value!r}: expected a number of microseconds") from None
    if not math.isfinite(v) or v < 0:
        raise OptionError(f"NpuEP option {key}={value!r}: expected a finite number of microseconds >= 0")
    return v


def _path(value: str | None) -> str | None:
    """``~`` and ``~user`` expanded as a shell would; anything else untouched ("" keeps its meaning)."""
    return os.path.expanduser(value) if value else value


TARGET_ENV = "NPU_EP_TARGET"


def _target(provider: Mapping[str, str]) -> str:
    """The ``target`` option, else ``$NPU_EP_TARGET``, else npu-ref; a target from the environment is loaded here,
    so that an error names the variable it came from (the option's own errors name the option when it loads)."""
    if "target" in provider:
        return _path(provider["target"])
    value = os.environ.get(TARGET_ENV)
    if not value:
        return "npu-ref"
    from ..kernels.target import Target, TargetError

    try:
        Target.load(_path(value))
    except TargetError as exc:
        raise OptionError(f"${TARGET_ENV}={value!r} (NpuEP's target when the session gives none): {exc}") from None
    return _path(value)


def parse(config: Mapping[str, str], prefix: str = PREFIX) -> EpOptions:
    """Options from the full session config map; the provider options are the keys under ``prefix``."""
    provider = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
    unknown = sorted(set(provider) - set(_PROVIDER_KEYS))
    if unknown:
        valid = "; ".join(f"{k} ({doc})" for k, doc in _PROVIDER_KEYS.items())
        raise OptionError(f"unknown NpuEP provider option(s) {', '.join(unknown)}; valid options: {valid}")
    policy = provider.get("partition_policy", "max_coverage")
    if policy not in _POLICIES:
        raise OptionError(f"NpuEP option partition_policy={policy!r}: expected one of {', '.join(_POLICIES)}")
    kernels = provider.get("kernels", "native")
    if kernels not in _KERNELS:
        raise OptionError(f"NpuEP option kernels={kernels!r}: expected one of {', '.join(_KERNELS)}")
    level = provider.get("log_level", "warning").lower()
    if level not in _LOG_LEVELS:
        raise OptionError(f"NpuEP option log_level={level!r}: expected one of {', '.join(_LOG_LEVELS)}")
    kv_dtype = provider.get("kv_cache_dtype")
    if kv_dtype is not None:
        from ..kernels.target import KV_CACHE_DTYPES

        if kv_dtype not in KV_CACHE_DTYPES:
            raise OptionError(f"NpuEP option kv_cache_dtype={kv_dtype!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
    conv_layout = provider.get("conv_layout")
    if conv_layout is not None:
        from ..kernels.target import CONV_LAYOUTS

        if conv_layout not in CONV_LAYOUTS:
            raise OptionError(f"NpuEP option conv_layout={conv_layout!r}: expected one of {', '.join(CONV_LAYOUTS)}")
    embed = _int("ep.context_embed_mode", config.get("ep.context_embed_mode", "1"))
    if embed not in (0, 1):
        raise OptionError(f"ep.context_embed_mode={embed}: expected 0 or 1")
    max_bytes = provider.get("cache_max_bytes")
    bridge_us = provider.get("bridge_cost_us")
    return EpOptions(
        target=_target(provider),
        cache_dir=_path(provider.get("cache_dir")),
        cache_max_bytes=_int("cache_max_bytes", max_bytes, lo=0) if max_bytes else None,
        partition_policy=policy,
        bridge_cost_us=_microseconds("bridge_cost_us", bridge_us) if bridge_us else None,
        blas_threads=_int("blas_threads", provider.get("blas_threads", "1"), lo=0),
        host_threads=_int("host_threads", provider.get("host_threads", "2"), lo=1, hi=2),
        retain_host_memory=_bool("retain_host_memory", provider.get("retain_host_memory", "1")),
        kernels=kernels,
        record_tensors=_bool("record_tensors", provider.get("record_tensors", "0")),
        log_level=level,
        log_level_given="log_level" in provider,
        kv_cache_dtype=kv_dtype,
        conv_layout=conv_layout,
        context_enable=_bool("ep.context_enable", config.get("ep.context_enable", "0")),
        context_file_path=config.get("ep.context_file_path", ""),
        context_embed_mode=embed,
        context_node_name_prefix=config.get("ep.context_node_name_prefix", ""),
        disable_cpu_fallback=_bool("session.disable_cpu_ep_fallback",
                                   config.get("session.disable_cpu_ep_fallback", "0")),
    )
