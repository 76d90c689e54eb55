"""Live LBR collection on hosts with a PMU: bpf/lbr.bpf.c on one perf-event group per CPU.

Per CPU the group is: cycles (leader, sampling every `period` cycles, with a branch
stack for the pattern's filter) + instructions (member, counting).  The member's fd goes
into the PERF_EVENT_ARRAY `lbr_instructions` at index cpu, the BPF program is attached
to the leader with PERF_EVENT_IOC_SET_BPF, and the group is enabled as a whole.

NOT TESTED LIVE: the development and CI machines have no PMU; there `start()` raises
:class:`LbrUnsupported` with the capability message (tests/test_lbr_bpf.py checks that,
and that the BPF C compiles and passes the verifier for every pattern).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
from dataclasses import dataclass

import numpy as np

from vmprof_tui.collect import perf_event as pe
from vmprof_tui.collect.bpf import BPF_DIR
from vmprof_tui.collect.session import BranchCollectorError
from vmprof_tui.lbr import capability
from vmprof_tui.lbr.patterns import DEFAULT_PATTERN, Pattern, get
from vmprof_tui.lbr.records import decode, record_dtype
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE

BPF_SOURCE = BPF_DIR / "lbr.bpf.c"
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408
PERF_IOC_FLAG_GROUP = 1


class LbrUnsupported(BranchCollectorError):
    """This host cannot collect LBR samples; the message says why and what to do instead."""


@dataclass
class LbrConfig:
    pattern: Pattern
    period: int = 1_000_003  # cycles between samples (the paper: 1 ms)
    kernel: bool = False  # also kernel-mode branches and counts
    info: bool = True  # keep the flags word (timed LBR cycles, mispredicts)
    pid: int = 0  # keep only this process (tgid), 0 = all
    cpus: list[int] | None = None
    ring_pages: int = 256
    depth: int = 0  # LBR entries; 0 = from the capability probe
    # Plumbing test without a PMU: software cpu-clock events stand in for cycles (leader) and
    # instructions (member), no branch stack is requested (records come with nr = 0 and
    # lbr_bytes = -ENOENT), "CPI" is then ~1 (both count the same nanoseconds).
    standin: bool = False

    @classmethod
    def named(cls, pattern: str = DEFAULT_PATTERN, **kw: object) -> LbrConfig:
        return cls(get(pattern), **kw)  # type: ignore[arg-type]

    @property
    def effective(self) -> Pattern:
        return self.pattern.with_options(kernel=self.kernel, info=self.info)


def cflags(nr: int, pattern: Pattern, ring_pages: int = 256, max_cpus: int = 1024) -> list[str]:
    return [f"-I{BPF_DIR}", f"-DLBR_NR={nr}", f"-DLBR_FIELDS={int(pattern.fields)}",
            f"-DLBR_FILTER={int(pattern.branch_filter)}", f"-DLBR_RING_PAGES={ring_pages}",
            f"-DLBR_MAX_CPUS={max_cpus}"]


def compile_bpf(nr: int, pattern: Pattern, ring_pages: int = 8, load: bool = True) -> object:
    """Compile bpf/lbr.bpf.c with bcc (and load the program through the verifier)."""
    import bcc  # Debian's python3-bpfcc; imported here so that the analysis does not need it

    b = bcc.BPF(text=BPF_SOURCE.read_text(), cflags=cflags(nr, pattern, ring_pages, os.cpu_count() or 1))
    if load:
        b.load_func("lbr_on_sample", bcc.BPF.PERF_EVENT)
    return b


class LbrCollector:
    """A collect.session.BranchCollector on a host with a PMU and LBR."""

    def __init__(self, config: LbrConfig) -> None:
        self.config = config
        self.caps: capability.Capability | None = None
        self._bpf: object | None = None
        self._fds: list[int] = []
        self._leaders: list[int] = []
        self._chunks: list[bytes] = []
        self.nr = 0

    @property
    def fields(self) -> int:
        return int(self.config.effective.fields)

    def check(self) -> None:
        """The capability probe, before the session loads anything (the software stand-in needs no PMU)."""
        if not self.config.standin:
            caps = capability.detect(self.config.effective.branch_filter)
            if not caps.ok:
                raise LbrUnsupported(caps.message)

    def meta(self) -> dict:
        return {"pattern": self.config.pattern.name, "standin": self.config.standin}

    def host_samples(self) -> np.ndarray:
        """None of its own: the BPF sampler sees the code the PMU samples."""
        return np.empty(0, SAMPLE_DTYPE)

    def start(self) -> None:
        pat = self.config.effective
        standin = self.config.standin
        if standin:
            self.nr = self.config.depth or 16
        else:
            self.caps = capability.detect(pat.branch_filter)
            if not self.caps.ok:
                raise LbrUnsupported(self.caps.message)
            self.nr = self.config.depth or self.caps.lbr_depth or 16
        import bcc

        b = self._bpf = compile_bpf(self.nr, pat, self.config.ring_pages, load=False)
        fn = b.load_func("lbr_on_sample", bcc.BPF.PERF_EVENT)
        if self.config.pid:
            target = b["lbr_target"]
            target[target.Key(0)] = target.Leaf(self.config.pid)
        size = record_dtype(self.nr, pat.fields).itemsize

        def on_record(_ctx: object, data: int, n: int) -> None:
            self._chunks.append(ctypes.string_at(data, min(n, size)))

        b["lbr_events"].open_ring_buffer(on_record)
        user_only = not self.config.kernel and not standin
        kind = pe.PERF_TYPE_SOFTWARE if standin else pe.PERF_TYPE_HARDWARE
        cyc = pe.PERF_COUNT_SW_CPU_CLOCK if standin else pe.PERF_COUNT_HW_CPU_CYCLES
        ins = pe.PERF_COUNT_SW_CPU_CLOCK if standin else pe.PERF_COUNT_HW_INSTRUCTIONS
        counters = b["lbr_instructions"]
        try:
            for cpu in self.config.cpus or sorted(os.sched_getaffinity(0)):
                leader = pe.perf_event_open(pe.make_attr(
                    cyc, sample_period=self.config.period, flt=None if standin else pat.branch_filter,
                    user_only=user_only, type_=kind), -1, cpu)
                self._fds.append(leader)
                member = pe.perf_event_open(pe.make_attr(
                    ins, user_only=user_only, disabled=False, type_=kind), -1, cpu, leader)
                self._fds.append(member)
                counters[counters.Key(cpu)] = counters.Leaf(member)
                fcntl.ioctl(leader, PERF_EVENT_IOC_SET_BPF, fn.fd)
                self._leaders.append(leader)
            for leader in self._leaders:
                fcntl.ioctl(leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
        except OSError as e:
            self.stop()
            raise LbrUnsupported(f"opening the LBR perf events failed: {e.strerror or e}") from e

    def poll(self, timeout_ms: int = 0) -> np.ndarray:
        """Drain the ring buffer; returns the raw records received so far (and forgets them)."""
        if self._bpf is not None:
            self._bpf.ring_buffer_poll(timeout_ms)  # type: ignore[attr-defined]
        pat = self.config.effective
        buf = b"".join(self._chunks)
        self._chunks.clear()
        return decode(buf, self.nr, pat.fields) if buf else np.zeros(0, record_dtype(self.nr or 16, pat.fields))

    def stats(self) -> dict[str, int]:
        if self._bpf is None:
            return {}
        vals = self._bpf["lbr_stats"]  # type: ignore[index]
        names = ["samples", "dropped", "lbr_errors", "counter_errors"]
        return {n: int(sum(vals[vals.Key(i)])) for i, n in enumerate(names)}

    def disable(self) -> None:
        """Stop sampling but keep what was collected readable: stats() are final after this."""
        for leader in self._leaders:
            with contextlib.suppress(OSError):
                fcntl.ioctl(leader, PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP)

    def stop(self) -> None:
        self.disable()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._leaders.clear()
        if self._bpf is not None:
            self._bpf.cleanup()  # type: ignore[attr-defined]
            self._bpf = None
