"""The machine a measurement was made on, as the reference and the cost files of `vmprof predict` describe it
(predict_measure.py and predict_costs.py both write it): its CPU quota (a cgroup), and how much of its CPU other
work takes (the run-queue wait of the measuring thread: a host's counterpart of a VM's steal)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from vmprof_tui.libc import schedstat


def machine_description() -> dict[str, object]:
    return {"host": socket.gethostname(), "kernel": os.uname().release, "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cgroup_cpu_limit() -> dict[str, object]:
    """This process's cgroup and its CPU quota (v1 cfs_quota_us/cfs_period_us, or v2 cpu.max)."""
    out: dict[str, object] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            d = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            try:
                quota = int((d / "cpu.cfs_quota_us").read_text())
                period = int((d / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            out.update({"cgroup": path, "cpu_quota": None if quota < 0 else quota / period})
        elif controllers == "" and "cgroup" not in out:
            try:
                q, p = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max").read_text().split()
                out.update({"cgroup": path, "cpu_quota": None if q == "max" else int(q) / int(p)})
            except (OSError, ValueError):
                pass
    return out


def my_schedstat() -> tuple[int, int]:
    return schedstat("self", threading.get_native_id())


def wait_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Of the time this thread was runnable between two schedstat readings, the share it waited for a CPU: what
    other work on its CPU took (a host's counterpart of a VM's steal)."""
    cpu, wait = after[0] - before[0], after[1] - before[1]
    return wait / (cpu + wait) if cpu + wait > 0 else 0.0
