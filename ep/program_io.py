"""Program <-> (JSON header, named arrays): what a context binary stores.

Only ``Prepared.attrs`` (JSON) and ``Prepared.consts`` (arrays, already in the NPU's layout) are stored, so
loading rebuilds the program without calling any kernel's ``prepare`` (no recompilation, no weight re-packing).
Given ``refs`` (cache entries), constants that view ORT's initializers are stored as references to them
(``borrowed_refs``) instead of bytes, and constants a kernel computed from such initializers (accuracy_level 4's
tiles, ``Prepared.derived``) as their recipe and references: re-deriving them from memory ORT holds
anyway is cheaper than reading and verifying their bytes from the entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..context_cache.file_pages import release_weight_pages
from ..kernels.registry import RECIPES, DerivedConsts, Prepared, kernel_for
from ..kernels.target import Target
from .borrowed_refs import BorrowedRefError, BorrowedRefs
from .program import UNKNOWN_RANK, IoSpec, Program, Step


class ProgramFormatError(ValueError):
    pass


def program_to_parts(program: Program, refs: BorrowedRefs | None = None
                     ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    steps = []
    for i, s in enumerate(program.steps):
        derived = _derived_refs(s.prepared, refs, f"{i}/", arrays)
        rebuilt = {name for d in derived for name in d["consts"].values()}
        borrowed = {}
        for cname, arr in s.prepared.consts.items():
            if cname in rebuilt:
                continue
            ref = refs.ref(arr) if refs is not None else None
            if ref is not None:
                borrowed[cname] = ref
            else:
                arrays[f"{i}/{cname}"] = np.asarray(arr, order="C")  # keeps 0-d constants 0-d
        steps.append({
            "node": s.node_name, "op": s.op, "kernel": [s.kernel.domain, s.kernel.op_type],
            "in": list(s.in_slots), "out": list(s.out_slots), "release": list(s.release),
            "attrs": s.prepared.attrs, "consts": sorted(set(s.prepared.consts) - set(borrowed) - rebuilt),
            "declared": [d if d is None or d == UNKNOWN_RANK else list(d) for d in s.declared],
            "const_shapes": {str(i): list(shape) for i, shape in s.const_shapes.items()},
        })
        if borrowed:
            steps[-1]["borrowed"] = borrowed
        if derived:
            steps[-1]["derived"] = derived
    header = {
        "name": program.name,
        "inputs": [[io.name, io.dtype, _shape(io.shape)] for io in program.inputs],
        "outputs": [[io.name, io.dtype, _shape(io.shape)] for io in program.outputs],
        "n_slots": program.n_slots,
        "output_slots": list(program.output_slots),
        "steps": steps,
    }
    try:
        json.dumps(header)
    except TypeError as exc:
        bad = next((s["node"] for s in steps if not _jsonable(s["attrs"])), "?")
        raise ProgramFormatError(f"program '{program.name}': prepared attributes of node '{bad}' are not "
                                 f"JSON-serializable: {exc}") from exc
    return header, arrays


def _derived_refs(p: Prepared, refs: BorrowedRefs | None, prefix: str, arrays: dict[str, np.ndarray]
                  ) -> list[dict[str, Any]]:
    """The step's derived constants (``Prepared.derived``): a cache entry stores their recipe and their
    sources, as references to the initializers ORT holds or, for small ones ORT handed over as copies, as arrays
    (put into ``arrays`` under ``prefix``), instead of their bytes."""
    out = []
    for j, d in enumerate(p.derived if refs is not None else ()):
        sources: dict[str, Any] = {}
        for role, arr in d.sources.items():
            ref = None if arr is None else refs.ref(arr)
            if arr is not None and ref is None:
                name = f"{prefix}derived{j}/{role}"
                arrays[name] = np.asarray(arr, order="C")
                ref = {"array": name}
            sources[role] = ref
        out.append({"recipe": d.recipe, "consts": dict(d.consts), "sources": sources, "params": dict(d.params)})
    return out


def _rebuild_derived(s: Mapping[str, Any], arrays: Mapping[str, np.ndarray], consts: dict[str, np.ndarray],
                     kept: list[DerivedConsts], refs: BorrowedRefs | None, where: str) -> None:
    """Recompute a step's derived constants from the loading session's initializers (entries from disk: every
    field is checked, and a recipe is only ever a name in ``kernels.registry.RECIPES``)."""
    derived = s.get("derived", [])
    if not isinstance(derived, list) or not all(isinstance(d, dict) for d in derived):
        raise ProgramFormatError(f"{where}: derived constants {derived!r} invalid")
    for d in derived:
        if refs is None:
            raise ProgramFormatError(f"{where}: derived constants refer to initializers, which only a cache entry "
                                     "may do")
        recipe = RECIPES.get(d["recipe"]) if isinstance(d.get("recipe"), str) else None
        names, params = d.get("consts"), d.get("params")
        if (recipe is None or not isinstance(names, dict) or not isinstance(params, dict)
                or not all(isinstance(v, str) for v in names.values())
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in params.values())):
            raise ProgramFormatError(f"{where}: derived constants {d!r} invalid")
        try:
            sources = {str(role): None if ref is None else arrays[ref["array"]] if set(ref) == {"array"}
                       else refs.resolve(ref, f"{where} source '{role}'") for role, ref in dict(d["sources"]).items()}
            made = recipe(sources, params)
        except (BorrowedRefError, KeyError, TypeError, ValueError) as exc:
            raise ProgramFormatError(f"{where}: derived constants ({d['recipe']}): {exc}") from exc
        if set(made) != set(names):
            raise ProgramFormatError(f"{where}: recipe {d['recipe']} made {sorted(made)}, the entry names "
                                     f"{sorted(names)}")
        for role, arr in made.items():
            consts[names[role]] = arr
        kept.append(DerivedConsts(d["recipe"], dict(names), sources, dict(params)))
        in_place = [c for c in consts.values() if isinstance(c, np.ndarray)]
        release_weight_pages(a for a in sources.values()  # as the compiler does once a step is prepared
                             if a is not None and not any(np.may_share_memory(a, c) for c in in_place))


def _shape(shape) -> list | None:
    return None if shape is None else list(shape)


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except TypeError:
        return False


def _declared(values: Any, what: str) -> tuple:
    """The steps' declared input shapes (for the static cost); absent in contexts written before they were kept."""
    def ok(d: Any) -> bool:
        return d is None or d == UNKNOWN_RANK or (
            isinstance(d, list) and all(x is None or isinstance(x, (int, str)) for x in d))

    if not isinstance(values, list) or not all(ok(d) for d in values):
        raise ProgramFormatError(f"{what}: declared shapes {values!r} invalid")
    return tuple(d if d is None or d == UNKNOWN_RANK else tuple(d) for d in values)


