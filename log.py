"""NpuEP's logger, ``npu_ep``, following the library convention: a NullHandler, records propagate to the
application's handlers, and only when the application configured no handler at all (on ``npu_ep`` or on any
logger it propagates to) does our own fallback write warnings to stderr, so declined nodes are visible without any
configuration but never printed twice nor hidden by an application's own handler.

The ``log_level`` provider option is the session's, not the process's: while NpuEP works for a session
(``session_scope``: its GetCapability, Compile and release), records pass or not by that session's level; elsewhere,
and for sessions without the option, the ``npu_ep`` logger's own (the application's) configuration decides. So a
``log_level=error`` session silences only its own warnings, and a ``debug`` session leaves no later session at
DEBUG. NpuEP code logs through ``logger`` (an adapter of ``npu_ep`` that applies the session's level).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

FORMAT = "NpuEP %(levelname)s: %(message)s"
LEVEL_ATTR = "npu_ep_session_level"  # on records made under a session's level
_SESSION_LEVEL: ContextVar[int | None] = ContextVar("npu_ep_session_log_level", default=None)


def _application_handles(log: logging.Logger) -> bool:
    """True when a handler the application installed would receive records of ``log``."""
    current: logging.Logger | None = log
    while current is not None:
        if any(not isinstance(h, (logging.NullHandler, _FallbackStderrHandler)) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


class _FallbackStderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at emit time, only while the application configured no handler:
    warnings and above, and below that what a session's own ``log_level`` let through."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        session_level = getattr(record, LEVEL_ATTR, None) or logging.WARNING
        if record.levelno < min(logging.WARNING, session_level) or _application_handles(_base):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never raise into the EP
            self.handleError(record)


class _SessionLogger(logging.LoggerAdapter):
    """``npu_ep`` as NpuEP code logs to it: under ``session_scope`` the session's level decides which records are
    made, elsewhere the logger's own effective level (the application's configuration)."""

    @property
    def level(self) -> int:
        """The ``npu_ep`` logger's own level (the application's; a session's ``log_level`` never changes it)."""
        return self.logger.level

    def isEnabledFor(self, level: int) -> bool:
        scoped = _SESSION_LEVEL.get()
        if scoped is None:
            return self.logger.isEnabledFor(level)
        return not self.logger.disabled and self.logger.manager.disable < level and level >= scoped

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 4)  # the caller of debug()/info()/..., not this adapter
        self.log_for(_SESSION_LEVEL.get(), level, msg, *args, **kwargs)

    def log_for(self, session_level: int | None, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log as a session at ``session_level`` would (None: as the application configured ``npu_ep``), without
        entering ``session_scope``: for a session's release, which runs in ORT's destructor, possibly from the
        garbage collector in the middle of another ContextVar.set (a nested set there frees the context's map)."""
        if session_level is None:
            if not self.logger.isEnabledFor(level):
                return
        elif self.logger.disabled or self.logger.manager.disable >= level or level < session_level:
            return
        else:
            kwargs["extra"] = {**(kwargs.get("extra") or {}), LEVEL_ATTR: session_level}
        kwargs.setdefault("stacklevel", 3)
        self.logger._log(level, msg, args, **kwargs)


_base = logging.getLogger("npu_ep")
if not any(isinstance(h, logging.NullHandler) for h in _base.handlers):
    _base.addHandler(logging.NullHandler())
FALLBACK = next((h for h in _base.handlers if isinstance(h, _FallbackStderrHandler)), None) or _FallbackStderrHandler()
if FALLBACK not in _base.handlers:
    _base.addHandler(FALLBACK)
logger = _SessionLogger(_base, {})


def level_number(name: str | None) -> int | None:
    """The ``log_level`` option's name as a logging level; None stays None (no option: the application's)."""
    return None if name is None else int(getattr(logging, name.upper()))


@contextlib.contextmanager
def session_scope(level: int | None) -> Iterator[None]:
    """NpuEP's records inside this block follow ``level`` (a session's ``log_level``; None: the application's)."""
    token = _SESSION_LEVEL.set(level)
    try:
        yield
    finally:
        _SESSION_LEVEL.reset(token)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def session_scoped(method: _Method) -> _Method:
    """Runs a session's method under that session's level (its ``log_level`` attribute)."""
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        level = getattr(self, "log_level", None)
        with session_scope(level):
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                with contextlib.suppress(AttributeError):  # the shim formats it after this scope ended
                    setattr(exc, LEVEL_ATTR, level)
                raise
    return run  # type: ignore[return-value] - the wrapper takes and returns what fn does


def error_level(exc: BaseException, live_levels: Iterable[int | None]) -> int | None:
    """The log level an error text follows: that of the session whose callback raised ``exc`` (recorded on it by
    ``session_scoped``); for an error outside those (a run), the lowest of ``live_levels`` (the live sessions').
    None: the application's configuration."""
    if hasattr(exc, LEVEL_ATTR):
        return getattr(exc, LEVEL_ATTR)
    return min((level for level in live_levels if level is not None), default=None)


def escape(text: object) -> str:
    """``text`` safe to print: every control, format or separator character (newline, ESC of ANSI/OSC sequences,
    bidi overrides, U+2028...) written as a Python escape (``\\n``, ``\\x1b``, ``\\u202e``), everything else as is.

    For model-supplied strings (node, value, graph names, op types, domains, paths) entering any message: a hostile
    model could otherwise forge log lines or drive the terminal. Idempotent (its output has no such characters),
    so a message may escape a name that ``NodeInfo.describe`` already escaped."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c == " " else _escaped(c) for c in s)


def _escaped(c: str) -> str:
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
