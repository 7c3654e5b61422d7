"""Target descriptions: what the emulated NPU is (a TOML data file, not code).

Built-in targets live in ``kernels/targets/<name>.toml``; a path to any TOML file with the same schema works too.
Capability, the tile planner, the kernels, the cost model and the reports all read this one object.

Schema (units in brackets; every field is validated by ``Target.from_dict`` with an error naming the field: kinds
and ranges in ``_SECTIONS``, numbers finite, unknown fields refused; a file is read only if it is a regular file
of at most ``MAX_FILE_BYTES``):

- ``name``, ``description``, ``clock_mhz`` [MHz], ``sram_bytes`` [B], ``static_shapes`` (bool: symbolic dims
  declined target-wide unless an op rule overrides it), ``kv_cache_dtype`` (optional: the format attention keeps
  its KV cache in, one of ``KV_CACHE_DTYPES``, default float32; ``kernels/ops/_kv_format.py``; the provider
  option ``kv_cache_dtype`` overrides it), ``conv_layout`` (optional: the layout pass's mode, one of
  ``CONV_LAYOUTS``, default nchw: off; npu-ref sets auto; ``kernels/layout.py``; the provider option
  ``conv_layout`` overrides it).
- ``[matrix]``: ``tile_m``/``tile_n``/``tile_k`` (the unit's native tile [elements]; plans use multiples),
  ``macs_per_cycle = {mode = rate}`` with modes among ``float32 float16 int8 int4`` (int4 = int4 weights x int8
  activations), ``accumulator = {mode = dtype}`` (one per mode), ``float_compute = {input_dtype = mode}`` (which
  mode a float matmul with that input dtype runs in; absent or empty: no float matmul),
  ``a16_accumulator_bits`` (accumulator width [bits] for 16-bit activations x 8/4-bit weights in QDQ units;
  absent: 16-bit activations are declined).
- ``[vector]``: ``lanes`` [fp32 elements/cycle], ``transcendental_cycles`` [cycles per vector op of exp/erf/...].
- ``[dma]``: ``bytes_per_cycle`` [B/cycle], ``latency_cycles`` [cycles per transfer], ``outstanding`` (transfers
  in flight, default 1), ``alignment_bytes`` [B, power of two: every SRAM buffer is rounded up to it].
- ``[fusion]``: ``epilogues`` = subset of ``["bias", "relu", "quantize", "swiglu"]`` foldable into a matmul's tile
  loop (``swiglu``: ``silu(gate) * up`` on a sibling group's accumulator, see ``kernels.fusion.siblings``).
- ``[ops]``: ``"domain::Op" = {dtypes = [...], max_rank, static_shapes, max_dim}`` (``dtypes`` constrain the node's
  first input; ``int4``/``uint4`` name ONNX 4-bit types, which reach kernels unpacked in int8/uint8 containers).
  ``ops_from = "<built-in target>"`` (top level) starts the table from that target's; ``[ops]`` entries override.
- ``[projection]`` (optional; real-NPU targets): what turns the emulated timeline into a latency to compare with a
  device (``kernels/projection.py``): ``graph_overhead_us`` [us per inference], ``op_overhead_us`` [us per op that
  does work], ``matrix_efficiency = {mode = fraction of that mode's peak}`` (every mode of ``macs_per_cycle``),
  ``vector_efficiency``, ``dram_efficiency`` and ``int4_unpack_efficiency`` (int4 weights unpacked on the vector
  unit) [fractions of the peak rates above], ``calibration`` =
  {median_error, max_error, rows} as the fit printed them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import stat
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

BUILTIN_DIR = Path(__file__).with_name("targets")
MATRIX_MODES = ("float32", "float16", "int8", "int4")
EPILOGUES = ("bias", "relu", "quantize", "swiglu")
_EXTRA_DTYPES = {"int4", "uint4"}  # ONNX types numpy has no native dtype for
KV_CACHE_DTYPES = ("float32", "float16", "int8_per_head", "int8_per_token", "int4_per_head")
CONV_LAYOUTS = ("nchw", "auto", "nhwc")  # the layout pass's modes (kernels/layout.py)


class TargetError(ValueError):
    pass


def _check_dtype(where: str, dt: Any) -> None:
    if not isinstance(dt, str):
        raise TargetError(f"{where}: expected a dtype name, got {dt!r}")
    if dt in _EXTRA_DTYPES:
        return
    try:
        np.dtype(dt)
    except TypeError as exc:
        raise TargetError(f"{where}: unknown dtype {dt!r}") from exc


# --- the schema: every scalar field, its kind and whether it is required, in one place -------------------------
# Kinds: "name" (non-empty string), "text" (string), "bool", "count" (integer >= 1), "rate" (finite number > 0),
# "cycles" (finite number >= 0). Tables not listed here (macs_per_cycle, accumulator, float_compute, epilogues,
# ops) are checked by ``_validate`` / ``OpRule.from_dict``. Unknown fields are errors, so a misspelt field cannot
# silently fall back to a default.
_SECTIONS: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"name": ("name", True), "description": ("text", False), "clock_mhz": ("rate", True),
         "sram_bytes": ("count", True), "static_shapes": ("bool", False), "ops_from": ("name", False),
         "kv_cache_dtype": ("name", False), "conv_layout": ("name", False)},
    "matrix": {"tile_m": ("count", True), "tile_n": ("count", True), "tile_k": ("count", True),
               "a16_accumulator_bits": ("count", False)},
    "vector": {"lanes": ("count", True), "transcendental_cycles": ("cycles", False)},
    "dma": {"bytes_per_cycle": ("rate", True), "latency_cycles": ("cycles", True), "outstanding": ("count", False),
            "alignment_bytes": ("count", True)},
    "fusion": {},
    "projection": {"graph_overhead_us": ("cycles", True), "op_overhead_us": ("cycles", True),
                   "vector_efficiency": ("rate", True), "dram_efficiency": ("rate", True),
                   "int4_unpack_efficiency": ("rate", True)},
}
_OPTIONAL_SECTIONS = {"fusion", "projection"}
_TABLES = {"": {"matrix", "vector", "dma", "fusion", "ops", "projection"},
           "matrix": {"macs_per_cycle", "accumulator", "float_compute"}, "fusion": {"epilogues"},
           "projection": {"matrix_efficiency", "calibration"}}
_EXPECTED = {"name": "a non-empty string", "text": "a string", "bool": "true or false",
             "count": "a positive int", "rate": "a positive float", "cycles": "a non-negative number"}


def _check_value(where: str, v: Any, kind: str) -> None:
    if kind in ("name", "text"):
        ok = isinstance(v, str) and (kind == "text" or v != "")
    elif kind == "bool":
        ok = isinstance(v, bool)
    elif kind == "count":
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    else:
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (v > 0 if kind == "rate" else v >= 0))
    if not ok:
        finite = " (finite)" if isinstance(v, float) and not math.isfinite(v) else ""
        raise TargetError(f"{where}: expected {_EXPECTED[kind]}{finite}, got {v!r}")


def _table(raw: Mapping[str, Any], key: str, where: str, required: bool = True) -> Mapping[str, Any]:
    if key not in raw:
        if required:
            raise TargetError(f"{where}: missing field '{key}'")
        return {}
    v = raw[key]
    if not isinstance(v, Mapping):
        raise TargetError(f"{where}: {key} must be a table, got {v!r}")
    return v


@dataclasses.dataclass(frozen=True)
class OpRule:
    """Which instances of one op the target runs. ``dtypes`` constrain the node's first input (the data type)."""

    dtypes: frozenset[str]
    max_rank: int = 6
    static_shapes: bool | None = None  # None: the target-wide default
    max_dim: int | None = None

    @staticmethod
    def from_dict(key: str, d: Mapping[str, Any]) -> OpRule:
        if not isinstance(d, Mapping):
            raise TargetError(f"ops.{key}: expected a table, got {type(d).__name__}")
        unknown = set(d) - {"dtypes", "max_rank", "static_shapes", "max_dim"}
        if unknown:
            raise TargetError(f"ops.{key}: unknown field(s) {sorted(unknown)}")
        dtypes = d.get("dtypes", [])
        if not isinstance(dtypes, list):
            raise TargetError(f"ops.{key}.dtypes: expected a list of dtype names, got {dtypes!r}")
        for dt in dtypes:
            _check_dtype(f"ops.{key}", dt)
        max_rank = d.get("max_rank", 6)
        if not isinstance(max_rank, int) or isinstance(max_rank, bool) or max_rank < 0:
            raise TargetError(f"ops.{key}.max_rank: expected a non-negative integer, got {max_rank!r}")
        if "static_shapes" in d:
            _check_value(f"ops.{key}.static_shapes", d["static_shapes"], "bool")
        if "max_dim" in d:
            _check_value(f"ops.{key}.max_dim", d["max_dim"], "count")
        return OpRule(frozenset(dtypes), max_rank, d.get("static_shapes"), d.get("max_dim"))


