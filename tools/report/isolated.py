"""Jobs run one per spawned process, each with a time limit and a memory bound, dying with their parent.

Why not a ``ProcessPoolExecutor``: a pool cannot stop one job that hangs or eats memory (a model whose session
never returns), one worker killed by the kernel breaks the whole pool, and its workers outlive a parent killed by
SIGTERM or SIGKILL. Here every job gets a fresh process (spawned: a fresh ORT and NpuEP per model); it is killed
when its time is up, its address space is bounded with ``RLIMIT_AS`` (an allocation above it raises
``MemoryError`` inside the job), and Linux kills it (``PR_SET_PDEATHSIG``) if the parent dies, however it dies.
SIGTERM in the parent kills the running jobs before the parent exits (status 143).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.2
_RUNNING = object()  # _collect: the job has not finished


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _bound_memory(max_bytes: int | None) -> None:
    if max_bytes is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


def _child(conn, fn: Callable[..., Any], args: tuple, parent_pid: int, max_bytes: int | None) -> None:
    die_with_parent(parent_pid)
    _bound_memory(max_bytes)
    try:
        result = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - the parent gets the reason as data
        result = ("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    conn.send(result)
    conn.close()


class JobFailed(Exception):
    """A job that timed out, died, or raised: ``str()`` says which."""


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


@contextmanager
def _sigterm_kills(procs: dict) -> Iterator[None]:
    """On SIGTERM: kill every running job, then exit 143 (the handler is only installable on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        _kill_all(procs)
        raise SystemExit(128 + signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _kill_all(procs: dict) -> None:
    for proc in list(procs):
        if proc.is_alive():
            proc.kill()
    for proc in list(procs):
        proc.join()


def run_isolated(fn: Callable[..., Any], jobs: Sequence[tuple], *, workers: int, timeout_s: float,
                 max_memory_bytes: int | None = None) -> list[Any]:
    """``fn(*job)`` for every job, at most ``workers`` at a time, each in its own spawned process. Returns the
    results in job order; a job that raised, timed out or died is a ``JobFailed`` in its place. ``fn`` must be
    importable by name (a module-level function)."""
    ctx = multiprocessing.get_context("spawn")
    results: list[Any] = [None] * len(jobs)
    waiting = list(enumerate(jobs))
    running: dict = {}  # process -> (job index, connection, start time)
    with _sigterm_kills(running):
        try:
            while waiting or running:
                while waiting and len(running) < workers:
                    index, job = waiting.pop(0)
                    recv, send = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_child, args=(send, fn, tuple(job), os.getpid(), max_memory_bytes),
                                       daemon=True)
                    proc.start()
                    send.close()
                    running[proc] = (index, recv, time.monotonic())
                multiprocessing.connection.wait([c for _, c, _ in running.values()], timeout=_POLL_S)
                for proc in list(running):
                    index, recv, started = running[proc]
                    outcome = _collect(proc, recv, started, timeout_s)
                    if outcome is not _RUNNING:
                        results[index] = outcome
                        recv.close()
                        del running[proc]
        finally:
            _kill_all(running)
    return results


def _collect(proc, recv, started: float, timeout_s: float) -> Any:
    """The job's result if it finished (or its failure), else ``_RUNNING``."""
    if recv.poll():
        try:
            status, value = recv.recv()
        except EOFError:  # died without a word (killed: out of memory, a signal)
            proc.join()
            return JobFailed(f"worker {_exit_reason(proc.exitcode)}")
        proc.join()
        return value if status == "ok" else JobFailed(value)
    if time.monotonic() - started > timeout_s:
        proc.kill()
        proc.join()
        return JobFailed(f"timed out after {timeout_s:g} s (killed)")
    return _RUNNING
