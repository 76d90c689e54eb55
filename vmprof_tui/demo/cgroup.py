"""A CPU cgroup with a cpu.max quota for the demo VMM's vCPU threads (the throttling scenario).

The VMM makes one cgroup per VM, moves its vCPU threads into it, and at the end reports the
cgroup's own count of throttled time (the ground truth for vmprof's ``[steal] (throttled)``)
and removes it.  Cgroup v2 (``cpu.max``, threaded mode for single threads) where its cpu
controller is enabled; else cgroup v1's cpu controller (``cpu.cfs_quota_us``), which is what
the development machines have.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupError(RuntimeError):
    pass


def _v2_root() -> Path | None:
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        with contextlib.suppress(OSError):
            if "cpu" in (root / "cgroup.controllers").read_text().split():
                return root
    return None


class CpuQuota:
    def __init__(self, name: str, quota_us: int, period_us: int) -> None:
        v2 = _v2_root()
        v1 = CGROUP_ROOT / "cpu"
        self.v2 = v2 is not None
        self.root = v2 if v2 is not None else v1
        if not self.v2 and not (v1 / "cpu.cfs_quota_us").exists():
            raise CgroupError("no CPU cgroup controller (cgroup v2 cpu, or v1 cpu) to put a quota on")
        self.path = self.root / name
        try:
            self.path.mkdir(exist_ok=True)
            if self.v2:
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.subtree_control").write_text("+cpu")
                (self.path / "cgroup.type").write_text("threaded")
                (self.path / "cpu.max").write_text(f"{quota_us} {period_us}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(period_us))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        except OSError as e:
            self.remove()
            raise CgroupError(f"cannot make the CPU cgroup {self.path}: {e}") from None

    def add_thread(self, tid: int) -> None:
        (self.path / ("cgroup.threads" if self.v2 else "tasks")).write_text(str(tid))

    def release_thread(self, tid: int) -> None:
        """Move a thread back to the root: no quota period throttles it (or counts) after this."""
        (self.root / ("cgroup.threads" if self.v2 else "tasks")).write_text(str(tid))

    def throttled_ns(self) -> int:
        """How long the cgroup was throttled (cpu.stat), in ns."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if " " in line)
        return int(stat["throttled_usec"]) * 1000 if self.v2 else int(stat["throttled_time"])

    def remove(self) -> None:
        """Move the threads left in it back to the root and remove it."""
        threads = self.path / ("cgroup.threads" if self.v2 else "tasks")
        with contextlib.suppress(OSError):
            for tid in threads.read_text().split():
                with contextlib.suppress(OSError):
                    self.release_thread(int(tid))
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
