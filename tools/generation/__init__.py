"""Greedy generation with a fixed KV cache (``generator``) and the shapes it executes (``shapes``): used by
``npu-generate``, the demo and the LLM benchmarks."""

from .generator import (DEFAULT_MAX_KV_LEN, GenerationResult, Generator, ShapeInfo, StepRecord, default_providers,
                        generate, reference_generate)
from .shapes import (DEFAULT_BUCKETS, KvCache, KvCapacityError, KvLayout, PaddingStats, PromptTooLongError,
                     check_buckets, plan_prefill)

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_MAX_KV_LEN", "GenerationResult", "Generator", "KvCache", "KvCapacityError",
           "KvLayout", "PaddingStats", "PromptTooLongError", "ShapeInfo", "StepRecord", "check_buckets",
           "default_providers", "generate", "plan_prefill", "reference_generate"]
