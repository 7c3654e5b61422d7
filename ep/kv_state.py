"""Stateful KV for a session (callers without IOBinding; OpenVINO's stateful models): NpuEP keeps each sequence's
K/V of every GroupQueryAttention node between runs. The contract is ``kernels.ops._kv_state``'s (README,
"Stateful KV"): feed empty pasts, get empty presents; total_sequence_length == S starts a new prompt; sequences
are named with ``state.sequence(name)``.

    so = ort.SessionOptions(); npu_ep.ep.sessions.tag_session_options(so)
    sess = ort.InferenceSession(model, so, providers=[(npu_ep.get_ep_name(), {}), "CPUExecutionProvider"])
    state = enable(sess, capacity=1024)
    with state.sequence("chat-1"):
        sess.run(None, feeds)
"""

from __future__ import annotations

from typing import Any

from ..kernels.ops._kv_state import DEFAULT, KvState, KvStateError
from .sessions import session_of

__all__ = ["DEFAULT", "KvState", "KvStateError", "enable", "gqa_steps"]

GQA = "com.microsoft::GroupQueryAttention"


def gqa_steps(sess: Any) -> list:
    """The Prepared of every GroupQueryAttention step NpuEP runs for ``sess`` (an ORT session whose options were
    tagged, or its EpSession)."""
    ep = sess if hasattr(sess, "programs") else session_of(sess)
    return [st.prepared for program in list(ep.programs.values()) for st in program.steps if st.op == GQA]


def enable(sess: Any, capacity: int) -> KvState:
    """Give every GroupQueryAttention node of ``sess`` a stateful KV of ``capacity`` tokens per sequence; returns
    the session's state (the same object if it was enabled before with this capacity)."""
    steps = gqa_steps(sess)
    if not steps:
        raise ValueError("stateful KV: NpuEP runs no GroupQueryAttention node of this session (rewrite the decoder "
                         "with npu-rewrite --passes ...,gqa, and check the graph assignment)")
    state = steps[0].runtime.kv_state
    if state is None or state.capacity != int(capacity):
        state = KvState(capacity)
        for p in steps:
            p.runtime.kv_state = state  # a guarded field: a native step bound before declines from now on
    return state
