"""Up-front validation of the model ``npu-report`` is given, and ORT errors turned into one-line input errors.

Why up front: the report walks the graph (capability, partitions, crossings, cost model). On an invalid graph that
walk either produces a confident but wrong report (a cycle, an input nothing produces) or dies deep inside with a
numpy traceback (an initializer declaring more elements than its data holds). The user needs one line naming the
file and the reason, and exit code 2, like ``npu-rewrite``.

Checks, in order (each failure is a ``ReportInputError``):

1. the file exists and parses as an ONNX ``ModelProto`` (external data must stay inside the model's folder);
2. structure the report itself relies on: a graph with nodes or outputs, an IR version, opsets this ONNX knows,
   every tensor's data as large as its declared shape (``onnx.checker.check_tensor``, no allocation), node inputs
   defined before use (graph input, initializer or earlier node output: catches cycles and missing initializers);
3. ``onnx.checker.check_model(full_check=True)`` (strict shape inference) where it applies: when every node of the
   ONNX domains has an ONNX schema. ORT's rewritten models put ops such as ``SimplifiedLayerNormalization`` in
   the default domain; the checker rejects those although ORT runs them, so for such models step 3 is skipped
   and the document says why (``validation.checker``).

With ``--run`` ORT itself is the last check: ``ort_error`` words its refusal (session creation or the CPU EP
run) as an input error naming the file.
"""

from __future__ import annotations

import os
import re
from typing import Any

import onnx

from ...log import escape
from ...ep.onnx_graph import all_tensors
from ..model_file import NotRegularFileError, external_data_locations, load_model_file, read_regular_file

ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_PROTO_LIMIT = 2**31 - 1  # protobuf cannot serialize more in one message: check large models by path


class ReportInputError(ValueError):
    """Bad user input (model, dims, target): the CLI prints it in one line and exits with 2."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def ort_message(exc: BaseException, limit: int = 400) -> str:
    """The first line of an ORT error without its C++ source prefix: ``EP_FAIL : NpuEP: ...``."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    first = first.rsplit("[ONNXRuntimeError] : ", 1)[-1]
    return re.sub(r"^\d+ : ", "", first)[:limit]


def ort_error(where: str, what: str, exc: BaseException) -> ReportInputError:
    """``exc`` raised by ONNX Runtime while doing ``what``, as a one-line input error naming the file."""
    return ReportInputError(f"{where}: ONNX Runtime cannot {what}: {ort_message(exc)}")


def ort_exceptions() -> tuple[type[BaseException], ...]:
    """ORT's pybind exception types (they derive from ``Exception`` only, not from ``RuntimeError``)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as st

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(st, n) for n in names if hasattr(st, n))


def _node(n: onnx.NodeProto) -> str:
    return f"node '{escape(n.name) if n.name else '<unnamed>'}' ({escape(n.op_type)})"


def check_structure(model: onnx.ModelProto, where: str) -> None:
    """Step 2 of the module docstring."""
    g = model.graph
    if not model.HasField("graph") or (not g.node and not g.output):
        raise ReportInputError(f"{where}: empty ONNX model (no graph nodes or outputs)")
    if model.ir_version <= 0:
        raise ReportInputError(f"{where}: invalid ONNX model: no ir_version set")
    if model.ir_version > onnx.IR_VERSION:
        raise ReportInputError(f"{where}: IR version {model.ir_version} is newer than this ONNX supports "
                               f"({onnx.IR_VERSION})")
    opsets = {o.domain or "": o.version for o in model.opset_import}
    newest = onnx.defs.onnx_opset_version()
    for domain in ("", "ai.onnx"):
        if opsets.get(domain, 0) > newest:
            raise ReportInputError(f"{where}: opset {opsets[domain]} of the ONNX domain is newer than this "
                                   f"ONNX supports ({newest})")
    for t in all_tensors(g):
        try:
            onnx.checker.check_tensor(t)
        except Exception as exc:  # noqa: BLE001 - any checker failure is bad input
            raise ReportInputError(f"{where}: invalid tensor '{escape(t.name)}': {_one_line(exc)}") from None
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    produced_later = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if (n.domain or "") in ONNX_DOMAINS and "" not in opsets and "ai.onnx" not in opsets:
            raise ReportInputError(f"{where}: {_node(n)} uses the ONNX domain but the model imports no ONNX opset")
        for name in n.input:
            if name in defined:
                continue
            if name in produced_later:
                raise ReportInputError(f"{where}: {_node(n)} reads '{escape(name)}' before "
                                       f"{_node(produced_later[name])} produces it (a cycle, or nodes not in "
                                       "topological order)")
            raise ReportInputError(f"{where}: {_node(n)} reads '{escape(name)}', which is no graph input, initializer "
                                   "or node output (missing initializer?)")
        defined.update(n.output)
    names = {o.name for o in g.output}
    missing = sorted(names - defined)
    if missing:
        raise ReportInputError(f"{where}: graph output '{escape(missing[0])}' is produced by no node")


def _without_schema(model: onnx.ModelProto) -> list[str]:
    """Ops in the ONNX domains that have no ONNX schema at the model's opset (ORT-only ops such as
    ``SimplifiedLayerNormalization``)."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    missing = set()
    for n in model.graph.node:
        domain = n.domain or ""
        if domain not in ONNX_DOMAINS:
            continue
        version = opsets.get(domain, opsets.get("ai.onnx" if domain == "" else "", 1))
        try:
            onnx.defs.get_schema(n.op_type, version, "" if domain == "ai.onnx" else domain)
        except onnx.defs.SchemaError:
            missing.add(n.op_type)
    return sorted(missing)