def _const_shapes(values: Any, what: str) -> dict[int, tuple[int, ...]]:
    """The steps' constant input shapes (input index -> shape; contexts written before they were a step field keep
    them in the attributes as ``_const_shapes``)."""
    if not isinstance(values, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in v) for k, v in values.items()):
        raise ProgramFormatError(f"{what}: constant shapes {values!r} invalid")
    return {int(k): tuple(v) for k, v in values.items()}


def _slots(values: Any, n_slots: int, what: str) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(isinstance(v, int) and -1 <= v < n_slots for v in values):
        raise ProgramFormatError(f"{what}: slot list {values!r} invalid for {n_slots} slots")
    return tuple(values)


def program_from_parts(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray], target: Target, *,
                       name: str | None = None, record: bool = False, refs: BorrowedRefs | None = None) -> Program:
    """Rebuild a program; every field is validated (the header came from disk). ``refs`` resolves constants stored
    as references to the loading session's initializers."""
    try:
        n_slots = int(header["n_slots"])
        io_in = [IoSpec(n, d, tuple(s) if s is not None else None) for n, d, s in header["inputs"]]
        io_out = [IoSpec(n, d, tuple(s) if s is not None else None) for n, d, s in header["outputs"]]
        steps = []
        for i, s in enumerate(header["steps"]):
            domain, op_type = s["kernel"]
            kernel = kernel_for(domain, op_type)
            if kernel is None:
                raise ProgramFormatError(f"step {i} (node '{s['node']}'): no kernel {domain}::{op_type} in this "
                                         "NpuEP build; recompile the model")
            consts = {}
            for cname in s["consts"]:
                key = f"{i}/{cname}"
                if key not in arrays:
                    raise ProgramFormatError(f"step {i} (node '{s['node']}'): array '{key}' missing")
                consts[cname] = arrays[key]
            where = f"step {i} (node '{s['node']}')"
            for cname, ref in dict(s.get("borrowed", {})).items():
                if refs is None:
                    raise ProgramFormatError(f"{where}: constant '{cname}' refers to an initializer, which only a "
                                             "cache entry may do")
                try:
                    consts[str(cname)] = refs.resolve(ref, f"{where} constant '{cname}'")
                except BorrowedRefError as exc:
                    raise ProgramFormatError(str(exc)) from exc
            derived: list[DerivedConsts] = []
            _rebuild_derived(s, arrays, consts, derived, refs, where)
            attrs = dict(s["attrs"])
            const_shapes = _const_shapes(s.get("const_shapes", attrs.pop("_const_shapes", {})), where)
            steps.append(Step(str(s["node"]), str(s["op"]), kernel, Prepared(attrs, consts, target, derived=derived),
                              _slots(s["in"], n_slots, where), _slots(s["out"], n_slots, where),
                              _slots(s["release"], n_slots, where), _declared(s.get("declared", []), where),
                              const_shapes))
        output_slots = _slots(header["output_slots"], n_slots, "outputs")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ProgramFormatError):
            raise
        raise ProgramFormatError(f"malformed program header: {type(exc).__name__}: {exc}") from exc
    produced = sum(len(st.out_slots) for st in steps)
    if not len(io_in) <= n_slots <= len(io_in) + produced:  # every slot is an input or some step's output
        raise ProgramFormatError(f"n_slots={n_slots} inconsistent with {len(io_in)} inputs and {produced} step "
                                 "outputs")
    written = set(range(len(io_in)))
    for st in steps:  # every step reads only slots an input or an earlier step wrote
        unread = [slot for slot in st.in_slots if slot >= 0 and slot not in written]
        if unread:
            raise ProgramFormatError(f"{st.describe()} reads slot(s) {unread} that nothing wrote before it")
        written.update(slot for slot in st.out_slots if slot >= 0)
    unwritten = [io_out[i].name for i, slot in enumerate(output_slots) if i < len(io_out) and slot not in written]
    if unwritten or len(output_slots) != len(io_out):
        raise ProgramFormatError(f"program outputs {unwritten or [io.name for io in io_out]} are never produced")
    return Program(name or str(header.get("name", "")), io_in, io_out, steps, n_slots, output_slots, target,
                   record=record)
