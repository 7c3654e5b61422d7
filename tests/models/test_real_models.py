"""Real pretrained models from pip packages (OCR detector/recognizer/classifier, Silero VAD) on NpuEP as the user
loads them (no rewrite): the application's decision is unchanged, the outputs match the CPU EP, and NpuEP really
ran nodes (graph assignment). The packages are installed by ``./run`` (``--no-deps``); without them these skip.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from npu_ep.models.corpus import CORPUS, RealModel
from tests.npu_testing import assignment, npu_partitions, npu_session

REL_TOL = 1e-3  # of the output's largest magnitude (issue 13: logits within 1e-3 relative)
# Reached on npu-ref (share of nodes on NpuEP, most partitions), kept as floors so coverage cannot slide back.
# Issue 13's target is >= 95% in <= 3 partitions: the OCR models meet it, the VADs miss it on If (ORT partitions
# each branch separately).
REACHED = {"ocr-cls": (1.00, 1), "ocr-det": (1.00, 1), "ocr-rec": (1.00, 1),
           "vad": (1.00, 1), "vad-op15": (1.00, 1), "vad-half": (1.00, 1)}


def _installed(m: RealModel):
    path = m.path()
    if path is None:
        pytest.skip(f"{m.package} is not installed (./run installs it with --no-deps)")
    return str(path)


def _run_stream(sess: ort.InferenceSession, m: RealModel, chunks: int) -> list[np.ndarray]:
    """One call for stateless models; for the VADs, ``chunks`` calls carrying ``stateN`` back into ``state``."""
    rng = np.random.default_rng(0)
    feeds = m.feeds(rng)
    names = [o.name for o in sess.get_outputs()]
    if "state" not in feeds:
        return sess.run(None, feeds)
    probs = []
    for _ in range(chunks):
        out = dict(zip(names, sess.run(None, feeds)))
        probs.append(out["output"])
        feeds = {**m.feeds(rng), "state": out["stateN"]}
    return [np.concatenate(probs), out["stateN"]]


@pytest.mark.parametrize("m", CORPUS, ids=[m.name for m in CORPUS])
def test_real_model_on_npuep_keeps_the_applications_decision_and_matches_cpu(m: RealModel):
    path = _installed(m)
    npu = npu_session(path)
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got, want = _run_stream(npu, m, 6), _run_stream(cpu, m, 6)
    ran = assignment(npu)
    on_npu = sum(ep == "NpuEP" for ep in ran.values())
    n_parts = len(npu_partitions(npu))
    print(f"\n{m.name}: {on_npu}/{len(ran)} nodes on NpuEP in {n_parts} partitions")
    assert on_npu > 0
    share, most_parts = REACHED[m.name]
    assert on_npu >= share * len(ran) and n_parts <= most_parts, (on_npu, len(ran), n_parts)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w).max()), 1e-6)
        assert float(np.abs(g.astype(np.float64) - w).max()) <= REL_TOL * scale
    if m.name == "ocr-det":  # pixels within 1e-3 of the threshold may flip on float rounding alone
        firm = np.abs(want[0] - 0.3) > 1e-3
        np.testing.assert_array_equal(m.decision(got)[firm], m.decision(want)[firm])
    else:
        np.testing.assert_array_equal(m.decision(got), m.decision(want))
