"""perf_event_open(2) from Python: the attribute struct, the constants vmprof uses and the raw syscall.

The LBR collector (lbr/collector.py) opens cycles and instructions groups with a branch stack through it, its
capability probe asks the same calls, and `vmprof predict` counts a program's instructions with it.
"""

from __future__ import annotations

import ctypes
import os

from vmprof_tui.lbr.model import BranchFilter
from vmprof_tui.libc import LIBC

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