def _validate(raw: Mapping[str, Any], source: str) -> None:
    """Raise TargetError naming the first bad field; the dataclass then trusts the data."""
    w = f"target {source}"
    for section, fields in _SECTIONS.items():
        if section in _OPTIONAL_SECTIONS and section not in raw:
            continue
        table = _table(raw, section, w, section not in _OPTIONAL_SECTIONS) if section else raw
        where = f"{w}: {section}." if section else f"{w}: "
        unknown = sorted(set(table) - set(fields) - _TABLES.get(section, set()))
        if unknown:
            known = ", ".join(sorted(set(fields) | _TABLES.get(section, set())))
            raise TargetError(f"{where.rstrip('. :')}: unknown field(s) {unknown} (known: {known})")
        for key, (kind, required) in fields.items():
            if key in table:
                _check_value(f"{where}{key}", table[key], kind)
            elif required:
                raise TargetError(f"{w}: missing field '{(section + '.') if section else ''}{key}'")
    mx = raw["matrix"]
    rates = _table(mx, "macs_per_cycle", f"{w}: matrix", required=False)
    if not rates:
        raise TargetError(f"{w}: matrix.macs_per_cycle must name at least one mode")
    acc = _table(mx, "accumulator", f"{w}: matrix", required=False)
    for mode, rate in rates.items():
        if mode not in MATRIX_MODES:
            raise TargetError(f"{w}: matrix.macs_per_cycle: unknown mode {mode!r} (known: {', '.join(MATRIX_MODES)})")
        _check_value(f"{w}: matrix.macs_per_cycle.{mode}", rate, "rate")
        if mode not in acc:
            raise TargetError(f"{w}: matrix.accumulator has no entry for mode {mode!r}")
    for mode, dt in acc.items():
        if mode not in rates:
            raise TargetError(f"{w}: matrix.accumulator.{mode}: not a mode of matrix.macs_per_cycle")
        _check_dtype(f"{w}: matrix.accumulator.{mode}", dt)
    fc = mx.get("float_compute", {})
    if not isinstance(fc, Mapping):
        raise TargetError(f"{w}: matrix.float_compute must map input dtype -> mode, got {fc!r}")
    for dt, mode in fc.items():
        _check_dtype(f"{w}: matrix.float_compute", dt)
        if not isinstance(mode, str) or mode not in rates:
            raise TargetError(f"{w}: matrix.float_compute.{dt} = {mode!r} is not a mode of matrix.macs_per_cycle")
    al = raw["dma"]["alignment_bytes"]
    if al & (al - 1):
        raise TargetError(f"{w}: dma.alignment_bytes must be a power of two, got {al}")
    epilogues = _table(raw, "fusion", w, required=False).get("epilogues", [])
    if not isinstance(epilogues, list):
        raise TargetError(f"{w}: fusion.epilogues: expected a list, got {epilogues!r}")
    for e in epilogues:
        if e not in EPILOGUES:
            raise TargetError(f"{w}: fusion.epilogues: unknown epilogue {e!r} (known: {', '.join(EPILOGUES)})")
    _table(raw, "ops", w, required=False)
    proj = raw.get("projection")
    if proj is not None:
        effs = _table(proj, "matrix_efficiency", f"{w}: projection")
        if set(effs) != set(rates):
            raise TargetError(f"{w}: projection.matrix_efficiency must give one value per mode of "
                              f"matrix.macs_per_cycle ({', '.join(rates)}), got {', '.join(effs) or 'none'}")
        for mode, eff in effs.items():
            _check_value(f"{w}: projection.matrix_efficiency.{mode}", eff, "rate")
    if raw.get("kv_cache_dtype", "float32") not in KV_CACHE_DTYPES:
        raise TargetError(f"{w}: kv_cache_dtype = {raw['kv_cache_dtype']!r} is not a KV cache format "
                          f"({', '.join(KV_CACHE_DTYPES)})")
    if raw.get("conv_layout", "nchw") not in CONV_LAYOUTS:
        raise TargetError(f"{w}: conv_layout = {raw['conv_layout']!r} is not a layout mode ({', '.join(CONV_LAYOUTS)})")
    if "ops_from" in raw and raw["ops_from"] not in builtin_targets():
        raise TargetError(f"{w}: ops_from = {raw['ops_from']!r} is not a built-in target "
                          f"({', '.join(builtin_targets())})")


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    description: str
    clock_hz: float
    sram_bytes: int
    static_shapes: bool
    matrix: Mapping[str, Any]  # tile_m/tile_n/tile_k, macs_per_cycle{mode}, accumulator{mode}, float_compute
    vector: Mapping[str, Any]  # lanes (elements/cycle), transcendental_cycles
    dma: Mapping[str, Any]  # bytes_per_cycle, latency_cycles, alignment_bytes
    ops: Mapping[tuple[str, str], OpRule]
    raw: Mapping[str, Any]
    digest: str  # sha256 of the canonical description: part of every compiled-context key

    @staticmethod
    def load(name_or_path: str | Path) -> Target:
        """A built-in target by name (package data: parsed once per process), or a target file (read every time,
        so edits to it take effect in the next session)."""
        if not Path(name_or_path).suffix:
            return _builtin(str(name_or_path))
        return Target._read(Path(name_or_path))

    @staticmethod
    def _read(path: Path) -> Target:
        try:
            raw = tomllib.loads(_read_bounded(path).decode())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise TargetError(f"cannot read target description {path}: {exc}") from exc
        except RecursionError:
            raise TargetError(f"cannot read target description {path}: nested too deeply") from None
        return Target.from_dict(raw, source=str(path))

    @staticmethod
    def from_dict(raw: Mapping[str, Any], source: str = "<dict>") -> Target:
        _validate(raw, source)
        ops = dict(_builtin(raw["ops_from"]).ops) if "ops_from" in raw else {}
        for key, rule in raw.get("ops", {}).items():
            domain, _, op = key.rpartition("::")
            ops[(domain, op)] = OpRule.from_dict(key, rule)
        described = raw  # the digest covers the op table it inherits, so a change there is a new target
        if "ops_from" in raw:
            described = {**raw, "ops": {**_builtin(raw["ops_from"]).raw.get("ops", {}), **raw.get("ops", {})}}
        canonical = json.dumps(described, sort_keys=True, separators=(",", ":")).encode()
        return Target(
            name=str(raw["name"]),
            description=str(raw.get("description", "")),
            clock_hz=float(raw["clock_mhz"]) * 1e6,
            sram_bytes=int(raw["sram_bytes"]),
            static_shapes=bool(raw.get("static_shapes", False)),
            matrix=raw["matrix"],
            vector=raw["vector"],
            dma=raw["dma"],
            ops=ops,
            raw=raw,
            digest=hashlib.sha256(canonical).hexdigest(),
        )

    def rule(self, domain: str, op_type: str) -> OpRule | None:
        return self.ops.get((domain, op_type))

    @property
    def kv_cache_dtype(self) -> str:
        """The format attention kernels keep the KV cache in (``kernels/ops/_kv_format.py``)."""
        return str(self.raw.get("kv_cache_dtype", "float32"))

    def with_kv_cache_dtype(self, dtype: str | None) -> Target:
        """This target with its KV cache in ``dtype`` (None or the same: this target). A new description, so a new
        digest: programs compiled for one format are never taken from the cache for another."""
        if dtype is None or dtype == self.kv_cache_dtype:
            return self
        return Target.from_dict({**self.raw, "kv_cache_dtype": dtype}, source=f"{self.name} (kv_cache_dtype option)")

    @property
    def conv_layout(self) -> str:
        """The layout pass's mode (``kernels/layout.py``): nchw (off), auto (the cost model chooses), nhwc."""
        return str(self.raw.get("conv_layout", "nchw"))

    def with_conv_layout(self, mode: str | None) -> Target:
        """This target with the layout pass in ``mode`` (None or the same: this target); a new digest, as for
        ``with_kv_cache_dtype``: a program compiled in one layout is never taken from the cache for another."""
        if mode is None or mode == self.conv_layout:
            return self
        return Target.from_dict({**self.raw, "conv_layout": mode}, source=f"{self.name} (conv_layout option)")

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    # --- matrix unit -------------------------------------------------------------------------------------------
    @property
    def tile(self) -> tuple[int, int, int]:
        """The matrix unit's native tile ``(tile_m, tile_n, tile_k)`` [elements]."""
        return int(self.matrix["tile_m"]), int(self.matrix["tile_n"]), int(self.matrix["tile_k"])

    def has_mode(self, mode: str) -> bool:
        return mode in self.matrix["macs_per_cycle"]

    def mac_rate(self, mode: str) -> float:
        """Peak MACs per cycle of the matrix unit in ``mode`` (KeyError names the mode if absent)."""
        return float(self.matrix["macs_per_cycle"][mode])

    def accumulator(self, mode: str) -> str:
        return str(self.matrix["accumulator"][mode])

    def float_mode(self, dtype: str) -> str | None:
        """Matrix mode a float matmul with inputs of ``dtype`` runs in; None: this target has no such mode."""
        return self.matrix.get("float_compute", {}).get(dtype)

    def allows_epilogue(self, kind: str) -> bool:
        return kind in self.raw.get("fusion", {}).get("epilogues", ())

    def align(self, nbytes: int) -> int:
        """``nbytes`` rounded up to the DMA/SRAM alignment."""
        a = int(self.dma["alignment_bytes"])
        return -(-int(nbytes) // a) * a


MAX_FILE_BYTES = 1 << 20  # a target description is a few KiB; anything bigger is not one


def _read_bounded(path: Path) -> bytes:
    """A regular file's bytes, at most ``MAX_FILE_BYTES`` (a FIFO, device or huge file is refused, never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise OSError(f"{st.st_size} bytes, more than the {MAX_FILE_BYTES} a target description may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"more than the {MAX_FILE_BYTES} bytes a target description may have")
    return data


@cache
def _builtin(name: str) -> Target:
    path = BUILTIN_DIR / f"{name}.toml"
    if not path.is_file():
        raise TargetError(f"unknown target {name!r}; built-in targets: {', '.join(builtin_targets())}")
    return Target._read(path)


def builtin_targets() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))
