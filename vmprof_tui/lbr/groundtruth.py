"""Exact ground truth for the block analysis without a PMU.

:func:`trace` single-steps a program with ptrace (PTRACE_TRACEME / PTRACE_SINGLESTEP /
PTRACE_GETREGS via ctypes) and returns every user-mode instruction it retired, in order.
:func:`branches` finds its taken branches (the next RIP is not the fall-through
address) and their kinds, decoding each instruction from the traced process's own
memory (PTRACE_PEEKTEXT), not from the file: an independent path from the analysis,
which reads the ELF file and sweeps whole functions.

:class:`LbrSimulator` then builds what an LBR would have held at chosen sample points:
a ring of `depth` entries fed with the branches a filter keeps, wrap-around included,
plus the exact instructions since the previous sample and synthetic cycles from a
per-instruction cost model (also the per-entry cycles a timed LBR would have recorded,
saturating at 16 bits).  Its :class:`TruthBlock` list is what the analysis must
reproduce.  Single-stepping traps on every instruction (docs/performance.md): keep programs small.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import capstone
import numpy as np

from vmprof_tui.lbr.disasm import KIND_CALL, KIND_FAR, KIND_JCC, KIND_JMP, KIND_OTHER, KIND_RET, classify
from vmprof_tui.lbr.model import LBR_CYCLES_SATURATED, BranchFilter, Fields, LbrSample
from vmprof_tui.libc import LIBC

PTRACE_TRACEME = 0
PTRACE_PEEKTEXT = 1
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_KILL = 8
PTRACE_CONT = 7
PTRACE_SETOPTIONS = 0x4200
PTRACE_O_TRACEEXIT = 0x40
PTRACE_O_EXITKILL = 0x100000
PTRACE_EVENT_EXIT = 6


_REG_NAMES = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi",
              "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")


class _Regs(ctypes.Structure):  # struct user_regs_struct (x86-64)
    _fields_ = [(n, ctypes.c_ulonglong) for n in _REG_NAMES]


class TraceError(RuntimeError):
    pass


def _libc() -> ctypes.CDLL:
    return LIBC


@dataclass
class Trace:
    rips: np.ndarray  # uint64: the address of every retired instruction, in order
    insn_bytes: dict[int, bytes]  # code bytes at each distinct RIP, read from the traced process
    exit_status: int
    pid: int = 0
    stopped: str | None = None  # why the trace ended before the program did (a limit), None if it exited
    steps: int = 0  # single-step traps: rips plus every further iteration of a rep string instruction


# (rips, how many are retired, code bytes by RIP, pid): a trace in progress
Progress = Callable[[np.ndarray, int, dict[int, bytes], int], None]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def trace(path: str, max_steps: int = 2_000_000, argv: list[str] | None = None, *,
          on_exit: Callable[[int], None] | None = None, deadline: float | None = None,
          should_stop: Callable[[], bool] | None = None, stop_at_limit: bool = False,
          on_progress: Progress | None = None) -> Trace:
    """Single-step `path` from its first instruction to its exit.

    ``on_exit(pid)`` runs while the process still exists at its end (its maps readable).  Past
    ``max_steps`` instructions, the monotonic ``deadline`` or once ``should_stop()`` (asked every 4096
    steps) the trace raises TraceError, or with ``stop_at_limit`` kills the program and returns what was
    traced (``Trace.stopped`` says why).  ``on_progress(rips, n, insn_bytes, pid)`` is called every 4096
    instructions and once at the end, from this thread: ``rips[:n]`` are retired and stay as they are, so another
    thread may read them (a live collector, lbr/simulate.py), and ``insn_bytes`` has their code."""
    libc = _libc()
    pid = os.fork()
    if pid == 0:  # child: ask to be traced, then exec (stops with SIGTRAP before the first instruction)
        try:
            libc.ptrace(PTRACE_TRACEME, 0, None, None)
            os.execv(path, argv or [path])
        finally:
            os._exit(127)
    _, st = os.waitpid(pid, 0)
    if not os.WIFSTOPPED(st):
        raise TraceError(f"{path}: did not stop at exec (status {st:#x})")
    ptrace = libc.ptrace
    ptrace(PTRACE_SETOPTIONS, pid, None, ctypes.c_void_p(PTRACE_O_EXITKILL | (PTRACE_O_TRACEEXIT if on_exit else 0)))
    regs = _Regs()
    rp = ctypes.byref(regs)
    rips = np.empty(max_steps, dtype=np.uint64)
    seen: dict[int, bytes] = {}
    rep_cache: dict[int, bool] = {}
    n = steps = 0
    stopped = None
    exit_event = (signal.SIGTRAP | (PTRACE_EVENT_EXIT << 8)) << 8 | 0x7F
    try:
        while True:
            if ptrace(PTRACE_GETREGS, pid, None, rp) != 0:
                raise TraceError(f"PTRACE_GETREGS failed: {os.strerror(ctypes.get_errno())}")
            rip = regs.rip
            if n >= max_steps:
                stopped = f"more than {max_steps} instructions"
            elif n & 4095 == 0 and deadline is not None and time.monotonic() >= deadline:
                stopped = "the time limit"
            elif n & 4095 == 0 and should_stop is not None and should_stop():
                stopped = "an interrupt"
            if n & 4095 == 0 and on_progress is not None:
                on_progress(rips, n, seen, pid)
            if stopped:
                if not stop_at_limit:
                    raise TraceError(f"{path}: {stopped}; use a smaller program")
                if on_exit:
                    on_exit(pid)
                _kill(pid)
                st = 0
                break
            if rip not in seen:
                seen[rip] = _peek(libc, pid, rip, 16)
            # a rep-prefixed string instruction traps after each iteration with its RIP unchanged; the PMU
            # counts it as one instruction retired, and it is no branch
            if not (n and rip == int(rips[n - 1]) and _repeats(seen[rip], rep_cache, rip)):
                rips[n] = rip
                n += 1
            steps += 1
            if ptrace(PTRACE_SINGLESTEP, pid, None, None) != 0:
                raise TraceError(f"PTRACE_SINGLESTEP failed: {os.strerror(ctypes.get_errno())}")
            _, st = os.waitpid(pid, 0)
            if on_exit and st & 0xFFFFFF == exit_event:  # about to exit: its memory is still there
                on_exit(pid)
                ptrace(PTRACE_CONT, pid, None, None)
                _, st = os.waitpid(pid, 0)
            if os.WIFEXITED(st) or os.WIFSIGNALED(st):
                break
            if os.WIFSTOPPED(st) and os.WSTOPSIG(st) != signal.SIGTRAP:
                raise TraceError(f"{path}: stopped by signal {os.WSTOPSIG(st)} at {rip:#x}")
    except BaseException:
        _kill(pid)
        raise
    if on_progress is not None:
        on_progress(rips, n, seen, pid)
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -os.WTERMSIG(st) if os.WIFSIGNALED(st) else -signal.SIGKILL
    return Trace(rips[:n].copy(), seen, code, pid, stopped, steps)


_MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


def _repeats(code: bytes, cache: dict[int, bool], rip: int) -> bool:
    """Whether the instruction is a rep/repe/repne-prefixed one (it may execute many times in place)."""
    if rip not in cache:
        insn = next(_MD.disasm_lite(code, rip, 1), None)
        cache[rip] = insn is not None and insn[2].startswith("rep")
    return cache[rip]


def _peek(libc: ctypes.CDLL, pid: int, addr: int, size: int) -> bytes:
    out = bytearray()
    for off in range(0, size, 8):
        ctypes.set_errno(0)
        word = libc.ptrace(PTRACE_PEEKTEXT, pid, ctypes.c_void_p(addr + off), None)
        if word == -1 and ctypes.get_errno():
            break
        out += (word & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
    return bytes(out)


@dataclass
class Branches:
    """The taken branches of a trace: at step[i] the instruction at from_[i] branched to to[i]."""

    step: np.ndarray  # int64 index into Trace.rips of the branch instruction
    from_: np.ndarray
    to: np.ndarray
    kind: np.ndarray  # KIND_* of the branch instruction


def branches(t: Trace, start: int = 0, decoded: dict[int, tuple[int, int]] | None = None) -> Branches:
    """The taken branches at steps `start` and after.  A growing trace is taken in piece by piece: `decoded` (RIP ->
    (size, kind)) is kept between the calls, and only the RIPs of the piece are read from `t.insn_bytes`."""
    decoded = {} if decoded is None else decoded
    rips = t.rips[start:]
    distinct, inverse = np.unique(rips[:-1], return_inverse=True)
    for rip in distinct.tolist():
        if rip not in decoded:
            insn = next(_MD.disasm_lite(t.insn_bytes[rip], rip, 1), None)
            if insn is None:
                raise TraceError(f"cannot decode the instruction at {rip:#x}")
            decoded[rip] = (insn[1], classify(insn[2]))
    size_of = np.array([decoded[r][0] for r in distinct.tolist()], dtype=np.uint64)
    kind_of = np.array([decoded[r][1] for r in distinct.tolist()], dtype=np.int8)
    taken = np.nonzero(rips[1:] != rips[:-1] + size_of[inverse])[0]
    kinds = kind_of[inverse[taken]]
    bad = kinds == KIND_OTHER
    if bad.any():
        i = int(taken[np.argmax(bad)])
        raise TraceError(f"non-branch instruction at {int(rips[i]):#x} changed the flow")
    return Branches((taken + start).astype(np.int64), rips[taken].copy(), rips[taken + 1].copy(), kinds)


def keep_mask(kinds: np.ndarray, flt: BranchFilter) -> np.ndarray:
    """Which branches an LBR with this (user-mode) filter records."""
    if flt & BranchFilter.ANY:
        return (kinds == KIND_CALL) | (kinds == KIND_RET) | (kinds == KIND_JMP) | (kinds == KIND_JCC)
    m = np.zeros(kinds.shape, dtype=bool)
    if flt & BranchFilter.CALL:
        m |= kinds == KIND_CALL
    if flt & BranchFilter.RETURN:
        m |= kinds == KIND_RET
    return m & (kinds != KIND_FAR)


def cost_model(rips: np.ndarray) -> np.ndarray:
    """Synthetic cycles per retired instruction (1..6, a function of the address), so that CPI
    differs between code regions and the CPI x IC estimate differs from the per-block truth."""
    h = (rips * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(59)
    return (1 + (h % np.uint64(6))).astype(np.int64)


@dataclass(frozen=True)
class TruthBlock:
    sample: int
    pos: int  # block number in the sample: entry pos-1 -> entry pos, 1 = oldest
    start: int
    end: int
    instructions: int  # retired between the two recorded branches (the second one included)
    cycles: int  # synthetic cycles of exactly those instructions
    straight: bool  # executed as one straight run: the static range [start, end] is the path


class LbrSimulator:
    """What an LBR of `depth` entries with `flt` would hold at given instants of a trace."""

    def __init__(self, t: Trace, br: Branches, flt: BranchFilter, depth: int = 16,
                 cum_cost: np.ndarray | None = None) -> None:
        self.trace = t
        self.flt = flt
        self.depth = depth
        keep = keep_mask(br.kind, flt)
        self.step = br.step[keep]
        self.from_ = br.from_[keep]
        self.to = br.to[keep]
        self.kind = br.kind[keep]
        self.all_steps = br.step  # every taken branch, for the straight-run test
        # the cost model's cycles before each step (a growing trace's caller keeps them: cum_cost)
        self.cum_cost = np.concatenate([[0], np.cumsum(cost_model(t.rips))]) if cum_cost is None else cum_cost

    def msr_stack(self, at_step: int) -> tuple[list[int], list[int], int]:
        """The raw register stack (LBR0..LBRn-1 from/to, TOS) as the CPU would hold it: a ring
        written in order, wrapped around after `depth` branches, zeros where never written."""
        n = int(np.searchsorted(self.step, at_step))  # branches retired before the sample instant
        frm = [0] * self.depth
        to = [0] * self.depth
        for k in range(max(0, n - self.depth), n):
            frm[k % self.depth] = int(self.from_[k])
            to[k % self.depth] = int(self.to[k])
        return frm, to, (n - 1) % self.depth

    def sample(self, at_step: int, prev_step: int, fields: Fields = Fields.FROM | Fields.TO,
               timed: bool = True, index: int = 0) -> tuple[LbrSample, list[TruthBlock]]:
        """The sample taken before the instruction at trace step `at_step` retires (the previous
        sample was at `prev_step`), and the blocks the analysis must find in it."""
        n = int(np.searchsorted(self.step, at_step))
        lo = max(0, n - self.depth)
        steps = self.step[lo:n]
        frm = self.from_[lo:n].copy()
        to = self.to[lo:n].copy()
        lbr_cyc = None
        if timed:
            prev = np.concatenate([[self.step[lo - 1] if lo > 0 else -1], steps[:-1]])
            cyc = self.cum_cost[steps + 1] - self.cum_cost[prev + 1]
            lbr_cyc = np.minimum(cyc, LBR_CYCLES_SATURATED).astype(np.uint32)
        truth = []
        for j in range(1, len(steps)):
            a, b = int(steps[j - 1]), int(steps[j])
            k0 = int(np.searchsorted(self.all_steps, a, side="right"))
            straight = k0 >= len(self.all_steps) or int(self.all_steps[k0]) >= b
            truth.append(TruthBlock(index, j, int(to[j - 1]), int(frm[j]), b - a,
                                    int(self.cum_cost[b + 1] - self.cum_cost[a + 1]), straight))
        s = LbrSample(
            from_=frm if fields & Fields.FROM else np.zeros_like(frm),
            to=to if fields & Fields.TO else np.zeros_like(to),
            lbr_cycles=lbr_cyc, cycles=int(self.cum_cost[at_step] - self.cum_cost[prev_step]),
            instructions=at_step - prev_step, ip=int(self.trace.rips[at_step]), time_ns=at_step, cpu=0,
            pid=1, tid=1, comm="lbr_workload", branch_filter=self.flt, fields=fields | (Fields.INFO if timed else 0))
        return s, truth

    def samples(self, points: list[int], fields: Fields = Fields.FROM | Fields.TO,
                timed: bool = True) -> tuple[list[LbrSample], list[TruthBlock]]:
        out: list[LbrSample] = []
        truth: list[TruthBlock] = []
        prev = 0
        for i, p in enumerate(points):
            s, t = self.sample(p, prev, fields, timed, i)
            out.append(s)
            truth.extend(t)
            prev = p
        return out, truth
