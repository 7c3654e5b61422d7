"""Greedy generation for exporter-style decoder graphs on NpuEP: bucketed prefill, then decode with a fixed KV cache.

Graph I/O (HF/Optimum names): input_ids [1,S], attention_mask [1,P+S], position_ids [1,S],
past_key_values.{i}.key/.value [1,Nkv,P,H] -> logits [1,S,V], present.{i}.key/.value [1,Nkv,P+S,H]; other names
(an onnxruntime-genai folder's genai_config.json) through ``IoNames``; position_ids only when the graph has it.

Executed shapes (S, P), each a named entry point (``entries``): the first prefill (bucket, 0), prefill with history
(a chunk of ``prefill_chunk`` tokens or a smaller bucket, C) and decode (1, C), where C is ``max_kv_len``. The chunk
plan, padding side, mask and cache layout are explained in ``shapes``. One session runs every step (see
``Generator``), so every entry shares its weights and the one KV cache. Per-shape sessions with ORT free-dimension
overrides were tried and dropped: ORT's shape inference rejects the exporter graph's Range plumbing once the dims
are fixed.

The KV cache is resident by default on NpuEP for GroupQueryAttention graphs (``kv_in_place``, ``resident``): every
step binds each layer's past and present to one C-slot buffer, the first prefill included (S, C), so a decode step
appends one token's K/V in place and only the logits come back. Otherwise (the copying path, ``KvCache``) each
step feeds the C slots and copies the new rows out of a fresh present.

``generate(model_or_session, prompt_ids, max_new_tokens, ...) -> GenerationResult``.
``reference_generate(model, prompt_ids, max_new_tokens)``: the naive CPU loop (no padding, growing KV), for checks.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from .entries import DECODE, PREFILL, PREFILL_HISTORY, EntryTable, declared_entries, record_kv_decode
from .model_info import IoNames, check_kv_memory, detect_layouts, info_from_session, inspect_model
from .resident import ResidentKv, decode_step_bytes, kv_counters
from .shapes import (DEFAULT_BUCKETS, KvCache, KvCapacityError, KvLayout, PaddingStats, PromptTooLongError,
                     check_buckets, chunk_buckets, plan_prefill)

__all__ = ["DEFAULT_BUCKETS", "GenerationResult", "Generator", "KvCapacityError", "PromptTooLongError",
           "StepRecord", "default_providers", "generate", "reference_generate"]

DEFAULT_MAX_KV_LEN = 1024
DEFAULT_IO = IoNames()


def default_providers() -> list:

    return [(get_ep_name(), {}), "CPUExecutionProvider"]


@dataclasses.dataclass
class StepRecord:
    kind: str                 # the entry: "prefill" (first chunk), "prefill_history" (later chunk) or "decode"
    logical: int              # tokens that mattered
    shape: tuple[int, int]    # executed (S, P)
    host_s: float
    npu_s: float              # emulated NPU seconds of this step (0 without NpuEP)


@dataclasses.dataclass
class ShapeInfo:
    shape: tuple[int, int]    # executed (S, P)
    calls: int = 0            # over the Generator's life
    host_s: float = 0.0
    npu_s: float = 0.0        # emulated NPU seconds


@dataclasses.dataclass
class GenerationResult:
    prompt: list[int]
    tokens: list[int]                          # generated ids (greedy), max_new_tokens of them
    ttft_s: float                              # host seconds from start to the first generated token
    itl_s: list[float]                         # host seconds per later token (decode steps)
    npu_prefill_s: float                       # emulated NPU seconds, all prefill chunks
    npu_decode_s: list[float]                  # emulated NPU seconds per decode step
    padding: PaddingStats
    steps: list[StepRecord]
    shapes: dict[tuple[int, int], ShapeInfo]
    kv_capacity: int
    kv_length: int                             # valid KV entries at the end
    logits: list[np.ndarray] | None = None     # [V] float32 row that chose each generated token
    entries: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the Generator's entries so far
    prefill_chunk: int | None = None           # the chunk size the prompt was planned with
    kv_decode: dict[str, Any] | None = None    # per decode step on NpuEP: what the KV moved (Generator._kv_per_step)

    @property
    def mean_itl_s(self) -> float:
        return float(np.mean(self.itl_s)) if self.itl_s else 0.0

    @property
    def mean_npu_decode_s(self) -> float:
        return float(np.mean(self.npu_decode_s)) if self.npu_decode_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {"prompt_len": len(self.prompt), "tokens": self.tokens, "ttft_s": self.ttft_s,
                "mean_itl_s": self.mean_itl_s, "npu_prefill_s": self.npu_prefill_s,
                "npu_mean_decode_s": self.mean_npu_decode_s, "kv_capacity": self.kv_capacity,
                "kv_length": self.kv_length,
                "padding": {"logical": self.padding.logical_tokens, "executed": self.padding.executed_tokens,
                            "waste": self.padding.waste, "prefill_chunk": self.prefill_chunk},
                "entries": self.entries, "kv_per_decode_step": self.kv_decode,
                "shapes": {f"S={s},P={p}": {"calls": i.calls, "host_s": i.host_s, "npu_s": i.npu_s}
                           for (s, p), i in self.shapes.items()}}


# ------------------------------------------------------------------------------------------------------------
# sessions


def _npu_ep_sessions(sess: ort.InferenceSession) -> list:
    """The NpuEP EpSession behind ``sess`` when its options were tagged (``ep.sessions``), else none: a session
    the caller created without the tag still generates, only without emulated NPU time."""
    from ...ep.sessions import session_of

    try:
        return [session_of(sess)]
    except LookupError:
        return []


class _Runner:
    """The ORT session (+ the NpuEP EpSession behind it, found through ``ep.sessions``) that runs every step."""

    def __init__(self, sess: ort.InferenceSession, eps: list, session_s: float):
        self.sess, self.eps, self.session_s = sess, eps, session_s
        self.output_names = [o.name for o in sess.get_outputs()]

    def emulated(self) -> float:
        return sum(p.emulated_seconds() for ep in self.eps for p in list(ep.programs.values()))

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, float]:
        e0, t0 = self.emulated(), time.perf_counter()
        outs = self.sess.run(None, feeds)
        host = time.perf_counter() - t0
        return dict(zip(self.output_names, outs)), host, self.emulated() - e0

    def run_resident(self, cache: ResidentKv, tokens: Sequence[int], positions: np.ndarray, executed: int,
                     first: bool) -> tuple[np.ndarray, float, float]:
        """One step with every past and present bound to the cache's buffers: only the logits come back."""
        e0, t0 = self.emulated(), time.perf_counter()
        logits = cache.run(self.sess, tokens, positions, executed, first)
        host = time.perf_counter() - t0
        return logits, host, self.emulated() - e0


