"""The package is clean under its ruff configuration (pyproject.toml, [tool.ruff]), so CI keeps the habits the
configuration states: 120 columns, no unused imports or noqa markers, reasons on blind excepts.

ruff comes with the test extra (pinned in constraints-dev.txt); a missing ruff fails rather than skips, so a CI
run cannot pass without linting.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean() -> None:
    assert importlib.util.find_spec("ruff") is not None, "ruff is missing: install the test extra (.[test])"
    argv = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check found problems (fix them; `ruff check --fix` does the safe ones):\n" \
                                 f"{done.stdout}{done.stderr}"
