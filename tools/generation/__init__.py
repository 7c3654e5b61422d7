"""Greedy generation with a fixed KV cache (``generator``), the shapes it executes (``shapes``) as named entry points
(``entries``), what it reads from a decoder graph (``model_info``) and from an onnxruntime-genai folder
(``genai_folder``): used by ``npu-generate``, the demo and the LLM benchmarks.

May import: every npu_ep package below ``tools``, and ``tools.report`` (the attention dims of a decoder graph).
"""

from .entries import Entry, EntryTable, entries_of
from .genai_folder import GenaiFolder, is_genai_folder, load_genai_folder
from .generator import (DEFAULT_MAX_KV_LEN, GenerationResult, Generator, ShapeInfo, StepRecord, default_providers,
                        generate, reference_generate)
from .model_info import IoNames, ModelInfo, inspect_model
from .shapes import (DEFAULT_BUCKETS, KvCache, KvCapacityError, KvLayout, PaddingStats, PromptTooLongError,
                     check_buckets, chunk_buckets, plan_prefill)

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_MAX_KV_LEN", "Entry", "EntryTable", "GenaiFolder", "GenerationResult",
           "Generator", "IoNames", "KvCache", "KvCapacityError", "KvLayout", "ModelInfo", "PaddingStats",
           "PromptTooLongError", "ShapeInfo", "StepRecord", "check_buckets", "chunk_buckets", "default_providers",
           "entries_of", "generate", "inspect_model", "is_genai_folder", "load_genai_folder", "plan_prefill",
           "reference_generate"]