class Generator:
    """One session for one model; reuse it across prompts (``generate`` makes one per call).

    NpuEP compiles each partition once per session (its programs take any shape; the compiled-context cache
    makes the next session start fast). Bucketing bounds the distinct executed shapes to the buckets used plus
    the chunk and decode shapes; ``shapes`` counts calls per executed (S, P) and the emulated cost model is
    evaluated once per shape.
    """

    def __init__(self, model: str | os.PathLike | onnx.ModelProto | ort.InferenceSession, *,
                 providers: Sequence | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 max_kv_len: int = DEFAULT_MAX_KV_LEN, chunked_prefill: bool = True,
                 session_config: dict[str, str] | None = None, ort_log_level: int | None = None,
                 io: IoNames = DEFAULT_IO, prefill_chunk: int | None = None, kv_in_place: bool | None = None,
                 kv_memory: str = "host"):
        self.buckets = check_buckets(buckets)
        self.prefill_chunk = chunk_buckets(self.buckets, prefill_chunk)[-1] if prefill_chunk else None
        self.max_kv_len = int(max_kv_len)
        self.chunked_prefill = chunked_prefill
        self.providers = list(providers) if providers is not None else default_providers()
        self.shapes: dict[tuple[int, int], ShapeInfo] = {}
        if isinstance(model, ort.InferenceSession):
            self.info = info_from_session(model, io)
            sess, session_s = model, 0.0
            self.providers = model.get_providers()
        else:
            path = None if isinstance(model, onnx.ModelProto) else os.fspath(model)
            proto = model if path is None else onnx.load(path, load_external_data=False)
            self.info = inspect_model(proto, io)
            so = ort.SessionOptions()
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            if ort_log_level is not None:  # e.g. 4 (fatal only) when the caller reports ORT's exceptions itself
                so.log_severity_level = ort_log_level
            for k, v in (session_config or {}).items():
                so.add_session_config_entry(k, v)
            if self.uses_npu:
                from ...ep.entry_points import ENTRIES_CONFIG_KEY
                from ...ep.sessions import tag_session_options

                tag_session_options(so)
                so.add_session_config_entry(ENTRIES_CONFIG_KEY, " ".join(self._declared(kv_in_place)))
            providers = self._npu_memory_session(so) if kv_memory == "npu" else self.providers
            t0 = time.perf_counter()
            # enable_fallback=0: an NpuEP failure raises instead of silently re-running everything on the CPU
            # a path is handed to ORT as is: external data (genai's model.onnx.data) loads from the model's folder
            sess = ort.InferenceSession(path if path is not None else proto.SerializeToString(), sess_options=so,
                                        providers=providers, enable_fallback=0)
            session_s = time.perf_counter() - t0
        self._runner = _Runner(sess, _npu_ep_sessions(sess) if self.uses_npu else [], session_s)
        self.entries = EntryTable(self._runner.eps)
        self.layouts = self.info.layouts
        self.kv_in_place = self._in_place(kv_in_place)
        if kv_memory not in ("host", "npu") or (kv_memory == "npu" and not (self.kv_in_place and self.uses_npu)):
            raise ValueError(f"kv_memory={kv_memory!r}: 'host', or 'npu' (the KV resident in NpuEP's device memory, "
                             "ep.device_memory) for NpuEP with kv_in_place and a model path")
        self.kv_memory = kv_memory

    def _declared(self, kv_in_place: bool | None) -> list[str]:
        """The entry points this generator may run, named to the session before it compiles (``entries``)."""
        self.layouts = self.info.layouts
        sizes = chunk_buckets(self.buckets, self.prefill_chunk) if self.chunked_prefill else self.buckets
        return declared_entries(sizes, self.chunked_prefill, self.max_kv_len,
                                self.max_kv_len if self._in_place(kv_in_place) else 0)

    def _npu_memory_session(self, so: ort.SessionOptions) -> None:
        """Put NpuEP on its "npu" device (``ep.device_memory``) in ``so``, with the options ``providers`` gave it;
        ORT then adds the CPU EP itself. Returns the providers argument for such a session (None)."""

        from ...ep.device_memory import add_npu_ep

        options = next((p[1] for p in self.providers if isinstance(p, tuple) and p[0] == get_ep_name()), {})
        add_npu_ep(so, options)

    @property
    def uses_npu(self) -> bool:

        return any((p[0] if isinstance(p, tuple) else p) == get_ep_name() for p in self.providers)

    def _in_place(self, asked: bool | None) -> bool:
        """Whether steps bind past and present to one resident buffer (``resident``): asked, or by default on
        NpuEP when every layer's present comes from GroupQueryAttention."""
        gqa = self.layouts is not None and all(x is KvLayout.VALID_PREFIX for x in self.layouts)
        if asked and not gqa:
            found = "unknown (a session was given)" if self.layouts is None else [x.value for x in self.layouts]
            raise ValueError("kv_in_place needs every layer's present from GroupQueryAttention (npu-rewrite --passes "
                             f"...,gqa); this graph's KV layouts are {found}")
        return gqa and self.uses_npu if asked is None else asked

    @property
    def session(self) -> ort.InferenceSession:
        return self._runner.sess

    def compile_stats(self) -> dict[str, Any]:
        """NpuEP partitions of the session, how many were compiled vs loaded from the cache, session seconds."""
        eps = self._runner.eps
        return {"session_s": self._runner.session_s,
                "npu_partitions": sum(len(ep.programs) for ep in eps),
                "compiles": sum(ep.compiled.stats["misses"] for ep in eps),
                "cache_hits": sum(ep.compiled.stats["hits"] for ep in eps)}

    # -- one step ----------------------------------------------------------------------------------------------
    def _step(self, cache: KvCache | ResidentKv, tokens: Sequence[int], executed: int, kind: str
              ) -> tuple[np.ndarray, float, float, tuple[int, int]]:
        """Run `tokens` padded to `executed` as entry `kind`; returns (logits row of the last valid token, host s,
        npu s, shape)."""
        new = len(tokens)
        pos = np.zeros((1, executed), np.int64)           # padded positions read 0 (always a valid rotary row)
        pos[0, :new] = np.arange(cache.length, cache.length + new)
        if isinstance(cache, ResidentKv):
            cache.check_room(executed)  # the padded rows are written in place too
            past_len = cache.capacity
            run = lambda: self._runner.run_resident(cache, tokens, pos[0], executed, kind == PREFILL)
        else:
            cache.check_room(new)
            feeds, past_len = self._copying_feeds(cache, tokens, pos, executed, kind == PREFILL)
            run = lambda: self._runner.run(feeds)
        entry = self.entries.entry(kind, (executed, past_len))
        before = self.entries.before_call(entry)
        outs, host, npu = run()
        self.entries.after_call(entry, before, new, host, npu)
        shape = self.shapes.setdefault((executed, past_len), ShapeInfo((executed, past_len)))
        shape.calls += 1
        shape.host_s += host
        shape.npu_s += npu
        io = self.info.io
        if isinstance(cache, ResidentKv):
            cache.advance(new)
            return np.array(outs[0, new - 1], np.float32), host, npu, (executed, past_len)
        presents = [(outs[io.present_key % i], outs[io.present_value % i]) for i in range(self.info.n_layers)]
        if self.layouts is None:
            if kind == PREFILL:
                layouts = (KvLayout.APPEND,) * self.info.n_layers  # empty past: both layouts agree
            else:
                layouts = self.layouts = detect_layouts(presents, cache, new)
        else:
            layouts = self.layouts
        cache.append(presents, layouts, new, past_len)
        return np.array(outs[io.logits][0, new - 1], np.float32), host, npu, (executed, past_len)

    def _copying_feeds(self, cache: KvCache, tokens: Sequence[int], pos: np.ndarray, executed: int, first: bool
                       ) -> tuple[dict[str, np.ndarray], int]:
        """(feeds, past length fed) of a step of the copying path: the cache's C slots as the past."""
        io = self.info.io
        ids = np.zeros((1, executed), np.int64)
        ids[0, :len(tokens)] = tokens
        if first:
            past_len = 0
            mask = np.ones((1, executed), np.int64)  # padding marked too (shapes: GQA's past length)
            empty = np.zeros((1, self.info.kv_heads, 0, self.info.head_dim), np.float32)
            past = {name % i: empty for i in range(self.info.n_layers) for name in (io.past_key, io.past_value)}
        else:
            past_len = cache.capacity
            mask = cache.mask(executed)
            past = io.past_feeds(cache)
        feeds = {io.input_ids: ids, io.attention_mask: mask, **past}
        if self.info.feeds_position_ids:
            feeds[io.position_ids] = pos
        return feeds, past_len

    # -- the loop ----------------------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *, keep_logits: bool = True,
                 eos_token_ids: Sequence[int] = (), feed_tokens: Sequence[int] | None = None) -> GenerationResult:
        """Greedy ids after ``prompt_ids``: ``max_new_tokens`` of them, or those before the first of
        ``eos_token_ids`` generated (left out, as onnxruntime-genai's sequences leave it out). ``feed_tokens``
        (teacher forcing): decode step i reads ``feed_tokens[i]`` instead of the token chosen before it, so two runs
        compare logits in the same context; the chosen tokens are still the ones returned."""
        prompt = [int(t) for t in prompt_ids]
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token id")
        vocab = self.info.vocab
        bad = next((i for i, t in enumerate(prompt) if t < 0 or (vocab is not None and t >= vocab)), None)
        if bad is not None:
            raise ValueError(f"prompt token id {prompt[bad]} at position {bad} is outside the vocabulary "
                             f"[0, {vocab if vocab is not None else 'vocab'})")
        if feed_tokens is not None and len(feed_tokens) < max_new_tokens - 1:
            raise ValueError(f"feed_tokens holds {len(feed_tokens)} ids; {max_new_tokens - 1} decode steps need one "
                             "each")
        chunks = plan_prefill(len(prompt), self.buckets, chunked=self.chunked_prefill, chunk=self.prefill_chunk)
        check_kv_memory(self.info, self.max_kv_len)
        if self.kv_in_place:
            cache = ResidentKv(self.info, self.max_kv_len,
                               npu_session=self.session if self.kv_memory == "npu" else None)
            rows = max(ch.start + ch.bucket for ch in chunks)  # a padded step writes its padding in place too
        else:
            cache = KvCache(self.info.n_layers, self.info.kv_heads, self.info.head_dim, self.max_kv_len)
            rows = 0
        # capacity is checked up front: a clear error before any work, never a silent overwrite later
        cache.check_room(max(rows, len(prompt) + max_new_tokens - 1))
        padding, steps = PaddingStats(), []
        t_start = time.perf_counter()
        npu_prefill = 0.0
        for ch in chunks:
            kind = PREFILL if ch.first else PREFILL_HISTORY
            logits, host, npu, shape = self._step(cache, prompt[ch.start: ch.start + ch.length], ch.bucket, kind)
            padding.logical_tokens += ch.length
            padding.executed_tokens += ch.bucket
            npu_prefill += npu
            steps.append(StepRecord(kind, ch.length, shape, host, npu))
        token = int(np.argmax(logits))
        ttft = time.perf_counter() - t_start
        tokens, rows, itl, npu_decode = [token], [logits] if keep_logits else None, [], []
        stop = {int(t) for t in eos_token_ids}
        kv_before = kv_counters(self.session, self._runner.eps)
        for _ in range(max_new_tokens - 1):
            if token in stop:
                break
            t0 = time.perf_counter()
            fed = token if feed_tokens is None else int(feed_tokens[len(tokens) - 1])
            logits, host, npu, shape = self._step(cache, [fed], 1, DECODE)
            token = int(np.argmax(logits))
            itl.append(time.perf_counter() - t0)
            npu_decode.append(npu)
            steps.append(StepRecord(DECODE, 1, shape, host, npu))
            tokens.append(token)
            if rows is not None:
                rows.append(logits)
        if tokens[-1] in stop:  # it ends the text and is not part of it
            tokens.pop()
            if rows is not None:
                rows.pop()
        kv = self._kv_per_step(kv_before, len(itl), cache.capacity)
        if kv is not None:
            record_kv_decode(self._runner.eps, kv, len(itl), sum(npu_decode), sum(itl))
        shapes = {k: dataclasses.replace(v) for k, v in self.shapes.items()}
        return GenerationResult(prompt, tokens, ttft, itl, npu_prefill, npu_decode, padding, steps, shapes,
                                cache.capacity, cache.length, rows, self.entries.rows(), self.prefill_chunk, kv)

    def _kv_per_step(self, before: dict[str, int], steps: int, capacity: int) -> dict[str, Any] | None:
        """Issue 41's three facts per decode step, from the counters before and after the decode steps: KV bytes
        across the host<->NPU boundary (what crossed, less the step's other tensors), bytes appended in place or
        into a copy, past bytes copied and full copies."""
        if not before or not steps:
            return None
        after = kv_counters(self.session, self._runner.eps)
        d = {k: (after[k] - before[k]) / steps for k in after}
        crossed = d["bridge_host_bytes"] + d["copied_across_bytes"]
        other = decode_step_bytes(self.info, capacity if self.kv_in_place else capacity + 1)
        in_place = d["in_place"] > 0
        return {"mode": "resident " + self.kv_memory if self.kv_in_place else "copying",
                "kv_across_boundary_bytes": crossed - other if self.info.vocab else None,
                "all_across_boundary_bytes": crossed,
                "appended_in_place_bytes": d["appended_bytes"] if in_place else 0.0,
                "appended_into_copy_bytes": 0.0 if in_place else d["appended_bytes"],
                "past_copied_bytes": d["copied_bytes"], "full_copies": d["full_copies"]}


