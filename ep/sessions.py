"""Finding the EpSession behind an InferenceSession: the one API reports, benchmarks and generation use.

ORT gives no handle from an InferenceSession to its EP instances, and matching by node names or by "the session
created last" mixes up sessions created concurrently. A unique session config entry does not: ORT hands the
whole session config to the EP (``EpSession.config``), and the InferenceSession keeps its options.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from .entry_points import LIVE_SESSIONS, EpSession

if TYPE_CHECKING:
    import onnxruntime as ort

SESSION_TAG_KEY = "npu_ep.session_tag"


def tag_session_options(so: ort.SessionOptions) -> str:
    """Give ``so`` a unique tag so that ``session_of`` finds the EpSession of the InferenceSession created with
    it. Returns the tag."""
    tag = uuid.uuid4().hex
    so.add_session_config_entry(SESSION_TAG_KEY, tag)
    return tag


def session_of(inference_session: ort.InferenceSession) -> EpSession:
    """The EpSession behind an InferenceSession whose options were tagged by ``tag_session_options``."""
    try:
        tag = inference_session.get_session_options().get_session_config_entry(SESSION_TAG_KEY)
    except RuntimeError:  # ORT raises for a key that was never set
        tag = ""
    if not tag:
        raise LookupError("this InferenceSession's options carry no NpuEP session tag: create it with options "
                          "passed through npu_ep.ep.sessions.tag_session_options")
    found = [ep for ep in list(LIVE_SESSIONS) if ep.config.get(SESSION_TAG_KEY) == tag]
    if not found:
        raise LookupError("no live NpuEP session carries this InferenceSession's tag (is NpuEP in its providers?)")
    return found[-1]
