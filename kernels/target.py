"""Target descriptions: what the emulated NPU is (a TOML data file, not code).

Built-in targets live in ``kernels/targets/<name>.toml``; a path to any TOML file with the same schema works too.
Capability, the tile planner, the kernels, the cost model and the reports all read this one object.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

BUILTIN_DIR = Path(__file__).with_name("targets")


class TargetError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class OpRule:
    """Which instances of one op the target runs. ``dtypes`` constrain the node's first input (the data type)."""

    dtypes: frozenset[str]
    max_rank: int = 6
    static_shapes: bool | None = None  # None: the target-wide default
    max_dim: int | None = None

    @staticmethod
    def from_dict(key: str, d: Mapping[str, Any]) -> "OpRule":
        unknown = set(d) - {"dtypes", "max_rank", "static_shapes", "max_dim"}
        if unknown:
            raise TargetError(f"ops.{key}: unknown field(s) {sorted(unknown)}")
        dtypes = frozenset(d.get("dtypes", ()))
        for dt in dtypes:
            try:
                np.dtype(dt)
            except TypeError as exc:
                raise TargetError(f"ops.{key}: unknown dtype {dt!r}") from exc
        return OpRule(dtypes, int(d.get("max_rank", 6)), d.get("static_shapes"), d.get("max_dim"))


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    description: str
    clock_hz: float
    sram_bytes: int
    static_shapes: bool
    matrix: Mapping[str, Any]  # tile_m/tile_n/tile_k, macs_per_cycle{dtype}, accumulator{dtype}
    vector: Mapping[str, Any]  # lanes (elements/cycle), dtypes
    dma: Mapping[str, Any]  # bytes_per_cycle, latency_cycles, alignment_bytes
    ops: Mapping[tuple[str, str], OpRule]
    raw: Mapping[str, Any]
    digest: str  # sha256 of the canonical description: part of every compiled-context key

    @staticmethod
    def load(name_or_path: str | Path) -> "Target":
        path = Path(name_or_path)
        if not path.suffix:
            path = BUILTIN_DIR / f"{name_or_path}.toml"
            if not path.is_file():
                raise TargetError(f"unknown target {name_or_path!r}; built-in targets: {', '.join(builtin_targets())}")
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TargetError(f"cannot read target description {path}: {exc}") from exc
        return Target.from_dict(raw, source=str(path))

    @staticmethod
    def from_dict(raw: Mapping[str, Any], source: str = "<dict>") -> "Target":
        try:
            ops = {}
            for key, rule in raw.get("ops", {}).items():
                domain, _, op = key.rpartition("::")
                ops[(domain, op)] = OpRule.from_dict(key, rule)
            canonical = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
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
        except KeyError as exc:
            raise TargetError(f"target description {source}: missing field {exc}") from exc

    def rule(self, domain: str, op_type: str) -> OpRule | None:
        return self.ops.get((domain, op_type))

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz


def builtin_targets() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))
