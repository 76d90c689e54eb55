"""The process's C library (one handle for every ctypes caller) and a thread's scheduler times."""

from __future__ import annotations

import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ptrace.restype = ctypes.c_long  # ptrace(request, pid, addr, data): for the ptrace-based counters
LIBC.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def schedstat(pid: int | str, tid: int) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) of a thread from /proc/PID/task/TID/schedstat; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0
