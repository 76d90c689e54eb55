"""Plain data types shared by the LBR collection, import and analysis.

Ordering convention: inside vmprof an :class:`LbrSample` holds its branch entries
**oldest first** (chronological), so entry ``i-1`` -> entry ``i`` delimits block ``i``.
The kernel (``perf_branch_entry[]``), ``perf script`` and the BPF record list them
newest first; every decoder converts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# perf_branch_entry's third word (UAPI include/uapi/linux/perf_event.h), little endian bit positions.
INFO_MISPRED = 1 << 0
INFO_PREDICTED = 1 << 1
INFO_IN_TX = 1 << 2
INFO_ABORT = 1 << 3
INFO_CYCLES_SHIFT = 4
INFO_CYCLES_MASK = 0xFFFF
INFO_TYPE_SHIFT = 20
INFO_TYPE_MASK = 0xF
LBR_CYCLES_SATURATED = 0xFFFF  # the 16-bit cycle field saturates; a value this large is "at least"


class BranchFilter(enum.IntFlag):
    """What the LBR records (perf's branch_sample_type, reduced to what the paper needs)."""

    CALL = 1  # any call (direct, indirect)
    RETURN = 2  # any return
    ANY = 4  # every taken branch (jumps, conditional branches, calls, returns)
    KERNEL = 8  # also record branches in kernel mode (default: user mode only)

    @property
    def records_all_taken_branches(self) -> bool:
        return bool(self & BranchFilter.ANY)

    def describe(self) -> str:
        kinds = "any taken branch" if self & BranchFilter.ANY else " + ".join(
            n for f, n in ((BranchFilter.CALL, "call"), (BranchFilter.RETURN, "return")) if self & f) or "nothing"
        return f"{kinds}, {'user + kernel' if self & BranchFilter.KERNEL else 'user'} mode"


CALL_RETURN_USER = BranchFilter.CALL | BranchFilter.RETURN


class Fields(enum.IntFlag):
    """Which parts of each branch entry were collected (the paper's From/To choice)."""

    FROM = 1
    TO = 2
    INFO = 4  # the flags word: mispredict bits and, on CPUs with timed LBR, cycles

    @property
    def label(self) -> str:
        parts = [n for f, n in ((Fields.FROM, "from"), (Fields.TO, "to"), (Fields.INFO, "info")) if self & f]
        return "+".join(parts) or "none"


@dataclass
class LbrSample:
    """One sample: the branch entries plus the counter deltas since the previous sample.

    ``from_`` / ``to`` are 0 where unknown (not collected by the pattern, or an unused
    LBR slot).  ``lbr_cycles`` is 0 where the CPU recorded no cycle count (no timed LBR).
    ``cycles`` / ``instructions`` are the counts since the previous sample of the same
    perf-event group (None when not collected); CPI = cycles / instructions.
    """

    from_: np.ndarray  # uint64, oldest first
    to: np.ndarray  # uint64, oldest first
    lbr_cycles: np.ndarray | None = None  # uint32 per entry, 0 = not recorded
    cycles: int | None = None
    instructions: int | None = None
    ip: int = 0
    time_ns: int = 0
    cpu: int = -1
    pid: int = -1
    tid: int = -1
    comm: str = ""
    vm: str | None = None
    branch_filter: BranchFilter = CALL_RETURN_USER
    fields: Fields = Fields.FROM | Fields.TO
    # perf script -F brstackinsn: (block start, block end) -> (instructions perf listed, function or "")
    listed_insns: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)
    branch_types: list[str] | None = None  # perf's TYPE column per entry, when present

    def __post_init__(self) -> None:
        self.from_ = np.asarray(self.from_, dtype=np.uint64)
        self.to = np.asarray(self.to, dtype=np.uint64)
        if self.from_.shape != self.to.shape or self.from_.ndim != 1:
            raise ValueError("from_ and to must be 1-d arrays of the same length")
        if self.lbr_cycles is not None:
            self.lbr_cycles = np.asarray(self.lbr_cycles, dtype=np.uint32)
            if self.lbr_cycles.shape != self.from_.shape:
                raise ValueError("lbr_cycles must have one value per entry")

    @property
    def nr(self) -> int:
        return int(self.from_.shape[0])

    @property
    def cpi(self) -> float | None:
        if self.cycles is None or not self.instructions:
            return None
        return self.cycles / self.instructions


def from_msr_stack(from_ips: Sequence[int], to_ips: Sequence[int], tos: int, **kw: object) -> LbrSample:
    """An :class:`LbrSample` from a raw LBR register stack as the paper dumps it.

    ``from_ips[k]`` / ``to_ips[k]`` are MSR_LASTBRANCH_k_FROM_IP / _TO_IP, ``tos`` the
    top-of-stack index (the newest entry).  All-zero slots were never written (the
    stack had not wrapped yet) and are dropped.
    """
    n = len(from_ips)
    if len(to_ips) != n or not 0 <= tos < n:
        raise ValueError("from/to stacks must have the same length and tos must index them")
    order = [(tos + 1 + k) % n for k in range(n)]  # oldest .. newest
    pairs = [(from_ips[k], to_ips[k]) for k in order if from_ips[k] or to_ips[k]]
    return LbrSample(from_=np.array([p[0] for p in pairs], dtype=np.uint64),
                     to=np.array([p[1] for p in pairs], dtype=np.uint64), **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ResolvedAddr:
    """Where a runtime address lives: the object file, its address in that file's
    virtual address space (what the ELF symbols and sections use) and its function."""

    object_path: str
    vaddr: int
    function: str
    func_start: int  # vaddr of the function's first byte
    func_end: int  # vaddr one past its last byte


Resolve = Callable[[int], "ResolvedAddr | None"]
CodeReader = Callable[[str, int, int], bytes]  # (object_path, vaddr, size) -> code bytes (may be shorter)
