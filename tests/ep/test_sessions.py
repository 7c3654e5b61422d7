"""session_of: the EpSession behind each of several InferenceSessions created concurrently."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import npu_ep
from npu_ep.ep.sessions import session_of, tag_session_options
from tests.npu_testing import make_model


def _model(scale: float):
    return make_model([helper.make_node("Mul", ["x", "s"], ["y"], name=f"mul_{int(scale)}")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                      {"s": np.full((4,), scale, np.float32)}).SerializeToString()


def test_each_concurrently_created_session_finds_its_own_ep_session():
    sessions: dict[int, ort.InferenceSession] = {}

    def create(i: int) -> None:
        so = ort.SessionOptions()
        tag_session_options(so)
        sessions[i] = ort.InferenceSession(_model(float(i)), so, providers=[(npu_ep.get_ep_name(), {"cache_dir": ""})],
                                           enable_fallback=0)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, sess in sessions.items():
        ep = session_of(sess)
        steps = [st.node_name for p in ep.programs.values() for st in p.steps]
        assert steps == [f"mul_{i}"]


def test_untagged_session_is_a_clear_error():
    sess = ort.InferenceSession(_model(2.0), providers=[(npu_ep.get_ep_name(), {"cache_dir": ""})])
    with pytest.raises(LookupError, match="tag_session_options"):
        session_of(sess)
