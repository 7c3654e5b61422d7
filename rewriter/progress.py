"""Progress of long-running families (int4): the CLI installs a rich progress bar, library callers get nothing."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

ProgressHook = Callable[[str, int, int], None]  # (stage, done, total)
_progress: contextvars.ContextVar[ProgressHook | None] = contextvars.ContextVar("npu_rewrite_progress",
                                                                                  default=None)


@contextlib.contextmanager
def progress_hook(hook: ProgressHook | None) -> Iterator[None]:
    """Install ``hook(stage, done, total)`` for the rewrites run inside this context."""
    token = _progress.set(hook)
    try:
        yield
    finally:
        _progress.reset(token)


def report_progress(stage: str, done: int, total: int) -> None:
    """Called by long-running families (int4) after each unit of work."""
    hook = _progress.get()
    if hook is not None:
        hook(stage, done, total)
