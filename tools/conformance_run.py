"""One conformance case through NpuEP and through the CPU EP alone, and its class (``npu_ep.tools.conformance``).

Classes (``Outcome.kind``):

- ``not_claimed``: NpuEP's session ran and ORT's graph assignment puts no node on NpuEP;
- ``right``: NpuEP ran nodes and every output matches the test's expected outputs or the CPU EP's (onnx's
  backend-runner comparison: shapes, dtypes, ``assert_allclose`` with the case's rtol/atol);
- ``wrong``: NpuEP ran nodes and an output matches neither;
- ``npu_error``: the NpuEP session fails to load or run (or crashes, or times out) where the CPU EP runs;
- ``both_fail``: the CPU EP loads the model but fails to run it, and NpuEP fails too;
- ``cpu_cannot_load``: the CPU EP alone cannot create a session (NpuEP is then not tried);
- ``no_data``: the case has no data set, or its files cannot be read.
"""

from __future__ import annotations

from ..ep.registration import get_ep_name

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .conformance_cases import Case
from .conformance_io import as_value, run

KINDS = ("right", "not_claimed", "wrong", "npu_error", "both_fail", "cpu_cannot_load", "no_data")
FAILING_KINDS = ("wrong", "npu_error")


@dataclass
class Outcome:
    """The class of one case and why; ``npu_nodes``/``nodes`` count ORT's assigned nodes (subgraphs included)."""

    key: str
    kind: str
    message: str = ""
    npu_nodes: int = 0
    nodes: int = 0
    cpu_matches_expected: bool | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_cpu(case: Case) -> tuple[str | None, list[list[Any]] | None, str]:
    """(load error, outputs per data set or None, run error) of the CPU EP alone."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(case.model, sess_options=_options(case, record=False),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - a conformance case ORT refuses is an outcome, not an error
        return _message(exc), None, ""
    try:
        return None, [run(sess, inputs) for inputs, _ in case.data_sets], ""
    except Exception as exc:  # noqa: BLE001 - as above, at run time
        return None, None, _message(exc)


def classify(case: Case, cpu_outputs: list[list[Any]] | None, cpu_error: str) -> Outcome:
    """Run ``case`` on NpuEP (CPU EP second, no silent fallback) and class it against the expected and CPU outputs
    (``cpu_outputs`` None: the CPU EP failed to run with ``cpu_error``)."""
    import onnxruntime as ort


    cpu_matches = None if cpu_outputs is None else all(
        _mismatch(want, got, case.rtol, case.atol) is None for (_, want), got in zip(case.data_sets, cpu_outputs))
    outcome = Outcome(case.key, "", cpu_matches_expected=cpu_matches)
    failed_kind = "npu_error" if cpu_outputs is not None else "both_fail"
    try:
        sess = ort.InferenceSession(case.model, sess_options=_options(case, record=True),
                                    providers=[(get_ep_name(), {"cache_dir": "", "log_level": "error"}),
                                               "CPUExecutionProvider"],
                                    enable_fallback=0)
        where = [sg.ep_name for sg in sess.get_provider_graph_assignment_info() for _ in sg.get_nodes()]
        outcome.nodes, outcome.npu_nodes = len(where), where.count(get_ep_name())
        npu_outputs = [run(sess, inputs) for inputs, _ in case.data_sets]
    except Exception as exc:  # noqa: BLE001 - NpuEP's failure is the outcome this case reports
        outcome.kind, outcome.message = failed_kind, _message(exc)
        if cpu_outputs is None:
            outcome.message += f" | CPU EP: {cpu_error}"
        return outcome
    if outcome.npu_nodes == 0:
        outcome.kind = "not_claimed"
        return outcome
    problems = []
    for index, ((_, want), got) in enumerate(zip(case.data_sets, npu_outputs)):
        versus_expected = _mismatch(want, got, case.rtol, case.atol)
        versus_cpu = None if cpu_outputs is None else _mismatch(cpu_outputs[index], got, case.rtol, case.atol)
        if versus_expected is not None and (cpu_outputs is None or versus_cpu is not None):
            problems.append(f"data set {index}: vs expected: {versus_expected}"
                            + (f" | vs CPU EP: {versus_cpu}" if versus_cpu is not None else ""))
    outcome.kind, outcome.message = ("wrong", "; ".join(problems)) if problems else ("right", "")
    return outcome


def _options(case: Case, *, record: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not case.ort_optimizations:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    if record:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


def _mismatch(want: list[Any], got: list[Any], rtol: float, atol: float) -> str | None:
    """None if ``got`` passes onnx's backend-runner comparison against ``want``, else its message (one line).
    Sequences are compared element by element (onnx's runner recurses with one element as a list of outputs,
    which fails on a sequence of scalars)."""
    if len(want) != len(got):
        return f"{len(got)} outputs, expected {len(want)}"
    for index, (w, g) in enumerate(zip(want, got)):
        problem = _value_mismatch(as_value(w), g, rtol, atol)
        if problem is not None:
            return f"output {index}: {problem}"
    return None


def _value_mismatch(want: Any, got: Any, rtol: float, atol: float) -> str | None:
    if want is None or got is None:
        return None if want is None and got is None else f"got {_kind(got)}, expected {_kind(want)}"
    if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):
        if not isinstance(want, (list, tuple)) or not isinstance(got, (list, tuple)) or len(want) != len(got):
            return f"got {_kind(got)}, expected {_kind(want)}"
        for index, (w, g) in enumerate(zip(want, got)):
            problem = _value_mismatch(w, g, rtol, atol)
            if problem is not None:
                return f"sequence element {index}: {problem}"
        return None
    want, got = np.asarray(want), np.asarray(got)
    try:
        np.testing.assert_array_equal(got.shape, want.shape, err_msg="incorrect shape")
        if want.dtype == object:
            np.testing.assert_array_equal(got, want)
            return None
        np.testing.assert_equal(got.dtype, want.dtype)
        if want.dtype.name == "bfloat16":  # as onnx's runner: two bfloat16 ulps, compared in float32
            rtol, want, got = max(rtol, 2 ** -6), want.astype(np.float32), got.astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except (AssertionError, TypeError, ValueError) as exc:
        return " ".join(str(exc).split())[:600]
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return f"a sequence of {len(value)}"
    return f"a tensor of shape {np.shape(value)}"


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:1000]