def run_checker(model: onnx.ModelProto, where: str, path: str | None) -> str:
    """Step 3; returns what was checked ("full" or "skipped: ..."), for the document."""
    unknown = _without_schema(model)
    if unknown:
        return f"skipped: ops without an ONNX schema in the ONNX domain ({', '.join(unknown[:5])})"
    try:
        if path is not None and model.ByteSize() > _PROTO_LIMIT:
            onnx.checker.check_model(path, full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError, ...
        raise ReportInputError(f"{where}: invalid ONNX model (onnx.checker, full check): {_one_line(exc)}"
                               " (--no-check skips this check)") from None
    return "full"


def files_read_by(path: str | os.PathLike) -> list[str]:
    """The model file and the external data files it names (unreadable models: just the file; the report's own
    validation says what is wrong with them)."""
    files = [os.fspath(path)]
    try:
        model = onnx.load_model_from_string(read_regular_file(path))
    except Exception:  # noqa: BLE001 - load_checked reports it (a FIFO is never opened for a blocking read)
        return files
    base = os.path.dirname(os.fspath(path))
    return files + [os.path.join(base, location) for location in external_data_locations(model)]


def _read_model(path: str) -> onnx.ModelProto:
    """Step 1: the file (and its external data files) read only if regular files (``tools/model_file.py``)."""
    try:
        return load_model_file(path)
    except NotRegularFileError as exc:
        raise ReportInputError(str(exc)) from None
    except FileNotFoundError as exc:
        missing = exc.filename or path
        raise ReportInputError(f"model file not found: {path}" if missing == path else
                               f"{path}: its external data file {missing} does not exist") from None
    except OSError as exc:
        raise ReportInputError(f"cannot read {exc.filename or path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - protobuf and onnx raise many types on garbage
        raise ReportInputError(f"cannot read ONNX model {path}: {_one_line(exc)}") from None


def load_checked(model_or_path: Any, *, checker: bool = True) -> tuple[onnx.ModelProto, str, dict[str, str]]:
    """(model, where, validation summary) after steps 1-3; ``checker=False`` skips step 3 only."""
    if isinstance(model_or_path, onnx.ModelProto):
        model, where, path = model_or_path, "<ModelProto>", None
    else:
        try:
            path = os.fspath(model_or_path)
        except TypeError:
            raise ReportInputError(f"cannot report on a {type(model_or_path).__name__}: pass a path, a "
                                   "ModelProto or an InferenceSession") from None
        where = path
        model = _read_model(path)
    check_structure(model, where)
    summary = {"structure": "ok", "checker": run_checker(model, where, path) if checker else "disabled (--no-check)"}
    return model, where, summary
