"""Analysis on the one host time axis: profiles, blank time, steal attribution.

record → resolve → **analyse**: every sample is resolved once (resolve/resolver.py),
then

* the host level counts real samples: host kernel, host processes, and one
  row per VM for the samples that interrupted its guests;
* the guest level of a VM builds, per vCPU, the "virtual guest sampling data"
  of thesis §2.3.5/§3.4: the real samples of its vCPU threads plus, for every
  interval the vCPU was not on a CPU (from the sched events), virtual samples
  at the sampling frequency, classified as idle (the vCPU was halted),
  steal by another vCPU of the same VM (``on vcpuN``), steal by anything
  else (``outside``), or steal while the VMM blocked on the vCPU's behalf.
  Samples of a vCPU thread outside guest mode are steal of type 2 (the VMM
  or KVM worked for the vCPU), broken down by exit-reason category.
* Steal between two guest samples of the same process and function is
  attributed to it (thesis §3.4.2): corrected time = apparent − attributed.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.blanks import NO_TIME, Blank, BlankTable
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import (
    GuestParts,
    GuestSummary,
    HostParts,
    HostSummary,
    Row,
    RowCounts,
    SpanSummary,
    guest_summary,
)
from vmprof_tui.analyse.timeline import Cause, steal_split
from vmprof_tui.collect import backends
from vmprof_tui.record.recording import Recording
from vmprof_tui.record.records import (
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HALTED,
    SAMPLE_HOST_KERNEL,
    SAMPLE_VCPU,
    SCHED_HALT_END,
    SCHED_NOT_SWITCH,
    SCHED_PREV_HALTED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_THROTTLED,
    SCHED_THROTTLE_END,
    SCHED_WAKEUP,
)
from vmprof_tui.resolve.prepare import Prepared, prepare
from vmprof_tui.resolve.resolver import UNKNOWN, Resolved, Resolver

MIN_SAMPLES_FOR_RATE = 200  # fewer samples of a vCPU thread measure its sampling rate no better than the period
HALT_NS_UNKNOWN = 0xFFFFFFFF  # SCHED_HALT_END, SCHED_THROTTLE_END: a time too long for the record's 32 bits


def overlap(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each [a, b) the intervals [lo, hi) cover (sorted, not overlapping each other).

    The time they cover before t is a step function F(t) (cumulative durations); the overlap with [a, b)
    is F(b) - F(a), for all of them at once."""
    if not len(lo):
        return np.zeros(len(a), np.int64)
    cum = np.concatenate([[0], np.cumsum(hi - lo)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(lo, t, side="right") - 1  # last interval started by t
        k = i.clip(0)
        return np.where(i >= 0, cum[k] + np.minimum(t, hi[k]) - lo[k], 0)

    return covered_before(b) - covered_before(a)


def _inside(times: np.ndarray, intervals: np.ndarray) -> np.ndarray:
    """Which times fall in one of the [start, end) intervals (disjoint, in time order)."""
    if not len(intervals):
        return np.zeros(len(times), bool)
    t = times.astype(np.int64)
    k = np.searchsorted(intervals[:, 0], t, side="right") - 1
    return (k >= 0) & (t < intervals[k.clip(0), 1])


def irq_between(a: int, b: int) -> int:
    """IRQ time of one CPU between two of its events (cpu_irq_ns runs modulo 2^32)."""
    return (b - a) & 0xFFFFFFFF


def in_kernel(samples: np.ndarray) -> np.ndarray:
    """The samples taken in kernel mode: the guest's kernel for guest samples, the host's for the others."""
    return kernel_mode(samples["flags"])


def kernel_mode(flags: np.ndarray) -> np.ndarray:
    """in_kernel of the samples' flags."""
    return np.where((flags & SAMPLE_GUEST) != 0, (flags & SAMPLE_GUEST_KERNEL) != 0, (flags & SAMPLE_HOST_KERNEL) != 0)


def task_name(comm: bytes) -> str:
    """A task's comm from a sched record.  The BPF program copies the comm with bpf_probe_read_kernel_str into a
    ring-buffer slot that is not cleared, so after the string's NUL the slot keeps bytes of an older record
    ("ksoftirqd/1\\0-91" after "memfd:sealed-91"), and numpy's S16 strips only trailing NULs: cut at the first."""
    return comm.split(b"\0", 1)[0].decode(errors="replace")


@dataclass
class _GuestShares:
    """What a guest profile's shares are made of: its guest-mode samples (a mask) and its parts."""
    real_guest: np.ndarray
    parts: GuestParts


@dataclass
class _HostShares:
    """What the host profile's shares are made of: the samples selected (a CPU or all), host and VM masks."""
    selected: np.ndarray
    host: np.ndarray
    guest: np.ndarray
    idle_virtual: float
    parts: HostParts


@dataclass
class Profile:
    level: str  # host | guest
    vm: str | None
    vcpu: int | None
    total_samples: float
    duration_s: float
    lost_samples: int
    ratios: dict[str, float]
    rows: list[Row]
    unresolved_samples: int = 0
    notes: list[str] = field(default_factory=list)
    virtual_samples: float | None = None  # of total_samples, made from the scheduler events (idle, steal)

    def __post_init__(self) -> None:
        if self.virtual_samples is None:
            # most rows are functions: an identity test first (is_virtual hashes an Enum, a Python call)
            self.virtual_samples = sum(r.samples for r in self.rows
                                       if r.kind is not RowKind.FUNCTION and r.kind.is_virtual)

    @property
    def shown_rows(self) -> list[Row]:
        """The rows users see: one that rounds to 0 samples (a few virtual samples of steal) is noise on a screen
        or in a table; `rows` keeps them for whoever adds rows up (the fleet store, pprof's totals)."""
        return [r for r in self.rows if r.samples >= 0.5]

    def to_json(self) -> dict:
        total = self.total_samples
        unresolved = self.unresolved_samples / total if total else 0.0
        return {"level": self.level, "vm": self.vm, "vcpu": self.vcpu, "total_samples": int(round(total)),
                "duration_s": round(self.duration_s, 6), "lost_samples": self.lost_samples,
                "unresolved_samples": self.unresolved_samples,
                "unresolved_ratio": round(unresolved, 5), "unresolved_percent": round(100.0 * unresolved, 3),
                "ratios": {k: round(v, 3) for k, v in self.ratios.items()},
                "rows": [r.to_json(total) for r in self.shown_rows], "notes": self.notes}


def _first_inside(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per interval [start, end] (in time order), the first of the sorted `times` inside it, or NO_TIME."""
    if not len(times):
        return np.full(len(starts), NO_TIME, np.int64)
    k = np.searchsorted(times, starts)
    t = times[k.clip(0, len(times) - 1)]
    return np.where((k < len(times)) & (t <= ends), t, NO_TIME)


@dataclass
class VcpuTimeline:
    vm: str
    pid: int
    tid: int
    vcpu: int
    start_ns: int
    end_ns: int
    on_cpu_ns: int = 0
    irq_running_ns: int = 0  # IRQ time on its pCPU while it ran (inside its on-CPU time)
    skew_ns: int = 0  # co-stop: time it could not run (any blank but a halt) while a sibling vCPU ran
    halt_poll_ns: int = 0  # KVM polled its halts this long before blocking (or instead of blocking)
    halt_polls_ok: int = 0  # halts that polling ended: the wake-up came while KVM polled
    halts: int = 0  # halts KVM reported ending (kvm_vcpu_wakeup)
    # [start, end) of each stretch KVM polled (None without kvm_vcpu_wakeup records: then every sample of KVM
    # with the vCPU halted counts as polling)
    poll_intervals: np.ndarray | None = None
    table: BlankTable | None = field(default=None, repr=False, compare=False)  # the analysis' blanks
    rows: tuple[int, int] = (0, 0)  # its blanks: these rows of `table`
    _blanks: list[Blank] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def blanks(self) -> list[Blank]:
        """Its blanks as objects, in time order (made when first asked for: the shares read the table)."""
        if self._blanks is None:
            self._blanks = self.table.blanks(*self.rows) if self.table is not None else []
        return self._blanks


@dataclass
class Attribution:
    process: str
    function: str  # "" when attributed per process
    module: str
    vcpu: int
    samples: int  # real guest samples
    run_ns: float  # its share of the vCPU's exact on-CPU time (sched events), split by samples
    steal_ns: float  # steal that sat between two of its samples
    steal_type1_ns: float  # the part of it the host reports to guests (run-queue wait)

    @property
    def apparent_ns(self) -> float:
        return self.run_ns + self.steal_ns




class Analysis:
    """Everything derived from one recording (and the guest bundles that name its guests)."""

    def __init__(self, prepared: Prepared, shares_only: bool = False) -> None:
        """prepared: the recording's samples made ready by the resolve stage (resolve/prepare.py).
        shares_only: the timelines carry what the shares need and no more (the live screen's chunk summaries):
        no holder of each blank, no co-stop."""
        self.shares_only = shares_only
        rec = self.rec = prepared.rec
        self.frequency = int(rec.meta.get("frequency", 1000))
        self.period_ns = 1e9 / self.frequency
        self.backend = rec.meta.get("backend", backends.NONE)
        self.samples, self.sched, self.wake_events = prepared.samples, prepared.sched, prepared.wake_events
        self.range_ns: tuple[int, int] | None = prepared.range_ns
        self._window = prepared.window
        self._profiles: dict[tuple, Profile] = {}
        self._shares: dict[tuple[str, int | None], _GuestShares] = {}
        self._host_share_cache: dict[int | None, _HostShares] = {}
        self._summaries: dict[tuple, HostSummary | GuestSummary] = {}
        self._splits: dict[bool, dict[int, dict[Cause, float]]] = {}  # blank_split: in ns? -> vCPU thread -> ...
        self._polling: dict[int, np.ndarray] = {}  # vCPU thread (pid << 32 | tid) -> its polling samples
        self._holders: dict[tuple[int, bytes], str] = {}  # (next pid, next comm) of a switch -> holder name
        self.notes: list[str] = prepared.notes
        self.vm_by_pid = prepared.vms.by_pid
        self.vm_index = prepared.vms.index
        self.vcpu_of_tid = prepared.vms.vcpu_of_tid  # tid -> (vmm pid, vcpu id)
        self.is_guest = prepared.is_guest  # the samples that interrupted a guest
        self.resolver = prepared.resolver
        self._names(prepared.names)

    @functools.cached_property
    def timelines(self) -> dict[int, VcpuTimeline]:
        """Per vCPU thread id: its timeline (built when first asked for: the host level needs none)."""
        return self._build_timelines()

    # -- names ----------------------------------------------------------------------------
    def _names(self, g: Resolved) -> None:
        """The per-sample names as the analysis groups them: VM codes, and (unless only shares are asked for) the
        dense keys of profile rows."""
        s = self.samples
        vmm_pids = np.array(sorted(self.vm_by_pid), np.int64)
        at = np.searchsorted(vmm_pids, s["pid"]).clip(0, max(len(vmm_pids) - 1, 0))
        is_vmm = vmm_pids[at] == s["pid"] if len(vmm_pids) else np.zeros(len(s), bool)
        names = [self.vm_by_pid[p] for p in vmm_pids.tolist()]
        self.vm_code = np.where(is_vmm, np.array([self.vm_index[n] for n in names] + [0], np.int32)[at], 0)
        self.vm_name_of_code = np.full(max(self.vm_index.values(), default=0) + 1, "", object)  # 0: no VM
        for name, code in self.vm_index.items():
            self.vm_name_of_code[code] = name
        guest = self.is_guest
        self.func, self.module, self.process, self.proc_pid = g.func, g.module, g.process, g.proc_pid
        self.unresolved = self.func == UNKNOWN
        # What a VM's host-level row counts: the time its vCPU threads held a CPU (guest code, and KVM and
        # the VMM working on the vCPU's behalf).  Other VMM threads are ordinary host rows.
        self.in_vm = guest | arrays.member(s["pid"].astype(np.int64) << 32 | s["tid"], self._thread_keys())
        # a live chunk's summary groups its samples by name code and needs no keys (made if something asks)
        self._codes = g
        if not self.shares_only:
            self._encode_keys()

    @property
    def key(self) -> np.ndarray:
        self._encode_keys()
        return self._key

    @property
    def proc_key(self) -> np.ndarray:
        self._encode_keys()
        return self._proc_key

    def _encode_keys(self) -> None:
        """One integer per sample for its (vm, process, pid) and for its (vm, process, pid, function, module):
        grouping without Python loops (made once: the name codes are then let go)."""
        if self._codes is None:
            return
        g, self._codes = self._codes, None  # their memory is freed: int64 per sample each
        def dense(code: np.ndarray) -> np.ndarray:
            """Rank of each key among the distinct keys (np.unique's inverse; by a table where keys are few)."""
            key = self.vm_code.astype(np.int64) * (int(code.max()) + 1 if len(code) else 1) + code
            ranks = arrays.dense_ranks(key)
            return ranks if ranks is not None else arrays.unique(key, return_inverse=True)[1].astype(np.int32)
        # int32: these and the other per-sample arrays are most of a large report's memory
        self._proc_key = dense(g.proc_code)
        self._key = dense(g.name_code)
        self.key_count = int(self._key.max()) + 1 if len(self._key) else 0
        self.name_code_of_key = np.zeros(self.key_count, np.int64)  # the resolver's code of each key's name
        self.name_code_of_key[self._key] = g.name_code

    # -- timelines -------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        if self.range_ns is not None:
            return (self.range_ns[1] - self.range_ns[0]) / 1e9
        return self.rec.duration_s

    def window(self) -> tuple[int, int]:
        if self.range_ns is not None:
            return self.range_ns
        return self._window

    def _thread_keys(self) -> np.ndarray:
        """pid << 32 | tid of every vCPU thread."""
        return np.fromiter((pid << 32 | tid for tid, (pid, _v) in self.vcpu_of_tid.items()), np.int64,
                           len(self.vcpu_of_tid))

    @functools.cached_property
    def _thread_samples(self) -> dict[int, np.ndarray]:
        """pid << 32 | tid of a vCPU thread -> the indices of its samples (ascending): one sort for all threads,
        8 bytes per sample of a vCPU thread (a mask per thread would be 1 byte per sample per thread)."""
        s = self.samples
        return arrays.positions_by_key(s["pid"].astype(np.int64) << 32 | s["tid"], self._thread_keys())

    @functools.cached_property
    def _switches_on_cpu(self) -> dict[int, np.ndarray]:
        """CPU -> the indices of its context switches in self.sched (in time order): one sort for all CPUs."""
        return dict(arrays.group_by(self.sched["cpu"], np.arange(len(self.sched))))

    def _build_timelines(self) -> dict[int, VcpuTimeline]:
        """Per vCPU thread: on-CPU time and blank intervals from the sched events, for every thread at once (its
        switches, in one table by thread and time)."""
        _w0, w1 = self.window()
        ev = self.sched
        threads = sorted(self.vcpu_of_tid.items())
        count = len(threads)
        keys = np.array([pid << 32 | tid for tid, (pid, _v) in threads], np.int64)
        ev_time = ev["time_ns"].astype(np.int64)
        ev_cpu = ev["cpu"].astype(np.int64)
        ev_irq = ev["cpu_irq_ns"].astype(np.int64)
        # every recorded switch of a thread counts, also those before it was known as a vCPU thread; the pid keeps
        # out an earlier thread that had the same id.  A record: (thread, event, switched in)
        thread, event, is_in = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool)
        if count and len(ev):
            by_key = np.argsort(keys)  # a thread's rank among the sorted keys -> its index
            parts = []
            for side, switched_in in (("prev", False), ("next", True)):
                ends = ev[f"{side}_pid"].astype(np.int64) << 32 | ev[f"{side}_tid"]
                _keys, rank, found = arrays.rank_among(ends, keys)
                at = np.flatnonzero(found)
                parts.append((by_key[rank[at]], at, np.full(len(at), switched_in)))
            thread, event, is_in = (np.concatenate(c) for c in zip(*parts, strict=True))
        # by thread, then in time order (a switch-out before a switch-in at the same time)
        order = np.lexsort((is_in, ev_time[event], thread))
        thread, event, is_in = thread[order], event[order], is_in[order]
        t, cpu = ev_time[event], ev_cpu[event]
        first = np.ones(len(event), bool)
        first[1:] = thread[1:] != thread[:-1]
        last = np.ones(len(event), bool)
        last[:-1] = first[1:]
        # The vCPU's life starts at its first record: a thread first seen leaving a CPU ran since its first sample
        # (which comes within one sampling period of the start of the recording if it was already running then).
        start = np.full(count, np.iinfo(np.int64).max)
        end = np.full(count, np.iinfo(np.int64).min)
        start[thread[first]], end[thread[last]] = t[first], t[last]
        times = self.samples["time_ns"]
        for i, key in enumerate(keys.tolist()):
            own = self._thread_samples.get(key)
            if own is not None:
                start[i], end[i] = min(start[i], int(times[own[0]])), max(end[i], int(times[own[-1]]))
        # before its first switch a thread is on a CPU since its start (as after a switch-in); one first seen
        # leaving a CPU ran there until then, wherever it is switched in later
        first_cpu = np.full(count, -1, np.int64)
        first_cpu[thread[first]] = cpu[first]
        after_in = np.where(first, True, np.roll(is_in, 1))
        since = np.where(first, start[thread], np.roll(t, 1))
        cpu_before = np.where(first, first_cpu[thread], np.roll(cpu, 1))
        closes_run = ~is_in & after_in  # a switch-out after a switch-in ends an on-CPU interval
        closes_blank = is_in & ~after_in  # a switch-in after a switch-out ends a blank (never a thread's first record)
        on_cpu = np.zeros(count, np.int64)
        np.add.at(on_cpu, thread[closes_run], t[closes_run] - since[closes_run])
        # IRQ time on the pCPU while a vCPU ran (its IRQ clock at both ends, when both are on that CPU), for the runs
        # that began with a recorded switch-in
        ran = np.flatnonzero(closes_run & ~first)
        run_in, run_out = event[ran - 1], event[ran]
        irq = np.minimum(irq_between(ev_irq[run_in], ev_irq[run_out]), ev_time[run_out] - ev_time[run_in])
        irq_running = np.zeros(count, np.int64)
        same_cpu = ev_cpu[run_in] == ev_cpu[run_out]
        np.add.at(irq_running, thread[ran][same_cpu], irq[same_cpu])
        # what is open at a thread's last record runs to the end: a blank if it left runnable or halted, else nothing
        # is known after a switch-out; after a switch-in (or with no switch at all) it is on a CPU until its end
        ends = np.flatnonzero(last)
        went = ends[~is_in[ends]]
        tail = went[(ev["flags"][event[went]] & (SCHED_PREV_RUNNABLE | SCHED_PREV_HALTED)) != 0]
        end[thread[tail]] = w1
        on_since = np.where(np.isin(np.arange(count), thread), np.iinfo(np.int64).max, start)
        on_where = np.full(count, -1, np.int64)
        came = ends[is_in[ends]]
        on_since[thread[came]], on_where[thread[came]] = t[came], cpu[came]
        still = np.flatnonzero((on_since <= end) & (start <= end))
        on_cpu[still] += end[still] - on_since[still]
        # each thread's on-CPU intervals: (thread, from, to, CPU)
        intervals = [np.concatenate(p) for p in zip((a[closes_run] for a in (thread, since, t, cpu_before)),
                                                    (still, on_since[still], end[still], on_where[still]), strict=True)]
        # the blanks: from the switch-out before each closing switch-in, and the open ones, by thread and time
        closing = np.flatnonzero(closes_blank)
        by_time = np.argsort(np.concatenate([closing, tail]), kind="stable")
        began = np.concatenate([event[closing - 1], event[tail]])[by_time]
        back_in = np.concatenate([event[closing], np.full(len(tail), -1, np.int64)])[by_time]
        # (an open blank that began after the end of an analysed time range is empty there: _clip drops it)
        table = self._blank_table(np.concatenate([thread[closing], thread[tail]])[by_time], began,
                                  np.concatenate([t[closing], np.maximum(t[tail], w1)])[by_time])
        # IRQ time on its pCPU while a preempted vCPU waited (when it came back on that CPU)
        closed = np.flatnonzero(back_in >= 0)
        out, back = began[closed], back_in[closed]
        irq = np.minimum(irq_between(ev_irq[out], ev_irq[back]), ev_time[back] - ev_time[out])
        table.irq[closed] = np.where((ev_cpu[out] == ev_cpu[back]) & (table.kind[closed] == bt.PREEMPTED), irq, 0)
        alive = np.flatnonzero(start <= end)
        timelines = [VcpuTimeline(self.vm_by_pid.get(pid, f"vm-{pid}"), pid, tid, vcpu, int(start[i]), int(end[i]),
                                  int(on_cpu[i]), int(irq_running[i])) for i, (tid, (pid, vcpu)) in
                     ((i, threads[i]) for i in alive.tolist())]
        self._set_rows(timelines, alive, table)
        self._wakeups(timelines, keys[alive], table)
        if self.range_ns is not None:  # before the holders: those of a cut blank are what held it in the range
            timelines, alive, table = self._clip(timelines, alive, table)
        # from here the table's timeline column is the index among the timelines kept (-1: none)
        index = np.full(count, -1, np.int64)
        index[alive] = np.arange(len(alive))
        table.timeline = index[table.timeline]
        intervals[0] = index[intervals[0]]
        self._set_rows(timelines, np.arange(len(timelines)), table)
        self._split_preemptions(timelines, table, *intervals)
        for tl in timelines:
            tl.table = table
        if not self.shares_only:
            self._host_holders(timelines, table)
            self._skew(timelines, table, *intervals[:3])
        return {tl.tid: tl for tl in timelines}

    @staticmethod
    def _set_rows(timelines: list[VcpuTimeline], index: np.ndarray, table: BlankTable) -> None:
        """Each timeline's rows of the table (`index`: each one's value in the table's timeline column)."""
        at = np.searchsorted(table.timeline, index).tolist()
        upto = np.searchsorted(table.timeline, index, side="right").tolist()
        for tl, a, z in zip(timelines, at, upto, strict=True):
            tl.rows = a, z

    def _blank_table(self, timeline: np.ndarray, events: np.ndarray, ends: np.ndarray) -> BlankTable:
        """The blanks that began with the sched events at indices `events` and end at `ends`."""
        e = self.sched[events]
        flags = e["flags"]
        kind = np.full(len(e), bt.BLOCKED, np.int8)
        kind[(flags & SCHED_PREV_RUNNABLE) != 0] = bt.PREEMPTED
        kind[(flags & SCHED_PREV_THROTTLED) != 0] = bt.THROTTLED
        kind[(flags & SCHED_PREV_HALTED) != 0] = bt.IDLE
        known = self._holders  # looked up here first: a call per blank costs more than the lookup
        holders = np.full(len(e), "", object)
        if not self.shares_only:
            holders[:] = [known.get(k) or self._holder(*k)
                          for k in zip(e["next_pid"].tolist(), e["next_comm"].tolist(), strict=True)]
        none = np.full(len(e), NO_TIME, np.int64)
        held = np.empty(0, np.int64)
        return BlankTable(timeline, e["time_ns"].astype(np.int64), ends, kind, e["prev_exit_reason"].astype(np.int64),
                          e["cpu"].astype(np.int64), holders, none, np.zeros(len(e), np.int64), none.copy(),
                          none.copy(), held, np.empty(0, bool), held, np.empty(0, object), held)

    def _split_preemptions(self, timelines: list[VcpuTimeline], table: BlankTable, iv_tl: np.ndarray,
                           iv_lo: np.ndarray, iv_hi: np.ndarray, iv_cpu: np.ndarray) -> None:
        """Which vCPUs held the pCPU while each vCPU waited, and how long: overlap with the on-CPU intervals of every
        other vCPU on the same CPU (intervals of timelines `iv_tl`, -1 for one not kept).

        On one CPU, vCPU threads take turns: their intervals there, in time order, do not overlap, and the
        intervals a wait overlaps are a run of them, found with two binary searches.  Where the records say two
        threads ran at once (lost events), each thread's own intervals (which never overlap) are searched apart."""
        waits = np.flatnonzero(table.kind == bt.PREEMPTED)
        w_cpu = table.cpu[waits]
        mine = iv_tl >= 0
        iv_tl, iv_lo, iv_hi, iv_cpu = iv_tl[mine], iv_lo[mine], iv_hi[mine], iv_cpu[mine]
        on = dict(arrays.group_by(iv_cpu, np.arange(len(iv_cpu)))) if len(iv_cpu) else {}
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (wait's row, holder's timeline, ns)

        def overlaps(rows: np.ndarray, ivs: np.ndarray) -> None:
            """The overlaps of the waits `rows` with the intervals `ivs` (in time order, not overlapping)."""
            a, b = table.start[rows], table.end[rows]
            lo, hi = iv_lo[ivs], iv_hi[ivs]
            first = np.searchsorted(hi, a, side="right")
            many = (np.searchsorted(lo, b, side="left") - first).clip(0)
            w = np.repeat(np.arange(len(rows)), many)
            k = first[w] + np.arange(len(w)) - np.repeat(np.cumsum(many) - many, many)
            ns = np.minimum(b[w], hi[k]) - np.maximum(a[w], lo[k])
            holder = iv_tl[ivs][k]
            ok = (ns > 0) & (holder != table.timeline[rows][w])
            found.append((rows[w][ok], holder[ok], ns[ok]))

        for c, at in arrays.group_by(w_cpu, np.arange(len(waits))) if len(waits) else ():
            ivs = on.get(c)
            if ivs is None:
                continue
            ivs = ivs[np.argsort(iv_lo[ivs], kind="stable")]
            if np.all(iv_lo[ivs][1:] >= iv_hi[ivs][:-1]):
                overlaps(waits[at], ivs)
            else:
                for _tl, own in arrays.group_by(iv_tl, ivs):
                    overlaps(waits[at], own)
        if not found:
            return
        row, holder, ns = (np.concatenate(c) for c in zip(*found, strict=True))
        order = np.lexsort((holder, row))  # by blank, then in the order of the timelines
        row, holder, ns = row[order], holder[order], ns[order]
        new = np.ones(len(row), bool)
        new[1:] = (row[1:] != row[:-1]) | (holder[1:] != holder[:-1])
        at = np.flatnonzero(new)
        row, holder, ns = row[at], holder[at], np.add.reduceat(ns, at)
        pid = np.array([tl.pid for tl in timelines], np.int64)
        table.held_blank, table.held_same_vm, table.held_ns = row, pid[holder] == pid[table.timeline[row]], ns
        table.held_vcpu = np.array([tl.vcpu for tl in timelines], np.int64)[holder]
        table.held_vm = np.array([tl.vm for tl in timelines], object)[holder]

    def _host_holders(self, timelines: list[VcpuTimeline], table: BlankTable) -> None:
        """The tasks that are no vCPU and held the pCPU while a vCPU waited: the sched events name the task
        each switch on that CPU gives it to, and host-to-host switches are not recorded, so a task holds
        it until the next recorded switch.  (vCPU threads are counted by exact overlap, above.)

        For every CPU at once: the switches and the waits' ends in one order by (CPU, time), where counting the
        switches before each end finds the switches in each wait."""
        waits = np.flatnonzero(table.kind == bt.PREEMPTED)
        ev = self.sched
        if not len(waits) or not len(ev):
            return
        cpu = np.concatenate([ev["cpu"].astype(np.int64), table.cpu[waits], table.cpu[waits]])
        time = np.concatenate([ev["time_ns"].astype(np.int64), table.start[waits], table.end[waits]])
        # at one time: a wait's end before a switch (switches before its end: side="left"), a switch before a
        # wait's start (the switch that began it, or the last before: side="right")
        what = np.repeat(np.array([1, 2, 0], np.int8), [len(ev), len(waits), len(waits)])
        order = np.lexsort((what, time, cpu))
        is_switch = what[order] == 1
        switches_upto = np.cumsum(is_switch)  # switches in the order up to each place
        at = np.empty(len(order), np.int64)
        at[order] = switches_upto
        switch = order[is_switch]  # the switches (indices into ev) by CPU and time
        s_cpu, s_time = cpu[switch], time[switch]
        cpu_first = np.searchsorted(s_cpu, table.cpu[waits])  # where each wait's CPU's switches begin
        first = np.maximum(at[len(ev):len(ev) + len(waits)] - 1, cpu_first)
        last = at[len(ev) + len(waits):]
        held_until = np.append(s_time[1:], np.iinfo(np.int64).max)
        held_until[:-1][s_cpu[1:] != s_cpu[:-1]] = np.iinfo(np.int64).max  # the last switch of a CPU: until the end
        vcpu_threads = np.array([tl.pid << 32 | tl.tid for tl in timelines], np.int64)
        to_host = ~arrays.member(ev["next_pid"][switch].astype(np.int64) << 32 | ev["next_tid"][switch], vcpu_threads)
        many = (last - first).clip(0)
        w = np.repeat(np.arange(len(waits)), many)
        k = first[w] + np.arange(len(w)) - np.repeat(np.cumsum(many) - many, many)
        a, b = table.start[waits][w], table.end[waits][w]
        ns = np.minimum(held_until[k], b) - np.maximum(s_time[k], a)
        ok = to_host[k] & (ns > 0)
        used, name_of = np.unique(switch[k[ok]], return_inverse=True)
        names = np.array([self._holder(pid, comm) for pid, comm in zip(
            ev["next_pid"][used].tolist(), ev["next_comm"][used].tolist(), strict=True)] + [""], object)
        # by blank, then in time order
        table.host_blank, table.host_holder, table.host_ns = waits[w][ok], names[name_of.reshape(-1)], ns[ok]

    def _wakeups(self, timelines: list[VcpuTimeline], keys: np.ndarray, table: BlankTable) -> None:
        """Where each halt's idle time ended (the first wake-up of the thread inside the blank), how long
        KVM polled its halts (kvm_vcpu_wakeup: the halt's length; it blocked or polling ended it), and how
        long each throttled blank was really throttled (the kernel's count, when the thread ran again).
        `keys`: pid << 32 | tid of each timeline's thread."""
        ev = self.wake_events
        of = arrays.positions_by_key(ev["prev_pid"].astype(np.int64) << 32 | ev["prev_tid"], keys)
        for tl, key in zip(timelines, keys.tolist(), strict=True):
            if key not in of:
                continue
            mine = ev[of[key]]
            lo, hi = tl.rows
            kinds, starts, ends = table.kind[lo:hi], table.start[lo:hi], table.end[lo:hi]
            kind = mine["flags"] & SCHED_NOT_SWITCH
            idle = np.flatnonzero(kinds == bt.IDLE)
            wakeups = mine[kind == SCHED_WAKEUP]
            wake_t = wakeups["time_ns"].astype(np.int64)
            table.wakeup[lo + idle] = _first_inside(starts[idle], ends[idle], wake_t)
            # wake-ups into a throttled group, in blanks that began with a sleep (halted, or blocked in the VMM)
            slept = np.flatnonzero((kinds == bt.IDLE) | (kinds == bt.BLOCKED))
            thr_t = wake_t[(wakeups["flags"] & SCHED_PREV_THROTTLED) != 0]
            table.throttled_wakeup[lo + slept] = _first_inside(starts[slept], ends[slept], thr_t)
            # the kernel's throttled time, recorded as the thread took a CPU again: for the blank that ends there
            done = mine[kind == SCHED_THROTTLE_END]
            if len(done) and hi > lo:
                k = np.searchsorted(ends, done["time_ns"].astype(np.int64), side="right") - 1
                ns = done["prev_exit_reason"].astype(np.int64)
                row = lo + k.clip(0)
                ok = (k >= 0) & (ns != HALT_NS_UNKNOWN) & (
                    (table.kind[row] == bt.THROTTLED) | (table.throttled_wakeup[row] != NO_TIME))
                last, at = np.unique(row[ok][::-1], return_index=True)  # the last count of a blank holds
                table.throttled[last] = ns[ok][::-1][at]
            halt_ends = mine[kind == SCHED_HALT_END]
            known = halt_ends["prev_exit_reason"] != HALT_NS_UNKNOWN
            t = halt_ends["time_ns"].astype(np.int64)
            halt_ns = halt_ends["prev_exit_reason"].astype(np.int64)
            ok = (halt_ends["flags"] & SCHED_PREV_RUNNABLE) != 0
            tl.halts = len(halt_ends)
            tl.halt_polls_ok = int(np.count_nonzero(ok))
            poll = np.where(ok, halt_ns, 0)  # a halt that polling ended was polling all along
            if len(idle):  # one that blocked polled from its start until it first left the CPU (a halt can span
                # several blanks: the thread wakes, finds nothing to do and blocks again)
                idle_starts = starts[idle]
                halt_start = t - halt_ns
                k = np.searchsorted(idle_starts, halt_start)
                first = idle_starts[k.clip(0, len(idle_starts) - 1)]
                blocked = ~ok & (k < len(idle_starts)) & (first <= t)
                poll = np.where(blocked, np.clip(first - halt_start, 0, halt_ns), poll)
            tl.halt_poll_ns = int(poll[known].sum())
            begun = (t - halt_ns)[known]
            tl.poll_intervals = np.stack([begun, begun + poll[known]], axis=1)

    def _skew(self, timelines: list[VcpuTimeline], table: BlankTable, iv_tl: np.ndarray, iv_lo: np.ndarray,
              iv_hi: np.ndarray) -> None:
        """Co-stop: how long each vCPU could not run though its guest had work (preempted, throttled, woken
        up, or its thread blocked in the VMM) while at least one sibling vCPU of its VM ran, on any pCPU:
        the union of the siblings' on-CPU intervals.  A vCPU's own intervals and its blanks never overlap, so that
        is its waits' overlap with the union of all its VM's vCPUs' intervals: one union per VM."""
        pid = np.array([tl.pid for tl in timelines], np.int64)
        mine = iv_tl >= 0
        iv_tl, iv_lo, iv_hi = iv_tl[mine], iv_lo[mine], iv_hi[mine]
        on = pid[iv_tl]
        for vm_pid, members in arrays.group_by(pid, np.arange(len(timelines))) if len(timelines) > 1 else ():
            at = np.flatnonzero(on == vm_pid)
            if len(members) < 2 or not len(at):
                continue
            order = np.argsort(iv_lo[at])
            lo, hi = iv_lo[at][order], iv_hi[at][order]
            # merge overlapping intervals: a new run starts where an interval begins after all before ended
            reach = np.maximum.accumulate(hi)
            new = np.ones(len(lo), bool)
            new[1:] = lo[1:] > reach[:-1]
            run_lo = lo[new]
            run_hi = np.append(reach[np.nonzero(new)[0][1:] - 1], reach[-1])
            for i in members.tolist():
                tl = timelines[i]
                a, z = tl.rows
                kinds, wake = table.kind[a:z], table.wakeup[a:z]
                waiting = (kinds != bt.IDLE) | (wake != NO_TIME)
                if waiting.any():
                    start = np.where(kinds == bt.IDLE, wake, table.start[a:z])[waiting]
                    tl.skew_ns = int(overlap(run_lo, run_hi, start, table.end[a:z][waiting]).sum())

    def _clip(self, timelines: list[VcpuTimeline], alive: np.ndarray,
              table: BlankTable) -> tuple[list[VcpuTimeline], np.ndarray, BlankTable]:
        """Restrict the timelines and their blanks (table rows by `alive`, each timeline's index among all threads)
        to the analysed time range: what is left of them."""
        lo, hi = self.range_ns
        kept = []
        for tl in timelines:
            tl.start_ns, tl.end_ns = max(tl.start_ns, lo), min(tl.end_ns, hi)
            kept.append(tl.end_ns > tl.start_ns)
        # blanks are in time order and do not overlap: only a run at either end of a timeline reaches past the range
        cut = np.flatnonzero((table.start < lo) | (table.end > hi))
        full = table.end[cut] - table.start[cut]
        start, end = table.start[cut].clip(lo), table.end[cut].clip(None, hi)
        table.start[cut], table.end[cut] = start, end
        part = (end - start > 0) & (end - start < full)  # IRQ time is known for the whole wait only: its share here
        table.irq[cut[part]] = table.irq[cut[part]] * (end - start)[part] // full[part]
        for column in (table.wakeup, table.throttled_wakeup):
            w = column[cut]
            column[cut] = np.where((w == NO_TIME) | (w >= end), NO_TIME, np.maximum(w, start))
        keep = np.ones(len(table), bool)
        keep[cut] = end > start
        keep &= np.isin(table.timeline, alive[np.array(kept, bool)])
        table = table.take(np.flatnonzero(keep))
        blank_ns = np.zeros(int(alive.max(initial=-1)) + 1, np.int64)
        np.add.at(blank_ns, table.timeline, table.duration)
        timelines = [tl for tl, k in zip(timelines, kept, strict=True) if k]
        alive = alive[np.array(kept, bool)]
        for tl, i in zip(timelines, alive.tolist(), strict=True):
            tl.on_cpu_ns = tl.wall_ns - int(blank_ns[i])
        return timelines, alive, table

    def _holder(self, pid: int, comm: bytes) -> str:
        """Who took the pCPU in a switch (the next task's pid and comm)."""
        holder = self._holders.get((pid, comm))
        if holder is None:
            if pid in self.vm_by_pid:  # a VMM thread that is not a vCPU (those are split out by overlap)
                holder = f"{self.vm_by_pid[pid]} (VMM)"
            elif pid == 0:
                holder = "idle"
            else:
                holder = task_name(comm) or str(pid)
            self._holders[(pid, comm)] = holder
        return holder

    # -- profiles --------------------------------------------------------------------
    def row(self, i: int, samples: float) -> Row:
        """The names of sample i as a Row of `samples`."""
        pid = int(self.proc_pid[i])
        return Row(samples, str(self.func[i]), str(self.module[i]), str(self.process[i]) or None,
                   pid if pid >= 0 else None, self.vm_name_of_code[self.vm_code[i]] or None,
                   RowKind.UNKNOWN if self.unresolved[i] else RowKind.FUNCTION)

    def aggregate(self, sel: np.ndarray) -> list[Row]:
        """One Row per distinct (vm, process, pid, function, module) among the selected samples (as row()
        makes them, from the names of each group's first sample)."""
        idx = np.nonzero(sel)[0]
        keys, first, counts = arrays.first_and_counts(self.key[idx], self.key_count)
        # each row's kernel-mode samples: what a filtered profile's OS:USER split is made of
        in_kernel_mode = idx[kernel_mode(self.samples["flags"][idx])]
        kernel_keys, kernel_counts = arrays.counts_of(self.key[in_kernel_mode], self.key_count)
        kernel = np.zeros(len(keys))
        kernel[np.searchsorted(keys, kernel_keys)] = kernel_counts
        at = idx[first]
        pids = self.proc_pid[at]
        kinds = np.where(self.unresolved[at], 1, 0)
        vms = self.vm_name_of_code[self.vm_code[at]]
        kind_of = (RowKind.FUNCTION, RowKind.UNKNOWN)
        return [Row(c, str(f), str(m), str(p) or None, pid if pid >= 0 else None, vm or None, kind_of[k], kc)
                for c, f, m, p, pid, vm, k, kc in zip(counts.astype(float).tolist(), self.func[at].tolist(),
                                                       self.module[at].tolist(), self.process[at].tolist(),
                                                       pids.tolist(), vms.tolist(), kinds.tolist(),
                                                       kernel.astype(float).tolist(), strict=True)]

    def cpu_idle_ns(self) -> dict[int, int]:
        """Idle time per CPU from switches to and from the idle task (exact, unlike idle samples); none in a
        recording of one process (record -p): its ratios are of that process's own samples."""
        filters = self.rec.meta.get("filters")
        if isinstance(filters, dict) and filters.get("pid") is not None:
            return {}
        ev = self.sched
        idle: dict[int, int] = {}
        w0, w1 = self.window()
        times, next_tid, prev_tid = ev["time_ns"], ev["next_tid"], ev["prev_tid"]
        for cpu, at in self._switches_on_cpu.items():
            t = times[at]
            to_idle = np.nonzero(next_tid[at] == 0)[0]
            from_idle = np.nonzero(prev_tid[at] == 0)[0]
            if not len(to_idle) and not len(from_idle):
                continue
            ends = np.searchsorted(from_idle, to_idle)  # first switch away from idle after each entry
            ok = ends < len(from_idle)
            start = t[to_idle[ok]].astype(np.int64)
            end = t[from_idle[ends[ok]]].astype(np.int64)
            if len(from_idle) and (not len(to_idle) or from_idle[0] < to_idle[0]):
                start, end = np.append(w0, start), np.append(t[from_idle[0]], end)  # idle from the start
            if len(to_idle) and not ok[-1]:
                start, end = np.append(start, t[to_idle[-1]]), np.append(end, w1)  # idle to the end
            if self.range_ns is not None:
                start, end = start.clip(*self.range_ns), end.clip(*self.range_ns)
            idle[int(cpu)] = int((end - start).sum())
        return idle

    def host_profile(self, cpu: int | None = None) -> Profile:
        key = ("host", cpu)
        if key not in self._profiles:  # the live screen asks for the same profile several times a refresh
            self._profiles[key] = self._host_profile(cpu)
        return self._profiles[key]

    def guest_profile(self, vm: str, vcpu: int | None = None) -> Profile:
        key = ("guest", vm, vcpu)
        if key not in self._profiles:
            self._profiles[key] = self._guest_profile(vm, vcpu)
        return self._profiles[key]

    def host_summary(self) -> HostSummary:
        """The host at a glance (the live overview) without its rows: shares and the top process and function."""
        if ("host",) not in self._summaries:  # the overview's title, its host row and the history all ask
            shares = self._host_shares(None)
            rows = self.row_counts(np.flatnonzero(shares.host))
            self._summaries[("host",)] = HostSummary(shares.parts.ratios(), shares.parts.total, self.rec.lost_samples,
                                                     *rows.top(by_name=False))
        return self._summaries[("host",)]

    def _host_shares(self, cpu: int | None) -> _HostShares:
        if cpu not in self._host_share_cache:
            s = self.samples
            sel = np.ones(len(s), bool) if cpu is None else s["cpu"] == cpu
            guest = sel & self.in_vm
            host = sel & ~guest
            idle_ns = self.cpu_idle_ns()
            # idle from the sched events replaces the idle samples of a CPU that switched to or from idle; a CPU
            # with no such switch (idle throughout, or never idle) keeps its idle samples
            host &= ~((s["pid"] == 0) & np.isin(s["cpu"], list(idle_ns)))
            idle_virtual = sum(v for c, v in idle_ns.items() if cpu is None or c == cpu) / self.period_ns
            idle = host & (s["pid"] == 0)
            kernel = np.count_nonzero(host & ~idle & ((s["flags"] & SAMPLE_HOST_KERNEL) != 0))
            user = np.count_nonzero(host & ~idle & ((s["flags"] & SAMPLE_HOST_KERNEL) == 0))
            parts = HostParts(float(kernel), float(user), idle_virtual + np.count_nonzero(idle),
                              float(np.count_nonzero(guest)))
            self._host_share_cache[cpu] = _HostShares(sel, host, guest, idle_virtual, parts)
        return self._host_share_cache[cpu]

    def _host_profile(self, cpu: int | None) -> Profile:
        shares = self._host_shares(cpu)
        rows = self.aggregate(shares.host)
        for row in rows:  # host rows carry no VM, only the VMM process name
            row.vm = None
        rows += self._host_other_rows(shares)
        notes = list(self.notes)
        if cpu is not None:
            notes.append(f"CPU {cpu} only")
        return Profile("host", None, None, shares.parts.total, self.duration_s, self.rec.lost_samples,
                       shares.parts.ratios(), rows,
                       int(np.count_nonzero(shares.selected & self.unresolved)), notes)

    def _host_other_rows(self, shares: _HostShares) -> list[Row]:
        """The host profile's rows that are no function: CPU idle from the sched events, and one per VM."""
        s, guest = self.samples, shares.guest
        rows = []
        if shares.idle_virtual:
            rows.append(Row(shares.idle_virtual, *RowKind.CPU_IDLE.label(), kind=RowKind.CPU_IDLE))
        vmm_comm = {pid: p.get("comm") or None for pid, p in self.rec.processes().items()}
        for pid, n in zip(*(a.tolist() for a in np.unique(s["pid"][guest], return_counts=True)), strict=True):
            name = self.vm_by_pid.get(pid, f"vm-{pid}")
            rows.append(Row(n, *RowKind.VM.label(vm=name, vm_index=self.vm_index.get(name, 0)), vmm_comm.get(pid),
                            pid, name, RowKind.VM))
        return rows

    def row_counts(self, idx: np.ndarray) -> RowCounts:
        """The samples `idx` (indices) by profile row (process, pid, function, module) under the resolver's name
        codes (the same in every analysis that shares the resolver: counts of spans add)."""
        return self.row_counts_of([idx])[0]

    def row_counts_of(self, groups: list[np.ndarray]) -> list[RowCounts]:
        """row_counts of each array of indices, all at once (a span's vCPUs: one grouping, not one per vCPU)."""
        idx = np.concatenate(groups) if len(groups) > 1 else groups[0]
        owner = np.repeat(np.arange(len(groups), dtype=np.int64), [len(g) for g in groups])
        if self._codes is not None:  # no keys made: by (group, VM, name code), one sort (name codes count names)
            vms = int(self.vm_code.max(initial=0)) + 1
            packed = (owner * vms + self.vm_code[idx]) << 32 | self._codes.name_code[idx]
            keys, counts = arrays.unique(packed, return_counts=True)
            owner, codes = (keys >> 32) // vms, keys & 0xFFFFFFFF
        else:  # by the dense keys: counted, not sorted, on a large recording
            size = max(self.key_count, 1)
            keys, counts = arrays.counts_of(owner * size + self.key[idx], size * len(groups))
            owner, codes = keys // size, self.name_code_of_key[keys % size]
        # each group's rows by code (a window's sums merge by code): so already where a group is of one VM
        same = owner[1:] == owner[:-1]
        order = np.lexsort((codes, owner)) if np.any(same & (codes[1:] <= codes[:-1])) else slice(None)
        owner, codes, counts = owner[order], codes[order], counts[order].astype(float)
        bounds = np.searchsorted(owner, np.arange(len(groups) + 1)).tolist()
        names = self.resolver.row_names  # the resolver's names of its codes
        return [RowCounts(codes[a:b], counts[a:b], names) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def thread_samples(self, tl: VcpuTimeline) -> np.ndarray:
        """The indices of the samples of one vCPU thread, ascending (callers do not change them)."""
        return self._thread_samples.get(tl.pid << 32 | tl.tid, np.empty(0, np.int64))

    def sample_ns(self, tl: VcpuTimeline) -> float:
        """The on-CPU time one sample of a vCPU thread stands for: its exact on-CPU time over its samples.

        Blank time is exact (sched events) and on-CPU time is sampled; priced at the nominal period the two
        do not add up, because a thread's cpu-clock samples stray from its on-CPU time (steal3 at 10 kHz:
        one per 100.0-100.9 us) or alias with a guest's timer-driven cycle (a 30 ms halt cycle at 1 kHz:
        +-15%).  Priced at this rate, a guest's run, idle, steal and halt-polling shares are its exact times;
        samples only split the on-CPU time.  Too few samples to measure a rate: the nominal period.
        """
        n = len(self.thread_samples(tl))
        on_cpu = tl.on_cpu_ns
        if (poll_ns := self._exact_poll_ns(tl)) is not None:  # priced exactly too: the rate is of the rest
            n -= len(self.polling_samples(tl))
            on_cpu -= poll_ns
        return on_cpu / n if n >= MIN_SAMPLES_FOR_RATE and on_cpu > 0 else self.period_ns

    def polling_samples(self, tl: VcpuTimeline) -> np.ndarray:
        """The indices of a vCPU thread's samples that caught KVM polling its halted vCPU: KVM with the vCPU
        halted, and inside a stretch KVM polled when the recording has them.  Kept per thread: the rate, the
        polling time and the profile of each vCPU all ask for them."""
        key = tl.pid << 32 | tl.tid
        if key not in self._polling:
            idx = self.thread_samples(tl)
            flags = self.samples["flags"][idx]
            polled = ~self.is_guest[idx] & ((flags & (SAMPLE_VCPU | SAMPLE_HALTED)) == (SAMPLE_VCPU | SAMPLE_HALTED))
            if tl.poll_intervals is not None:
                polled &= _inside(self.samples["time_ns"][idx], tl.poll_intervals)
            self._polling[key] = idx[polled]
        return self._polling[key]

    def poll_ns(self, tl: VcpuTimeline) -> float:
        """How long KVM polled the vCPU's halts within its life here: exact from kvm_vcpu_wakeup records (sampled,
        it aliases with a guest's timer), else its polling samples at the thread's rate."""
        exact = self._exact_poll_ns(tl)
        return float(len(self.polling_samples(tl))) * self.sample_ns(tl) if exact is None else float(exact)

    def _exact_poll_ns(self, tl: VcpuTimeline) -> int | None:
        if tl.poll_intervals is None:
            return None
        clipped = np.clip(tl.poll_intervals, tl.start_ns, tl.end_ns)
        return int((clipped[:, 1] - clipped[:, 0]).sum())

    def thread_mask(self, tl: VcpuTimeline) -> np.ndarray:
        """The samples of one vCPU thread as a mask (made on each call: masks of many threads would take
        a byte per sample each)."""
        mask = np.zeros(len(self.samples), bool)
        mask[self.thread_samples(tl)] = True
        return mask

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        """(vCPU id, thread id) of each vCPU of a VM in the window, by vCPU id."""
        return sorted((tl.vcpu, tl.tid) for tl in self.vm_timelines(vm))

    def span_summary(self) -> SpanSummary:
        """This analysis' span in parts and rows that add across spans (the live screen keeps one per drained
        chunk): the host's and each vCPU's."""
        host = self._host_shares(None)
        timelines = list(self.timelines.values())
        parts = [self.vcpu_parts(tl) for tl in timelines]
        rows = self.row_counts_of([real for real, _parts in parts] + [np.flatnonzero(host.host)])
        vcpus = {(tl.vm, tl.vcpu): (tl.tid, mine, names)
                 for tl, (_real, mine), names in zip(timelines, parts, rows[:-1], strict=True)}
        host_rows = rows[-1]
        return SpanSummary(self.window(), self.vm_names(), host.parts, host_rows, self._host_other_rows(host), vcpus)

    def vm_names(self) -> list[str]:
        return sorted(set(self.vm_by_pid.values()), key=lambda n: self.vm_index.get(n, 0))

    def vm_timelines(self, vm: str, vcpu: int | None = None) -> list[VcpuTimeline]:
        return [tl for tl in self.timelines.values() if tl.vm == vm and (vcpu is None or tl.vcpu == vcpu)]

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]:
        """A guest's OS:USER:IDLE:steal shares without its rows (the live screen's history of every VM)."""
        return self._guest_shares(vm, vcpu).parts.ratios()

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary:
        """What the live overview shows of a VM, without its rows (a VM's guest profile at 64 CPUs has tens of
        thousands): its shares, its steal of each type, and the process and the function (a row of its guest
        profile: process, pid, function, module) with the most resolved samples; ties go to the earlier row."""
        if ("guest", vm, vcpu) not in self._summaries:
            shares = self._guest_shares(vm, vcpu)
            self._summaries[("guest", vm, vcpu)] = guest_summary(shares.parts,
                                                                 self.row_counts(np.flatnonzero(shares.real_guest)))
        return self._summaries[("guest", vm, vcpu)]

    def _guest_shares(self, vm: str, vcpu: int | None) -> _GuestShares:
        if (vm, vcpu) not in self._shares:
            if vm not in self.vm_by_pid.values():
                raise KeyError(vm)
            parts = GuestParts()
            real_guest = np.zeros(len(self.samples), bool)
            for tl in self.vm_timelines(vm, vcpu):
                real, mine = self.vcpu_parts(tl)
                real_guest[real] = True
                parts.add(mine)
            self._shares[(vm, vcpu)] = _GuestShares(real_guest, parts)
        return self._shares[(vm, vcpu)]

    def vcpu_parts(self, tl: VcpuTimeline) -> tuple[np.ndarray, GuestParts]:
        """One vCPU's guest-mode samples (indices) and its parts: its thread's samples outside guest mode are the
        VMM/KVM working for the vCPU (type 2 steal), except KVM polling the halted vCPU (neither guest work nor
        idle); its blanks are virtual samples by cause, at the thread's rate, and so is its halt polling."""
        idx = self.thread_samples(tl)
        real = idx[self.is_guest[idx]]
        kernel = np.count_nonzero(self.samples["flags"][real] & SAMPLE_GUEST_KERNEL)
        unit = self.sample_ns(tl)
        parts = GuestParts(float(kernel), float(len(real) - kernel), self.blank_split(tl),
                           float(len(idx) - len(real) - len(self.polling_samples(tl))), self.poll_ns(tl) / unit)
        return real, parts

    def blank_split(self, tl: VcpuTimeline, in_ns: bool = False) -> dict[Cause, float]:
        """timeline.steal_split of one vCPU's blanks, in virtual samples at its thread's rate (sample_ns) or in ns;
        made for every vCPU at once."""
        if in_ns not in self._splits:
            timelines = list(self.timelines.values())  # in the order of the table's timeline column
            units = np.ones(len(timelines)) if in_ns else np.array([self.sample_ns(t) for t in timelines], float)
            self._splits[in_ns] = dict(zip((t.tid for t in timelines), steal_split(tl.table, units), strict=True))
        return defaultdict(float, self._splits[in_ns][tl.tid])

    def _guest_profile(self, vm: str, vcpu: int | None) -> Profile:
        shares = self._guest_shares(vm, vcpu)
        rows = self.aggregate(shares.real_guest)
        for row in rows:
            row.vm = vm
        for (kind, v), n in shares.parts.virtual().items():
            rows.append(Row(n, *kind.label(vcpu=v), None, None, vm, kind))
        notes = list(self.notes)
        if not len(self.sched):
            notes.append("no scheduler events in this recording: idle and steal are unknown")
        return Profile("guest", vm, vcpu, shares.parts.total, self.duration_s, self.rec.lost_samples,
                       shares.parts.ratios(), rows,
                       int(np.count_nonzero(shares.real_guest & self.unresolved)), notes)

    # -- steal attribution and corrected times -------------------------------------
    def attributions(self, vm: str, per_function: bool = True) -> list[Attribution]:
        """Per vCPU and (process, function) — or per process — its real samples, and the steal that sat
        between two of its consecutive samples (thesis §3.4.2)."""
        s = self.samples
        out: list[Attribution] = []
        for tl in sorted(self.vm_timelines(vm), key=lambda t: t.vcpu):
            mine = self.thread_samples(tl)
            sel = mine[self.is_guest[mine]]
            if not len(sel):
                continue
            keys = (self.key if per_function else self.proc_key)[sel]
            steal = np.zeros((2, int(keys.max()) + 1))
            table, (lo, hi) = tl.table, tl.rows
            steals = lo + np.flatnonzero(table.kind[lo:hi] != bt.IDLE)
            if len(steals):
                times = s["time_ns"][sel].astype(np.int64)
                starts, ends = table.start[steals], table.end[steals]
                type1 = table.kind[steals] != bt.BLOCKED
                before = np.searchsorted(times, starts, side="right") - 1
                after = np.searchsorted(times, ends, side="left")
                ok = (before >= 0) & (after < len(times))
                before, after, type1 = before[ok], after[ok], type1[ok]
                dur = (ends - starts)[ok].astype(float)
                same = keys[before] == keys[after]
                np.add.at(steal[0], keys[before][same], dur[same])
                np.add.at(steal[1], keys[before][same & type1], dur[same & type1])
            # Run time comes from the exact on-CPU time of the vCPU thread, split by the samples, so a
            # sampling interrupt that never came does not shorten anybody's time.
            ns_per_sample = self.sample_ns(tl)
            # the VMM/KVM at work (steal of type 2, on the CPU) between two of its samples is steal too
            vmm = mine[~self.is_guest[mine]]
            before = np.searchsorted(sel, vmm) - 1  # sample indices are in time order
            ok = (before >= 0) & (before + 1 < len(sel))
            before = before[ok]
            same = keys[before] == keys[before + 1]
            np.add.at(steal[0], keys[before][same], ns_per_sample)
            uniq, first, counts = arrays.first_and_counts(keys, len(steal[0]))
            at = sel[first]  # the names of each group's first sample, as row() gives them
            funcs = self.func[at].tolist() if per_function else [""] * len(at)
            modules = self.module[at].tolist() if per_function else [""] * len(at)
            out += [Attribution(p, f, m, tl.vcpu, c, c * ns_per_sample, s0, s1)
                    for p, f, m, c, s0, s1 in zip(self.process[at].tolist(), funcs, modules, counts.tolist(),
                                                  steal[0, uniq].tolist(), steal[1, uniq].tolist(), strict=True)]
        return sorted(out, key=lambda a: -a.apparent_ns)


def analyse(rec: Recording, guest_bundles: dict[str, Path] | None = None, resolver: Resolver | None = None,
            time_range: tuple[float, float] | None = None, resolved: Resolved | None = None,
            keep: Callable[[np.ndarray], np.ndarray] | None = None, span_ns: tuple[int, int] | None = None,
            shares_only: bool = False) -> Analysis:
    """The pipeline from a loaded recording: the resolve stage (resolve/prepare.py), then the analysis."""
    return Analysis(prepare(rec, guest_bundles, resolver, time_range, resolved, keep, span_ns), shares_only)
