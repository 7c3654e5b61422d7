"""``npu-generate MODEL --prompt-ids 1 2 3 --max-new-tokens N``: greedy generation on NpuEP (bucketed prefill,
fixed-capacity KV cache), printing the ids, TTFT / inter-token latency (host and emulated NPU) and padding.

Exit codes: 0 ok, 2 bad input or a refused request (prompt too long without chunking, KV capacity exceeded, a KV
cache larger than half the machine's memory, token ids outside the vocabulary), 1 ONNX Runtime failed on the model;
each printed as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from .generation import DEFAULT_BUCKETS, DEFAULT_MAX_KV_LEN, GenerationResult, KvCapacityError, PromptTooLongError


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
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="npu-generate", description=__doc__.splitlines()[0])
    p.add_argument("model", help="decoder .onnx with exporter I/O (input_ids, attention_mask, position_ids, past/present)")
    p.add_argument("--prompt-ids", type=_ints, nargs="+", required=True, metavar="ID",
                   help="prompt token ids, space- or comma-separated (1 2 3 or 1,2,3)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--buckets", type=_ints, nargs="+", default=[list(DEFAULT_BUCKETS)], metavar="N",
                   help="prefill shape buckets, space- or comma-separated")
    p.add_argument("--max-kv-len", type=int, default=DEFAULT_MAX_KV_LEN, help="fixed KV cache capacity")
    p.add_argument("--no-chunked-prefill", dest="chunked", action="store_false",
                   help="refuse prompts longer than the largest bucket instead of chunking them")
    p.add_argument("--cpu", action="store_true", help="run on ORT's CPU EP only (reference)")
    p.add_argument("--target", default=None, help="NpuEP target (npu-ref, npu-edge or a .toml)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    return p


def format_result(res: GenerationResult) -> str:
    lines = [f"prompt: {len(res.prompt)} tokens; generated {len(res.tokens)}: {res.tokens}",
             f"TTFT {res.ttft_s * 1e3:.1f} ms host, {res.npu_prefill_s * 1e3:.3f} ms emulated NPU",
             f"inter-token {res.mean_itl_s * 1e3:.1f} ms host (mean), {res.mean_npu_decode_s * 1e3:.3f} ms emulated NPU",
             f"prefill padding: {res.padding.logical_tokens} logical -> {res.padding.executed_tokens} executed "
             f"tokens ({res.padding.waste:.0%} waste); KV {res.kv_length}/{res.kv_capacity}"]
    for (s, p), info in sorted(res.shapes.items()):
        lines.append(f"  executed shape S={s:<4d} P={p:<5d} calls {info.calls:4d}  host {info.host_s * 1e3:8.1f} ms  "
                     f"NPU {info.npu_s * 1e3:8.3f} ms")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .generation import Generator, default_providers
    from .report.validate import ort_exceptions, ort_message

    if args.cpu:
        providers = ["CPUExecutionProvider"]
    else:
        providers = default_providers()
        if args.target:
            providers[0] = (providers[0][0], {"target": args.target})
    try:
        gen = Generator(args.model, providers=providers, buckets=_flat(args.buckets), max_kv_len=args.max_kv_len,
                        chunked_prefill=args.chunked, ort_log_level=4)  # ORT errors: the one line below
        res = gen.generate(_flat(args.prompt_ids), args.max_new_tokens, keep_logits=False)
    except (PromptTooLongError, KvCapacityError, ValueError, OSError, DecodeError) as exc:
        print(f"npu-generate: error: {_first_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"npu-generate: error: {args.model}: out of memory (lower --max-kv-len or --buckets)", file=sys.stderr)
        return 2
    except ort_exceptions() as exc:  # ONNX Runtime refused the model or failed a run (e.g. an allocation)
        print(f"npu-generate: {args.model}: ONNX Runtime failed: {ort_message(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**res.summary(), "compile": gen.compile_stats()}, indent=1))
    else:
        print(format_result(res))
        print(f"session: {gen.compile_stats()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
