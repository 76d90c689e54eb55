"""Can this host collect LBR samples with measured CPI?  Asked the way the collector
will use it: perf_event_open(2) of a hardware cycles event, of an instructions event, and
of cycles with a branch stack for the chosen filter; then the LBR depth from sysfs.

On the development and CI machines (Firecracker VMs) the first step fails: there is no
hardware PMU, so there is no LBR either; the message says so and points to the
`perf script` import.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from vmprof_tui.libc import LIBC
from vmprof_tui.record.lbr_model import BranchFilter

NR_PERF_EVENT_OPEN = 298  # x86-64
PERF_TYPE_HARDWARE = 0
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_SAMPLE_IP = 1 << 0
PERF_SAMPLE_TID = 1 << 1
PERF_SAMPLE_TIME = 1 << 2
PERF_SAMPLE_CPU = 1 << 7
PERF_SAMPLE_PERIOD = 1 << 8
PERF_SAMPLE_BRANCH_STACK = 1 << 11
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_SAMPLE_BRANCH_USER = 1 << 0
PERF_SAMPLE_BRANCH_KERNEL = 1 << 1
PERF_SAMPLE_BRANCH_ANY = 1 << 3
PERF_SAMPLE_BRANCH_ANY_CALL = 1 << 4
PERF_SAMPLE_BRANCH_ANY_RETURN = 1 << 5
PERF_SAMPLE_BRANCH_CALL_STACK = 1 << 11
ATTR_DISABLED = 1 << 0
ATTR_EXCLUDE_KERNEL = 1 << 5
ATTR_EXCLUDE_HV = 1 << 6
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_ATTR_SIZE_VER8 = 136
LBR_DEPTH_FILE = "/sys/bus/event_source/devices/cpu/caps/branches"


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr (UAPI, PERF_ATTR_SIZE_VER8 = 136 bytes); bitfields in `flags`."""

    _fields_ = [
        ("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64), ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64), ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16), ("reserved_2", ctypes.c_uint16), ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32), ("sig_data", ctypes.c_uint64), ("config3", ctypes.c_uint64),
    ]


assert ctypes.sizeof(PerfEventAttr) == PERF_ATTR_SIZE_VER8


def branch_sample_type(flt: BranchFilter) -> int:
    bst = PERF_SAMPLE_BRANCH_USER | (PERF_SAMPLE_BRANCH_KERNEL if flt & BranchFilter.KERNEL else 0)
    if flt & BranchFilter.ANY:
        return bst | PERF_SAMPLE_BRANCH_ANY
    if flt & BranchFilter.CALL:
        bst |= PERF_SAMPLE_BRANCH_ANY_CALL
    if flt & BranchFilter.RETURN:
        bst |= PERF_SAMPLE_BRANCH_ANY_RETURN
    return bst


PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0


def make_attr(config: int, *, sample_period: int = 0, flt: BranchFilter | None = None,
              user_only: bool = True, disabled: bool = True, type_: int = PERF_TYPE_HARDWARE) -> PerfEventAttr:
    a = PerfEventAttr()
    a.type = type_
    a.size = PERF_ATTR_SIZE_VER8
    a.config = config
    a.sample_period = sample_period
    a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
    a.flags = (ATTR_DISABLED if disabled else 0) | ATTR_EXCLUDE_HV | (ATTR_EXCLUDE_KERNEL if user_only else 0)
    if sample_period:
        a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU | PERF_SAMPLE_PERIOD
    if flt is not None:
        a.sample_type |= PERF_SAMPLE_BRANCH_STACK
        a.branch_sample_type = branch_sample_type(flt)
    return a


_libc = LIBC
_libc.syscall.restype = ctypes.c_long


def perf_event_open(attr: PerfEventAttr, pid: int = -1, cpu: int = 0, group_fd: int = -1) -> int:
    """The raw syscall; raises OSError with the kernel's errno."""
    fd = _libc.syscall(ctypes.c_long(NR_PERF_EVENT_OPEN), ctypes.byref(attr), ctypes.c_int(pid), ctypes.c_int(cpu),
                       ctypes.c_int(group_fd), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


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
