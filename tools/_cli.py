"""What every command-line tool does the same way: Ctrl-C, repeated ``NAME=VALUE`` options, the target's origin,
output files written as a set.

Why here: each CLI imports ONNX, ORT and the rewriter inside ``main`` (seconds on a busy host), so Ctrl-C usually
lands in an import; the user asked to stop, and gets exit status 130 without a traceback. The heavy imports stay
inside ``main`` for that reason: an import at module level runs before ``main`` can catch anything.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C
TARGET_ENV = "NPU_EP_TARGET"


def quiet_interrupt(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` returning 130 on Ctrl-C (KeyboardInterrupt) instead of printing a traceback."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print(file=sys.stderr)  # end the line the terminal echoed ^C on
            return EXIT_INTERRUPTED
    return wrapper


def single_values(pairs: Iterable[tuple[str, int]], flag: str) -> dict[str, int]:
    """``NAME=VALUE`` options given repeatedly as a dict; one name given two different values is an error naming
    both (the last one silently won)."""
    out: dict[str, int] = {}
    for name, value in pairs:
        if name in out and out[name] != value:
            raise ValueError(f"{flag} {name} is given twice with different values ({name}={out[name]} and "
                             f"{name}={value}); give it once")
        out[name] = value
    return out


def default_target(fallback: str = "npu-ref") -> str:
    """The target a CLI uses when ``--target`` is not given: ``$NPU_EP_TARGET``, as NpuEP itself reads it."""
    return os.environ.get(TARGET_ENV) or fallback


def target_origin(given: str | None) -> str:
    """Where the target came from, for error messages: ``--target`` or the environment variable."""
    if given is None and os.environ.get(TARGET_ENV):
        return f"{TARGET_ENV}={os.environ[TARGET_ENV]!r} (environment)"
    return f"--target {given or 'npu-ref'}"


_DEFERRED = ("SIGTERM", "SIGINT", "SIGHUP")


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP wait until the block is done, then take effect (re-sent to this process with the
    previous handlers back). Main thread only (elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    sigs = [getattr(signal, name) for name in _DEFERRED if hasattr(signal, name)]
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            os.kill(os.getpid(), s)


def write_outputs(files: Mapping[str | os.PathLike, bytes]) -> None:
    """Write every file atomically and as a set: each goes to a temp file beside it first; only when all are
    written and fsync'ed are they renamed into place, with signals deferred, so a failure (a full disk) or a
    SIGTERM leaves either all the new files or none (what was there stays)."""
    from .._atomic import atomic_writer

    with deferred_signals(), contextlib.ExitStack() as stack:
        for path, data in files.items():
            stack.enter_context(atomic_writer(path)).write(data)
