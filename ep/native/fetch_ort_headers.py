"""Fetch ONNX Runtime's C API headers (incl. the plugin-EP ABI) for building the native shim.

The onnxruntime wheel ships no C headers. Debian sid's ``libonnxruntime-dev`` (1.23.x) ships
``onnxruntime_ep_c_api.h``; we download it with a *private* apt configuration (sources list, state and cache
directories under ``DEST``) so the system's apt setup is never touched, then unpack it with ``dpkg -x``.

Usage: ``python fetch_ort_headers.py DEST`` -> prints the include directory. ``ORT_INCLUDE_DIR`` overrides.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

REQUIRED_HEADER = "onnxruntime_ep_c_api.h"
SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class HeaderFetchError(RuntimeError):
    pass


def _find_include_dir(root: Path) -> Path | None:
    hits = sorted(root.rglob(REQUIRED_HEADER))
    return hits[0].parent if hits else None


def _apt(dest: Path, *args: str) -> None:
    opts = [
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={dest / 'parts'}",
        "-o", f"Dir::State::Lists={dest / 'lists'}",
        "-o", f"Dir::Cache={dest / 'cache'}",
        "-o", "APT::Sandbox::User=root",
        "-o", "Debug::NoLocking=1",
    ]
    proc = subprocess.run(["apt-get", "-q", *opts, *args], cwd=dest, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HeaderFetchError(f"apt-get {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")


def fetch(dest: Path) -> Path:
    """Return an include dir containing the plugin-EP headers, downloading them into ``dest`` if needed."""
    override = os.environ.get("ORT_INCLUDE_DIR")
    if override:
        inc = Path(override)
        if not (inc / REQUIRED_HEADER).is_file():
            raise HeaderFetchError(f"ORT_INCLUDE_DIR={override} does not contain {REQUIRED_HEADER}")
        return inc
    dest = dest.resolve()
    found = _find_include_dir(dest / "root") if (dest / "root").is_dir() else None
    if found:
        return found
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise HeaderFetchError(
            "cannot find ONNX Runtime C headers: set ORT_INCLUDE_DIR to a directory containing "
            f"{REQUIRED_HEADER} (ORT >= 1.23), or build on Debian where apt-get can download libonnxruntime-dev")
    for sub in ("parts", "lists/partial", "cache/archives/partial"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    (dest / "parts" / "sid.sources").write_text(SOURCES)
    _apt(dest, "update")
    _apt(dest, "download", "libonnxruntime-dev")
    debs = glob.glob(str(dest / "libonnxruntime-dev_*.deb"))
    if not debs:
        raise HeaderFetchError(f"apt-get download produced no libonnxruntime-dev .deb in {dest}")
    subprocess.run(["dpkg", "-x", debs[0], str(dest / "root")], check=True)
    found = _find_include_dir(dest / "root")
    if not found:
        raise HeaderFetchError(f"{debs[0]} has no {REQUIRED_HEADER}: Debian's package is older than ORT 1.23")
    return found


if __name__ == "__main__":
    try:
        print(fetch(Path(sys.argv[1] if len(sys.argv) > 1 else "build/ort-headers")))
    except HeaderFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
