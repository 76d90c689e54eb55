"""Can this host collect LBR samples with measured CPI?  Asked the way the collector
will use it: perf_event_open(2) of a hardware cycles event, of an instructions event, and
of cycles with a branch stack for the chosen filter; then the LBR depth from sysfs.

On the development and CI machines (Firecracker VMs) the first step fails: there is no
hardware PMU, so there is no LBR either; the message says so and points to the
`perf script` import.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from vmprof_tui.collect.perf_event import (
    PERF_COUNT_HW_CPU_CYCLES,
    PERF_COUNT_HW_INSTRUCTIONS,
    branch_sample_type,
    make_attr,
    perf_event_open,
)
from vmprof_tui.lbr.model import BranchFilter

LBR_DEPTH_FILE = "/sys/bus/event_source/devices/cpu/caps/branches"


def _why(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    return f"{name} ({e.strerror})"


@dataclass(frozen=True)
class Capability:
    pmu: bool  # hardware cycles and instructions events open
    branch_stack: bool  # cycles with this branch filter opens
    lbr_depth: int  # entries per branch stack (sysfs caps/branches), 0 if unknown
    timed_lbr_hint: bool  # the CPU's LBR format is known to carry cycle counts (best effort)
    message: str  # one line: what works or what is missing and what to do instead

    @property
    def ok(self) -> bool:
        return self.pmu and self.branch_stack


IMPORT_HINT = ("record with `perf record -b` on a host with a PMU and import it: "
               "vmprof blocks --perf-script FILE (see docs/lbr.md)")


def detect(flt: BranchFilter = BranchFilter.CALL | BranchFilter.RETURN, cpu: int = 0) -> Capability:
    """Probe this host (needs root or CAP_PERFMON for system-wide events)."""
    try:
        fd = perf_event_open(make_attr(PERF_COUNT_HW_CPU_CYCLES), -1, cpu)
        os.close(fd)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return Capability(False, False, 0, False,
                              f"perf_event_open(cycles) was refused: {_why(e)}; run as root or grant CAP_PERFMON "
                              "(or lower /proc/sys/kernel/perf_event_paranoid)")
        return Capability(False, False, 0, False,
                          f"no hardware PMU: perf_event_open(PERF_TYPE_HARDWARE cycles) failed with {_why(e)}, "
                          f"so this CPU/VM has no cycle counter and no LBR; {IMPORT_HINT}")
    try:
        fd = perf_event_open(make_attr(PERF_COUNT_HW_INSTRUCTIONS), -1, cpu)
        os.close(fd)
    except OSError as e:
        return Capability(False, False, 0, False,
                          f"the PMU has no instructions event: perf_event_open(instructions) failed with {_why(e)}; "
                          f"CPI cannot be measured; {IMPORT_HINT}")
    depth = 0
    try:
        with open(LBR_DEPTH_FILE) as f:
            depth = int(f.read().strip() or 0)
    except (OSError, ValueError):
        depth = 0
    try:
        fd = perf_event_open(make_attr(PERF_COUNT_HW_CPU_CYCLES, sample_period=1_000_003, flt=flt), -1, cpu)
        os.close(fd)
    except OSError as e:
        what = {errno.EOPNOTSUPP: "the CPU or the kernel does not support branch stacks (no LBR/BRBE)",
                errno.EINVAL: "the kernel rejects this branch filter",
                errno.ENOENT: "the PMU driver has no branch stack"}.get(e.errno or 0, "branch stack unavailable")
        return Capability(True, False, depth, False,
                          f"branch stack unsupported: {what}: perf_event_open(cycles, branch_sample_type="
                          f"{branch_sample_type(flt):#x}) failed with {_why(e)}; {IMPORT_HINT}")
    timed = _timed_lbr_hint()
    return Capability(True, True, depth or 16, timed,
                      f"LBR collection available: {depth or 'unknown (assuming 16)'} entries, filter "
                      f"{flt.describe()}, timed LBR {'likely' if timed else 'unknown'}")


def _timed_lbr_hint() -> bool:
    """Intel CPUs since Skylake record cycles per LBR entry.  Best effort from /proc/cpuinfo:
    family 6 and the 'arch_lbr' flag, or model >= 0x4e (Skylake)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read(8192)
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if fields.get("vendor_id") != "GenuineIntel":
        return False
    if "arch_lbr" in fields.get("flags", "").split():
        return True
    try:
        return int(fields.get("cpu family", "0")) == 6 and int(fields.get("model", "0")) >= 0x4E
    except ValueError:
        return False
