"""KV resident across runs (issue 41 item 2) on a tiny rewritten decoder (RoPE + GQA + int4, 4 layers):

* IOBinding of each layer's past and present to ONE OrtValue of C slots (ORT's GroupQueryAttention shared-buffer
  mode): NpuEP's GroupQueryAttention (native kernel, its bound step, and the numpy reference) appends the S new rows
  at L..L+S-1 in place and leaves every other slot as it was, as the CPU EP does: tokens equal to the CPU EP doing
  the same binding, logits within float32 reordering, the slots past the valid length keep what the caller put
  there, and the nodes' KV counters show appends in place and no copy of the past.
* the stateful KV (``ep.kv_state``) for callers without IOBinding: empty pasts fed, the KV kept per sequence
  between runs; its contract, capacity overflow, isolation of sequences and sessions, and a reset after an error.

Every GroupQueryAttention node runs on NpuEP (ORT's graph assignment); the CPU EP is the reference.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npu_ep.ep.kv_state import enable, gqa_steps
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels.ops import _kv_traffic
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import inspect_model
from npu_ep.tools.generation.resident import ResidentKv
from tests.npu_testing import assignment, npu_session, session_options

PROMPT = [3, 17, 5, 99, 12, 7, 8, 41, 2]
STEPS = 12
CAPACITY = 48
SENTINEL = 7.25  # what the caller left in the free slots: in-place updates must not touch it
TOL = dict(rtol=1e-4, atol=1e-4)  # logits: float32 sums in another order than the CPU EP's


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    d = tmp_path_factory.mktemp("kv_resident")
    path = rewrite(str(build_tiny_llama(d / "tiny.onnx")), passes=("cleanup", "rope", "gqa", "int4")).save(
        d / "tiny.npu.onnx")
    return str(path), inspect_model(onnx.load(str(path), load_external_data=False))


def _npu(path: str, kernels: str = "native") -> ort.InferenceSession:
    so = session_options()
    tag_session_options(so)
    sess = npu_session(path, {"kernels": kernels}, so=so)
    gqa = [name for name, ep in assignment(sess).items() if "GroupQueryAttention" in name]
    assert gqa and all(assignment(sess)[n] == "NpuEP" for n in gqa)
    return sess


def _cpu(path: str) -> ort.InferenceSession:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _feeds(info, ids: list[int], start: int, mask: np.ndarray) -> dict[str, np.ndarray]:
    feeds = {info.io.input_ids: np.array([ids], np.int64), info.io.attention_mask: mask}
    if info.feeds_position_ids:
        feeds[info.io.position_ids] = np.arange(start, start + len(ids), dtype=np.int64)[None]
    return feeds


def _generate_bound(sess, info, prompt=PROMPT) -> tuple[list[int], list[np.ndarray], ResidentKv]:
    """Greedy tokens with past and present bound to one buffer per layer (free slots hold SENTINEL)."""
    cache = ResidentKv(info, CAPACITY)
    for a in cache.keys + cache.values:
        a[...] = SENTINEL
    ids, tokens, rows = list(prompt), [], []
    for step in range(STEPS):
        io = cache.bind(sess, _feeds(info, ids, cache.length, cache.mask(len(ids), step == 0)), [info.io.logits])
        sess.run_with_iobinding(io)
        row = io.get_outputs()[-1].numpy()[0, -1]
        cache.advance(len(ids))
        rows.append(row)
        tokens.append(int(np.argmax(row)))
        ids = [tokens[-1]]
    return tokens, rows, cache


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_past_and_present_bound_to_one_buffer_update_in_place(decoder, kernels):
    path, info = decoder
    sess = _npu(path, kernels)
    got, got_rows, cache = _generate_bound(sess, info)
    want, want_rows, want_cache = _generate_bound(_cpu(path), info)
    assert got == want
    for g, w in zip(got_rows, want_rows):
        np.testing.assert_allclose(g, w, **TOL)
    written = len(PROMPT) + STEPS - 1  # the last token's K/V are written by the step that would follow it
    for layer in range(info.n_layers):
        for g, w in zip(cache.valid(layer), want_cache.valid(layer)):
            np.testing.assert_allclose(g, w, **TOL)
        for buf in (cache.keys[layer], cache.values[layer]):
            assert np.all(buf[:, :, written:] == SENTINEL)  # slots past L + S untouched (no copy, no zeroing)
    row = 2 * info.kv_heads * info.head_dim * 4
    assert _kv_traffic.total(gqa_steps(sess)) == {
        "in_place": info.n_layers * STEPS, "appended_bytes": info.n_layers * written * row, "copied_bytes": 0,
        "full_copies": 0}


def test_a_past_fed_without_binding_is_counted_as_a_full_copy(decoder):
    """The counters tell the copying path apart: a decode step fed the past as a plain input copies it into a
    fresh present (every layer, every step)."""
    path, info = decoder
    sess = _npu(path)
    past = np.zeros((1, info.kv_heads, CAPACITY, info.head_dim), np.float32)
    held = 20
    mask = np.zeros((1, CAPACITY + 1), np.int64)
    mask[0, :held] = 1
    mask[0, -1] = 1
    feeds = _feeds(info, [5], held, mask)
    feeds.update({name % i: past for i in range(info.n_layers) for name in (info.io.past_key, info.io.past_value)})
    for _ in range(2):
        sess.run(None, feeds)
    row = 2 * info.kv_heads * info.head_dim * 4
    assert _kv_traffic.total(gqa_steps(sess)) == {
        "in_place": 0, "appended_bytes": 2 * info.n_layers * row, "copied_bytes": 2 * info.n_layers * held * row,
        "full_copies": 2 * info.n_layers}


# -- stateful KV (no IOBinding) ------------------------------------------------------------------------------------
def _stateful_feeds(info, ids: list[int], held: int) -> dict[str, np.ndarray]:
    """A run of the stateful contract: empty pasts, attention_mask over held + new tokens."""
    feeds = _feeds(info, ids, held, np.ones((1, held + len(ids)), np.int64))
    empty = np.zeros((1, info.kv_heads, 0, info.head_dim), np.float32)
    feeds.update({name % i: empty for i in range(info.n_layers) for name in (info.io.past_key, info.io.past_value)})
    return feeds


class _Stateful:
    """One sequence's greedy generation on a stateful session, a step at a time."""

    def __init__(self, sess, info, state, name: str):
        self.sess, self.info, self.state, self.name = sess, info, state, name
        self.held, self.ids, self.tokens, self.rows = 0, list(PROMPT), [], []

    def step(self) -> None:
        with self.state.sequence(self.name):
            logits, present = self.sess.run([self.info.io.logits, self.info.io.present_key % 0],
                                            _stateful_feeds(self.info, self.ids, self.held))
        assert present.shape == (1, self.info.kv_heads, 0, self.info.head_dim)  # the KV stays in the state
        self.held += len(self.ids)
        self.rows.append(logits[0, -1])
        self.tokens.append(int(np.argmax(logits[0, -1])))
        self.ids = [self.tokens[-1]]


