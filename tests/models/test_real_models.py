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
           "vad": (1.00, 1), "vad-op15": (1.00, 1), "vad-half": (1.00, 1), "vad-v6": (1.00, 1),
           "yolov8n": (1.00, 1), "crnn": (1.00, 1), "yolox-det": (1.00, 1), "picodet-layout": (1.00, 1),
           "lcnet-orientation": (1.00, 1), "magika": (1.00, 1),
           "crnn-int8": (1.00, 1)}
# A dynamically quantized model re-derives each activation's scale from its min and max: the first Sigmoid's
# output differs from MLAS's logistic approximation by up to 1.8e-7 (ours is exp-based, within an ulp of exact),
# the next DynamicQuantizeLinear's scale by one ulp, and codes shift from there: 9.2e-3 of the logits' scale
# measured, with the recognized text unchanged. The CPU EP at any optimization level gives itself the same bits.
REL_TOL_BY_MODEL = {"crnn-int8": 1.5e-2}


def _installed(m: RealModel):
    path = m.path()
    if path is None:
        pytest.skip(f"{m.package} is not installed (./run installs it with --no-deps)")
    return str(path)


def _run_stream(sess: ort.InferenceSession, m: RealModel, chunks: int) -> list[np.ndarray]:
    """One call for stateless models; for the VADs, ``chunks`` calls carrying their state outputs back in."""
    rng = np.random.default_rng(0)
    feeds = m.feeds(rng)
    names = [o.name for o in sess.get_outputs()]
    if not m.state:
        return sess.run(None, feeds)
    probs = []
    for _ in range(chunks):
        out = dict(zip(names, sess.run(None, feeds)))
        probs.append(out[names[0]])
        feeds = {**m.feeds(rng), **{inp: out[o] for o, inp in m.state}}
    return [np.concatenate(probs), *(out[o] for o, _ in m.state)]


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
        assert float(np.abs(g.astype(np.float64) - w).max()) <= REL_TOL_BY_MODEL.get(m.name, REL_TOL) * scale
    if m.firm is not None:  # elements within 1e-3 of a threshold may flip on float rounding alone
        firm = m.firm(want)
        np.testing.assert_array_equal(m.decision(got)[firm], m.decision(want)[firm])
    else:
        np.testing.assert_array_equal(m.decision(got), m.decision(want))
