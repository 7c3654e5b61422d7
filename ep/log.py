"""NpuEP's logger, ``npu_ep``, following the library convention: a NullHandler, records propagate to the
application's handlers, and only when the application configured no handler at all (on ``npu_ep`` or on any
logger it propagates to) does our own fallback write warnings to stderr, so declined nodes are visible without any
configuration but never printed twice nor hidden by an application's own handler.

The ``log_level`` provider option sets this logger's level; without it the logger inherits the application's.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "NpuEP %(levelname)s: %(message)s"


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
    """Writes to whatever ``sys.stderr`` is at emit time, only while the application configured no handler."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        if _application_handles(logger):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never raise into the EP
            self.handleError(record)


logger = logging.getLogger("npu_ep")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
    logger.addHandler(logging.NullHandler())
FALLBACK = next((h for h in logger.handlers if isinstance(h, _FallbackStderrHandler)), None) or _FallbackStderrHandler()
if FALLBACK not in logger.handlers:
    logger.addHandler(FALLBACK)


def set_level(name: str) -> None:
    """The ``log_level`` provider option: also lets our stderr fallback print below WARNING."""
    level = getattr(logging, name.upper())
    logger.setLevel(level)
    FALLBACK.setLevel(level)


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