def _stateful_session(path: str, capacity: int = CAPACITY):
    sess = _npu(path)
    return sess, enable(sess, capacity)


def test_stateful_kv_keeps_the_sequence_between_runs(decoder):
    """Empty pasts in, empty presents out: the tokens of the CPU EP with the KV bound in place, every step an
    in-place append into the node's state."""
    path, info = decoder
    sess, state = _stateful_session(path)
    run = _Stateful(sess, info, state, "default")
    for _ in range(STEPS):
        run.step()
    want, want_rows, _ = _generate_bound(_cpu(path), info)
    assert run.tokens == want
    for g, w in zip(run.rows, want_rows):
        np.testing.assert_allclose(g, w, **TOL)
    assert state.length("default") == [len(PROMPT) + STEPS - 1]
    traffic = _kv_traffic.total(gqa_steps(sess))
    assert traffic["in_place"] == info.n_layers * STEPS and traffic["full_copies"] == traffic["copied_bytes"] == 0


def test_stateful_overflow_is_a_clear_error_and_writes_nothing(decoder):
    path, info = decoder
    capacity = len(PROMPT) + 2
    sess, state = _stateful_session(path, capacity)
    run = _Stateful(sess, info, state, "s")
    for _ in range(3):  # the prompt and two tokens: the capacity is full
        run.step()
    before = [seq.kv.copy() for seq in state._sequences.values()]
    with pytest.raises(Exception, match=rf"{capacity} held \+ 1 new tokens exceed the stateful KV capacity of "
                                        rf"{capacity} tokens; nothing was written"):
        run.step()
    assert state.length("s") == [capacity]
    for seq, old in zip(state._sequences.values(), before):
        np.testing.assert_array_equal(seq.kv, old)


def test_stateful_continuation_must_match_what_the_sequence_holds(decoder):
    path, info = decoder
    sess, state = _stateful_session(path)
    run = _Stateful(sess, info, state, "s")
    run.step()
    run.held -= 2  # the caller lost count: continues from 7 while the sequence holds 9
    with pytest.raises(Exception, match=r"sequence 's' holds \[9\] tokens per batch row but the run continues from "
                                        r"\[7\]"):
        run.step()
    with (pytest.raises(Exception, match="sequence 'other' holds no tokens: its first run must be a new prompt"),
          state.sequence("other")):
        sess.run(None, _stateful_feeds(info, [5], 3))


