"""``npu-cache``: list, verify or clear NpuEP's on-disk cache of compiled context binaries.

Exit codes: 0 ok, 1 ``verify`` found corrupt entries, 2 bad input (bad arguments, --dir is not a directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._cli import quiet_interrupt

if TYPE_CHECKING:  # imported inside main (Ctrl-C there exits 130 quietly: _cli)
    from rich.table import Table

    from npu_ep.context_cache.store import CacheEntry


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment] - bytes become a float of the unit
    return str(n)  # pragma: no cover


def _age(s: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= span:
            return f"{s / span:.1f} {unit}"
    return f"{s:.0f} s"


def _table(entries: list[CacheEntry], full_keys: bool) -> Table:
    from rich.table import Table

    t = Table()
    for col, just in (("key", "left"), ("size", "right"), ("target", "left"), ("compiler", "left"),
                      ("age", "right"), ("last used", "right"), ("status", "left")):
        t.add_column(col, justify=just, no_wrap=col == "key")  # type: ignore[arg-type] - rich wants a literal
    for e in entries:
        status = "[green]ok[/]" if e.ok else f"[red]CORRUPT[/] {e.error or ''}"
        t.add_row(e.key if full_keys else e.key[:16], _size(e.size), e.target or "?", e.compiler_version or "?",
                  _age(e.age_s), _age(e.idle_s), status)
    return t


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-cache", description="Inspect NpuEP's cache of compiled context binaries.")
    p.add_argument("--dir", type=Path, default=None,
                   help="cache directory (default: $NPU_EP_CACHE_DIR or the user cache dir, e.g. ~/.cache/npu_ep)")
    p.add_argument("--full-keys", action="store_true", help="show full 64-digit keys")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list entries with size, target, compiler version and age")
    v = sub.add_parser("verify", help="check every hash of every entry (exit 1 if any is corrupt)")
    v.add_argument("--remove-corrupt", action="store_true", help="delete corrupt entries")
    sub.add_parser("clear", help="delete every entry")
    return p


@quiet_interrupt
def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (0 ok, 1 corrupt entries found, 2 bad input)."""
    from rich.console import Console

    from npu_ep.context_cache.store import CacheStore, default_cache_dir

    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage error
        return 0 if e.code == 0 else 2
    console = Console(soft_wrap=False, width=max(Console().width, 120))
    root = args.dir if args.dir is not None else default_cache_dir()
    if root.exists() and not root.is_dir():
        console.print(f"[red]npu-cache: {root} is not a directory[/]")
        return 2
    if args.dir is not None and not root.exists():
        console.print(f"[red]npu-cache: cache directory {root} does not exist[/]")
        return 2
    store = CacheStore(root)
    if args.cmd == "clear":
        n = store.clear()
        console.print(f"removed {n} file(s) from {root}")
        return 0
    entries = store.verify_all(remove_corrupt=args.remove_corrupt) if args.cmd == "verify" else store.entries()
    total = sum(e.size for e in entries)
    noun = "entry" if len(entries) == 1 else "entries"
    console.print(f"NpuEP cache {root}: {len(entries)} {noun}, {_size(total)}", soft_wrap=True)
    if entries:
        console.print(_table(entries, args.full_keys))
    bad = [e for e in entries if not e.ok]
    if args.cmd == "verify":
        msg = f"{len(bad)} corrupt entr{'y' if len(bad) == 1 else 'ies'}" if bad else "all entries verified"
        if bad and args.remove_corrupt:
            msg += " (removed)"
        console.print(msg)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
