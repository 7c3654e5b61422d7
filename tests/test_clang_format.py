"""The native sources (ep/native, kernels/native, ep/loader) are laid out as .clang-format says (Google-based, 120
columns), so CI keeps the C++ layout as it keeps the Python one (tests/test_lint.py).

clang-format comes with the test extra (the ``clang-format`` wheel, pinned in constraints-dev.txt); a missing one
fails rather than skips. To fix a failure: ``clang-format -i`` on the files it names.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE_FOLDERS = ("ep/native", "kernels/native", "ep/loader")


def _sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for folder in NATIVE_FOLDERS for p in (ROOT / folder).iterdir()
                  if p.suffix in (".cc", ".h"))


def test_native_sources_follow_clang_format() -> None:
    assert importlib.util.find_spec("clang_format") is not None, "clang-format is missing: install the test extra"
    import clang_format

    files = _sources()
    assert len(files) > 50, files  # the three folders, not an empty glob
    done = subprocess.run([clang_format.get_executable("clang-format"), "--dry-run", "-Werror", "--style=file", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    flagged = sorted({line.split(":", 1)[0] for line in done.stderr.splitlines() if ": error:" in line})
    assert done.returncode == 0, f"not as .clang-format lays them out (clang-format -i fixes): {flagged}\n" \
                                 f"{done.stderr[:3000]}"
