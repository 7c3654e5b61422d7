"""This process's own peak resident memory, for benchmarks and memory tests.

Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the parent's resident size at fork over the exec into the
child's ``ru_maxrss``, so a child started from a 600 MB pytest reports at least 600 MB and growth below that is
invisible. ``VmHWM`` in ``/proc/self/status`` is the high-water mark of this process's own address space.
"""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """Peak RSS of this process since its exec [bytes] (``ru_maxrss`` where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
