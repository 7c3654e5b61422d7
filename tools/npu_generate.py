"""``npu-generate MODEL --prompt-ids 1 2 3 --max-new-tokens N``: greedy generation on NpuEP (bucketed prefill,
fixed-capacity KV cache), printing the ids, TTFT / inter-token latency (host and emulated NPU), padding, the entry
points that ran (first prefill, prefill with history, decode: ``generation.entries``) and the KV cache format.
``--prefill-chunk N`` sets chunked prefill's chunk size; ``--kv-cache-dtype`` keeps the KV cache in another format
and ``--compare-kv FORMATS`` compares formats against float32 KV (``generation.kv_compare``).

MODEL is a decoder .onnx or an onnxruntime-genai model folder: its genai_config.json gives the decoder file, the
I/O names, the end-of-sequence ids (generation stops at one), the context length (the default KV capacity) and the
NpuEP provider options (``--target`` overrides the target).

Exit codes: 0 ok, 2 bad input or a refused request (prompt too long without chunking, KV capacity exceeded, a KV
cache larger than half the machine's memory, token ids outside the vocabulary), 1 ONNX Runtime failed on the model;
each printed as one line on stderr; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._cli import TARGET_ENV, quiet_interrupt, target_origin

if TYPE_CHECKING:  # imported inside main (ORT, onnx: seconds; Ctrl-C there exits 130 quietly: _cli)
    from .generation import GenerationResult


def _ints(text: str) -> list[int]:
    """One argument of an integer list: ``1``, ``1,2,3`` or ``"1 2 3"``."""
    try:
        return [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers (space- or comma-separated), got {text!r}") from None


def _flat(parts: Sequence[list[int]]) -> list[int]:
    return [i for part in parts for i in part]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's default prints the usage too)
        print(f"npu-generate: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _first_line(exc: BaseException) -> str:
    """The first line of the error, safe for the terminal (``log.escape``: a model's names can hold escapes)."""
    from ..log import escape

    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return escape(lines[0]) if lines else type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    from .generation import DEFAULT_BUCKETS, DEFAULT_MAX_KV_LEN

    p = _Parser(prog="npu-generate", description=__doc__.splitlines()[0])
    p.add_argument("model", help="decoder .onnx with exporter I/O (input_ids, attention_mask, position_ids, "
                   "past/present), or an onnxruntime-genai model folder (genai_config.json)")
    p.add_argument("--prompt-ids", type=_ints, nargs="+", required=True, metavar="ID",
                   help="prompt token ids, space- or comma-separated (1 2 3 or 1,2,3)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--buckets", type=_ints, nargs="+", default=[list(DEFAULT_BUCKETS)], metavar="N",
                   help="prefill shape buckets, space- or comma-separated")
    p.add_argument("--max-kv-len", type=int, default=None,
                   help=f"fixed KV cache capacity (default {DEFAULT_MAX_KV_LEN}; a genai folder: its context_length "
                   "less the largest bucket)")
    p.add_argument("--no-chunked-prefill", dest="chunked", action="store_false",
                   help="refuse prompts longer than the largest bucket instead of chunking them")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="chunked prefill's chunk size in tokens (default: the largest bucket); a long prompt runs "
                   "as chunks of N appended to the KV cache, the remainder in the buckets below N")
    p.add_argument("--cpu", action="store_true", help="run on ORT's CPU EP only (reference)")
    p.add_argument("--target", default=None,
                   help=f"NpuEP target (npu-ref, npu-edge or a .toml; default: a genai folder's, else ${TARGET_ENV}, "
                        "else npu-ref)")
    p.add_argument("--kv-cache-dtype", default=None, metavar="FORMAT",
                   help="the format NpuEP's attention keeps the KV cache in (float32, float16, int8_per_head, "
                   "int8_per_token, int4_per_head; default: the target's, float32): changes numerics")
    p.add_argument("--compare-kv", type=lambda t: [f for f in t.replace(" ", ",").split(",") if f], default=None,
                   metavar="FORMATS", help="generate with float32 KV and with each of these formats (comma-separated) "
                   "and print greedy token agreement and logit drift against float32 KV")
    p.add_argument("--kv", choices=KV_MODES, default=None,
                   help="where the KV cache lives between steps: resident (past and present bound to one buffer, "
                   "updated in place; the default on NpuEP for GroupQueryAttention graphs), resident-npu (the same "
                   "in NpuEP's device memory: no KV byte crosses to the host) or copying (fed and copied every step)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    return p


KV_MODES = ("resident", "resident-npu", "copying")


def _kv_mode(mode: str | None) -> dict:
    """Generator keywords of a --kv choice (None: the generator's default)."""
    if mode is None:
        return {}
    return {"kv_in_place": mode != "copying", "kv_memory": "npu" if mode == "resident-npu" else "host"}


def format_result(res: GenerationResult) -> str:
    lines = [f"prompt: {len(res.prompt)} tokens; generated {len(res.tokens)}: {res.tokens}",
             f"TTFT {res.ttft_s * 1e3:.1f} ms host, {res.npu_prefill_s * 1e3:.3f} ms emulated NPU",
             f"inter-token {res.mean_itl_s * 1e3:.1f} ms host (mean), "
             f"{res.mean_npu_decode_s * 1e3:.3f} ms emulated NPU",
             f"prefill padding: {res.padding.logical_tokens} logical -> {res.padding.executed_tokens} executed "
             f"tokens ({res.padding.waste:.0%} waste{_chunk_note(res)}); KV {res.kv_length}/{res.kv_capacity}"]
    for e in res.entries:
        lines.append(f"  entry {e['name']:<28s} calls {e['calls']:4d}  host {e['host_s'] * 1e3:8.1f} ms  "
                     f"NPU {e['npu_s'] * 1e3:8.3f} ms")
    kv = res.kv_decode
    if kv is not None:
        across = kv["kv_across_boundary_bytes"]
        lines.append(f"KV per decode step ({kv['mode']}): {'?' if across is None else f'{across:,.0f}'} bytes across "
                     f"the host<->NPU boundary, {kv['appended_in_place_bytes']:,.0f} appended in place, "
                     f"{kv['appended_into_copy_bytes']:,.0f} into a copy, {kv['past_copied_bytes']:,.0f} of past "
                     f"copied in {kv['full_copies']:.0f} full copies")
    return "\n".join(lines)


def _chunk_note(res: GenerationResult) -> str:
    plan = "+".join(f"{s.logical}->{s.shape[0]}" if s.logical != s.shape[0] else str(s.logical)
                    for s in res.steps if s.kind != "decode")
    chunk = f"chunk {res.prefill_chunk}: " if res.prefill_chunk else ""
    return f"; {chunk}{plan}"


def _model_source(args: argparse.Namespace):
    """(model path, IoNames, eos ids, buckets, KV capacity, NpuEP options) from a .onnx or a genai folder."""
    from .generation import DEFAULT_BUCKETS, DEFAULT_MAX_KV_LEN
    from .generation.genai_folder import is_genai_folder, load_genai_folder
    from .generation.model_info import IoNames

    if not is_genai_folder(args.model):
        if os.path.isdir(args.model):
            raise ValueError(f"{args.model}: a folder without genai_config.json; give a decoder .onnx or an "
                             "onnxruntime-genai model folder")
        capacity = DEFAULT_MAX_KV_LEN if args.max_kv_len is None else args.max_kv_len
        return args.model, IoNames(), (), _flat(args.buckets), capacity, {}
    folder = load_genai_folder(args.model)
    buckets, capacity, context = _flat(args.buckets), args.max_kv_len, folder.context_length
    if context and args.buckets == [list(DEFAULT_BUCKETS)]:  # default buckets: those leaving half the context
        buckets = [b for b in buckets if b <= context // 2] or [max(1, context // 2)]
    if capacity is None:  # every step's total length (capacity + its new tokens) stays within the context
        capacity = min(DEFAULT_MAX_KV_LEN, context - max(buckets)) if context else DEFAULT_MAX_KV_LEN
        if capacity < 1:
            raise ValueError(f"{args.model}: context_length {context} leaves no KV capacity after the largest "
                             f"prefill bucket {max(buckets)}; pass smaller --buckets")
    return (str(folder.model), folder.io, folder.eos_token_ids, buckets, capacity,
            folder.provider_options.get("NpuEP", {}))


def _check_target(args: argparse.Namespace, npu_options: dict) -> None:
    """The target NpuEP will load, checked before any session: ``--target``, the genai folder's, or
    ``$NPU_EP_TARGET`` (NpuEP reads it when no target option is given); an error names where it came from."""
    from ..kernels.target import Target, TargetError

    if args.cpu:
        return
    target, origin = args.target, target_origin(args.target)
    if target is None and "target" in npu_options:
        target, origin = npu_options["target"], f"{args.model}'s genai_config.json target"
    if target is None and os.environ.get(TARGET_ENV):
        target = os.environ[TARGET_ENV]
    if target is not None:
        try:
            Target.load(target)
        except TargetError as exc:
            raise ValueError(f"{origin}: {exc}") from None


def _kv_format(gen) -> dict:
    """The KV cache format NpuEP's attention keeps (its target's) and one token's KV bytes in it."""
    from .generation.kv_compare import kv_bytes_per_token

    eps = gen._runner.eps
    fmt = eps[0].target.kv_cache_dtype if eps else "float32"
    return {"dtype": fmt, "bytes_per_token": kv_bytes_per_token(fmt, gen.info.n_layers, gen.info.kv_heads,
                                                                gen.info.head_dim)}


def _compare_kv(args: argparse.Namespace, model: str, io, buckets: list[int], max_kv_len: int,
                npu_options: dict) -> int:
    """``--compare-kv``: float32 KV against each format (``generation.kv_compare``)."""
    from .generation.kv_compare import compare_kv_formats, format_effects

    if args.cpu:
        raise ValueError("--compare-kv compares NpuEP's KV cache formats: leave out --cpu")
    options = {k: v for k, v in npu_options.items() if k != "kv_cache_dtype"}
    effects = compare_kv_formats(model, _flat(args.prompt_ids), args.max_new_tokens, args.compare_kv,
                                 npu_options=options, buckets=buckets, max_kv_len=max_kv_len,
                                 chunked_prefill=args.chunked, prefill_chunk=args.prefill_chunk, io=io,
                                 ort_log_level=4)
    if args.json:
        print(json.dumps([e.to_dict() for e in effects], indent=1))
    else:
        print(f"KV cache formats against float32 KV over {args.max_new_tokens} greedy tokens (logit drift and top-1 "
              "agreement teacher-forced on float32 KV's tokens; free-running agreement and first differing step):")
        print(format_effects(effects))
    return 0


@quiet_interrupt
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_kv_len is not None and args.max_kv_len < 1:
        build_parser().error(f"--max-kv-len must be >= 1 (the KV cache capacity in tokens), got {args.max_kv_len}")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        build_parser().error(f"--prefill-chunk must be >= 1 (tokens per prefill chunk), got {args.prefill_chunk}")
    from ..kernels.target import KV_CACHE_DTYPES

    for fmt in [args.kv_cache_dtype or "float32", *(args.compare_kv or [])]:
        if fmt not in KV_CACHE_DTYPES:
            build_parser().error(f"unknown KV cache format {fmt!r} (known: {', '.join(KV_CACHE_DTYPES)})")
    from google.protobuf.message import DecodeError

    from .generation import Generator, KvCapacityError, PromptTooLongError, default_providers
    from .report.validate import ort_exceptions, ort_message

    try:
        model, io, eos, buckets, max_kv_len, npu_options = _model_source(args)
        _check_target(args, npu_options)
        providers = ["CPUExecutionProvider"] if args.cpu else default_providers()
        if not args.cpu:
            npu_options = {**npu_options, **({"target": args.target} if args.target else {}),
                           **({"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype else {})}
            providers[0] = (providers[0][0], npu_options)
        if args.compare_kv is not None:
            return _compare_kv(args, model, io, buckets, max_kv_len, npu_options)
        gen = Generator(model, providers=providers, buckets=buckets, max_kv_len=max_kv_len,
                        chunked_prefill=args.chunked, ort_log_level=4, io=io,  # ORT errors: the one line below
                        prefill_chunk=args.prefill_chunk, **_kv_mode(None if args.cpu else args.kv))
        res = gen.generate(_flat(args.prompt_ids), args.max_new_tokens, keep_logits=False, eos_token_ids=eos)
    except (PromptTooLongError, KvCapacityError, ValueError, OSError, DecodeError) as exc:
        print(f"npu-generate: error: {_first_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"npu-generate: error: {args.model}: out of memory (lower --max-kv-len or --buckets)", file=sys.stderr)
        return 2
    except ort_exceptions() as exc:  # ONNX Runtime refused the model or failed a run (e.g. an allocation)
        print(f"npu-generate: {args.model}: ONNX Runtime failed: {ort_message(exc)}", file=sys.stderr)
        return 1
    kv = _kv_format(gen)
    if args.json:
        print(json.dumps({**res.summary(), "compile": gen.compile_stats(), "kv_cache": kv}, indent=1))
    else:
        print(format_result(res))
        print(f"KV cache format {kv['dtype']}: {kv['bytes_per_token']:,.0f} bytes per token (every layer's K and V)")
        print(f"session: {gen.compile_stats()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