def generate(session_or_model_path, prompt_ids: Sequence[int], max_new_tokens: int, *,
             providers: Sequence | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS,
             max_kv_len: int = DEFAULT_MAX_KV_LEN, chunked_prefill: bool = True, keep_logits: bool = True,
             prefill_chunk: int | None = None, kv_in_place: bool | None = None) -> GenerationResult:
    """Greedy-generate ``max_new_tokens`` ids after ``prompt_ids`` (batch 1). See the module docstring."""
    gen = Generator(session_or_model_path, providers=providers, buckets=buckets, max_kv_len=max_kv_len,
                    chunked_prefill=chunked_prefill, prefill_chunk=prefill_chunk, kv_in_place=kv_in_place)
    return gen.generate(prompt_ids, max_new_tokens, keep_logits=keep_logits)


def reference_generate(model, prompt_ids: Sequence[int], max_new_tokens: int
                       ) -> tuple[list[int], list[np.ndarray]]:
    """The naive exporter loop on ORT's CPU EP: unpadded prefill, KV grown by one each step (no buckets)."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    info = inspect_model(proto)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    empty = np.zeros((1, info.kv_heads, 0, info.head_dim), np.float32)
    past = [(empty, empty)] * info.n_layers
    ids = list(prompt_ids)
    tokens, rows = [], []
    for _ in range(max_new_tokens):
        p = past[0][0].shape[2]
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, p + len(ids)), np.int64),
                 "position_ids": np.arange(p, p + len(ids), dtype=np.int64)[None]}
        for i, (k, v) in enumerate(past):
            feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = k, v
        out = dict(zip(names, sess.run(None, feeds)))
        row = out["logits"][0, -1]
        rows.append(row)
        tokens.append(int(np.argmax(row)))
        past = [(out[f"present.{i}.key"], out[f"present.{i}.value"]) for i in range(info.n_layers)]
        ids = [tokens[-1]]
    return tokens, rows