def test_stateful_sequences_and_sessions_never_see_each_others_writes(decoder):
    """Two sequences of one session and a second session, each run on its own thread at the same time (a
    sequence is named per thread): each gives bitwise the logits of its prompt alone on a fresh session."""
    path, info = decoder
    prompts = (PROMPT, PROMPT[::-1], PROMPT)
    alone = []
    for prompt in prompts[:2]:
        sess, state = _stateful_session(path)
        run = _Stateful(sess, info, state, "alone")
        run.ids = list(prompt)
        for _ in range(6):
            run.step()
        alone.append(run.rows)
    sess, state = _stateful_session(path)
    other_sess, other_state = _stateful_session(path)
    runs = [_Stateful(sess, info, state, "a"), _Stateful(sess, info, state, "b"),
            _Stateful(other_sess, info, other_state, "a")]
    for run, prompt in zip(runs, prompts):
        run.ids = list(prompt)
    errors = []

    def go(run):
        try:
            for _ in range(6):
                run.step()
        except Exception as exc:  # noqa: BLE001 - reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(run,)) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for run, want in zip(runs, (alone[0], alone[1], alone[0])):
        for g, w in zip(run.rows, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_a_new_prompt_after_an_error_starts_clean(decoder):
    """After an overflow, a new prompt (total_sequence_length == its tokens) gives bitwise a fresh session's run."""
    path, info = decoder
    sess, state = _stateful_session(path, len(PROMPT) + 1)
    run = _Stateful(sess, info, state, "s")
    for _ in range(2):
        run.step()
    with pytest.raises(Exception, match="exceed the stateful KV capacity"):
        run.step()
    again = _Stateful(sess, info, state, "s")
    fresh_sess, fresh_state = _stateful_session(path, len(PROMPT) + 1)
    fresh = _Stateful(fresh_sess, info, fresh_state, "s")
    for _ in range(2):
        again.step()
        fresh.step()
    for g, w in zip(again.rows, fresh.rows):
        np.testing.assert_array_equal(g, w)


def test_bound_buffers_too_small_for_the_new_rows_are_a_clear_error(decoder):
    """A GroupQueryAttention node bound in place whose seqlens_k puts the new rows past the buffer: an error naming
    the capacity, and the buffer as it was (native and reference kernels)."""
    from onnx import TensorProto, helper

    from tests.npu_testing import make_model

    c, n, nkv, h = 8, 4, 2, 16
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"],
                            ["y", "present_key", "present_value"], domain="com.microsoft", num_heads=n,
                            kv_num_heads=nkv, name="gqa")
    vi = helper.make_tensor_value_info
    model = make_model([node], [vi("q", f32, [1, 1, n * h]), vi("k", f32, [1, 1, nkv * h]),
                                vi("v", f32, [1, 1, nkv * h]), vi("pk", f32, [1, nkv, c, h]),
                                vi("pv", f32, [1, nkv, c, h]), vi("seqlens_k", i32, [1]), vi("total", i32, [])],
                       [vi("y", f32, [1, 1, n * h]), vi("present_key", f32, [1, nkv, c, h]),
                        vi("present_value", f32, [1, nkv, c, h])],
                       extra_opsets=[("com.microsoft", 1)])
    rng = np.random.default_rng(0)
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        caches = [rng.standard_normal((1, nkv, c, h)).astype(np.float32) for _ in range(2)]
        before = [x.copy() for x in caches]
        values = [ort.OrtValue.ortvalue_from_numpy(x) for x in caches]
        io = sess.io_binding()
        for name, x in (("q", (1, 1, n * h)), ("k", (1, 1, nkv * h)), ("v", (1, 1, nkv * h))):
            io.bind_cpu_input(name, rng.standard_normal(x).astype(np.float32))
        io.bind_cpu_input("seqlens_k", np.array([c], np.int32))  # a past of 8 in an 8-slot buffer
        io.bind_cpu_input("total", np.array(c, np.int32))
        for i, name in enumerate(("pk", "pv")):
            io.bind_ortvalue_input(name, values[i])
            io.bind_ortvalue_output(("present_key", "present_value")[i], values[i])
        io.bind_output("y")
        with pytest.raises(Exception, match=rf"1 new tokens after a past of {c} .* need {c + 1} slots; the present "
                                            rf"holds {c} \(the KV capacity\); nothing was written"):
            sess.run_with_iobinding(io)
        for x, old in zip(caches, before):
            np.testing.assert_array_equal(x, old)


def test_enabling_the_state_after_native_steps_were_bound(decoder):
    """A session that ran (and bound its GroupQueryAttention steps natively) before the state was enabled: the
    bound steps decline from then on (the state is a guarded field of the step's runtime record), so the stateful
    contract holds and the tokens are the CPU EP's. A one-token prompt is the case that needs it: the decode step
    bound for a one-token query would take that first prompt as an ordinary one and keep nothing."""
    path, info = decoder
    sess = _npu(path)
    _generate_bound(sess, info)  # the decode signature's steps are bound natively
    state = enable(sess, CAPACITY)
    run = _Stateful(sess, info, state, "default")
    run.ids = PROMPT[:1]
    for _ in range(4):
        run.step()
    want, _, _ = _generate_bound(_cpu(path), info, PROMPT[:1])
    assert run.tokens == want[:4]
    assert state.length("default") == [4]
