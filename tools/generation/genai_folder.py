"""An onnxruntime-genai model folder read for ``npu-generate``: the decoder file, its I/O names, the special token
ids and the provider options that ``genai_config.json`` declares (``model.decoder.session_options``).

Only data is read (JSON); the decoder file must lie inside the folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .model_info import IoNames

CONFIG = "genai_config.json"
# genai_config.json's decoder input/output keys -> IoNames fields
_INPUTS = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
           "past_key_names": "past_key", "past_value_names": "past_value"}
_OUTPUTS = {"logits": "logits", "present_key_names": "present_key", "present_value_names": "present_value"}


@dataclasses.dataclass(frozen=True)
class GenaiFolder:
    folder: Path
    model: Path  # the decoder .onnx
    io: IoNames
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    context_length: int | None
    provider_options: dict[str, dict[str, str]]  # provider name -> options, in the file's order


def is_genai_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def _ints(value: Any, where: str) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: expected an integer or a list of integers, got {value!r}")
    return tuple(values)


def _io(decoder: Mapping[str, Any], where: str) -> IoNames:
    names: dict[str, str | None] = {"position_ids": None}  # genai feeds position_ids only when it is declared
    for section, keys in (("inputs", _INPUTS), ("outputs", _OUTPUTS)):
        declared = decoder.get(section, {})
        if not isinstance(declared, dict):
            raise ValueError(f"{where}: model.decoder.{section} must be an object")
        for key, field in keys.items():
            if key in declared:
                if not isinstance(declared[key], str) or not declared[key]:
                    raise ValueError(f"{where}: model.decoder.{section}.{key} must be a non-empty string")
                names[field] = declared[key]
    for field in ("past_key", "past_value", "present_key", "present_value"):
        value = names.get(field)
        if value is not None and value.count("%d") != 1:
            raise ValueError(f"{where}: the {field.replace('_', ' ')} names {value!r} need one %d (the layer index)")
    return IoNames(**{k: v for k, v in names.items()})


def _provider_options(session_options: Mapping[str, Any], where: str) -> dict[str, dict[str, str]]:
    """``"provider_options": [{"NpuEP": {"target": "npu-ref"}}, ...]`` -> {"NpuEP": {"target": "npu-ref"}, ...}."""
    entries = session_options.get("provider_options", [])
    if not isinstance(entries, list):
        raise ValueError(f"{where}: model.decoder.session_options.provider_options must be a list")
    out: dict[str, dict[str, str]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not all(isinstance(v, dict) for v in entry.values()):
            raise ValueError(f"{where}: each provider_options entry must be "
                             f"{{\"<provider>\": {{\"key\": \"value\"}}}}, got {entry!r}")
        for name, opts in entry.items():
            out[name] = {str(k): str(v) for k, v in opts.items()}
    return out


def load_genai_folder(path: str | os.PathLike) -> GenaiFolder:
    """Read ``path/genai_config.json``; a ValueError names the file and the field for anything it cannot use."""
    folder = Path(path)
    where = str(folder / CONFIG)
    try:
        with open(folder / CONFIG, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(decoder, dict):
        raise ValueError(f"{where}: no model.decoder object")
    filename = decoder.get("filename")
    if not isinstance(filename, str) or not filename:
        raise ValueError(f"{where}: model.decoder.filename must name the decoder .onnx")
    onnx_path = (folder / filename).resolve()
    if folder.resolve() not in onnx_path.parents:
        raise ValueError(f"{where}: model.decoder.filename {filename!r} points outside the model folder")
    if not onnx_path.is_file():
        raise ValueError(f"{where}: model.decoder.filename {filename!r}: no such file in {folder}")
    session_options = decoder.get("session_options", {})
    if not isinstance(session_options, dict):
        raise ValueError(f"{where}: model.decoder.session_options must be an object")
    eos = model.get("eos_token_id")
    return GenaiFolder(
        folder=folder, model=onnx_path, io=_io(decoder, where),
        eos_token_ids=_ints(eos, f"{where}: model.eos_token_id") if eos is not None else (),
        bos_token_id=_ints(model["bos_token_id"], f"{where}: model.bos_token_id")[0]
        if "bos_token_id" in model else None,
        pad_token_id=_ints(model["pad_token_id"], f"{where}: model.pad_token_id")[0]
        if "pad_token_id" in model else None,
        context_length=_ints(model["context_length"], f"{where}: model.context_length")[0]
        if "context_length" in model else None,
        provider_options=_provider_options(session_options, where))
