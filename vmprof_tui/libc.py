"""The process's C library (one handle for every ctypes caller) and a thread's scheduler times."""

from __future__ import annotations

import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)


def schedstat(pid: int | str, tid: int) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) of a thread from /proc/PID/task/TID/schedstat; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0
