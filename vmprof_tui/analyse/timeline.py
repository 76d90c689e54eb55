"""What the sched events say, on the host clock, with no profile in it: per vCPU thread its timeline (on-CPU
time, and its blanks with their causes: idle, preempted and by whom, throttled, blocked in the VMM, woken up and
waiting, its halt polling, co-stop) and per CPU its idle time.

``Schedule`` builds every vCPU's timeline at once from the context switches and the wake-up records, into one
``BlankTable`` (blanks.py) they share, cut to the span analysed.  analysis.Analysis prices them in samples;
blanks.steal_split splits their time by cause.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.blanks import NO_TIME, Blank, BlankTable, clip_blanks, irq_in_range
from vmprof_tui.record.bpf_records import (
    SCHED_DTYPE,
    SCHED_HALT_END,
    SCHED_NEXT_VCPU,
    SCHED_NOT_SWITCH,
    SCHED_PREV_HALTED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_THROTTLED,
    SCHED_PREV_VCPU,
    SCHED_THROTTLE_END,
    SCHED_WAKEUP,
    cpu_order,
    next_on_cpu,
)

HOLDER_CPUS = 8  # CPUs whose switches _pcpu_holders sorts at once (a 64-CPU host: an eighth of its switches)
HALT_NS_UNKNOWN = 0xFFFFFFFF  # SCHED_HALT_END, SCHED_THROTTLE_END: a time too long for the record's 32 bits


class SwitchContext:
    """The last recorded context switch on each CPU and of each vCPU thread, as of the end of the chunks seen so far:
    what the analysis of the next chunk needs from before its span (who held each CPU as the span began, and
    whether each vCPU was on a CPU or in a blank then, and why).  At most one record per CPU and per vCPU thread."""

    def __init__(self) -> None:
        self.events = np.empty(0, SCHED_DTYPE)

    def advance(self, sched: np.ndarray) -> None:
        """Take in a chunk's sched events (in time order)."""
        ev = np.concatenate([self.events, sched[(sched["flags"] & SCHED_NOT_SWITCH) == 0]])
        if not len(ev):
            return
        n = len(ev)
        _cpus, from_end = arrays.unique(ev["cpu"][::-1], return_index=True)
        keep = [n - 1 - from_end]
        for side, flag in (("prev", SCHED_PREV_VCPU), ("next", SCHED_NEXT_VCPU)):
            at = np.flatnonzero(ev["flags"] & flag)
            thread = arrays.thread_keys(ev[f"{side}_pid"][at], ev[f"{side}_tid"][at])
            _threads, from_end = arrays.unique(thread[::-1], return_index=True)
            keep.append(at[len(at) - 1 - from_end])
        self.events = ev[np.unique(np.concatenate(keep))]


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


def irq_between(a: int, b: int) -> int:
    """IRQ time of one CPU between two of its events (cpu_irq_ns runs modulo 2^32)."""
    return (b - a) & 0xFFFFFFFF


def task_name(comm: bytes) -> str:
    """A task's comm from a sched record.  The BPF program copies the comm with bpf_probe_read_kernel_str into a
    ring-buffer slot that is not cleared, so after the string's NUL the slot keeps bytes of an older record
    ("ksoftirqd/1\\0-91" after "memfd:sealed-91"), and numpy's S16 strips only trailing NULs: cut at the first."""
    return comm.split(b"\0", 1)[0].decode(errors="replace")


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
    costop_ns: int = 0  # co-stop: time it could not run (any blank but a halt) while a sibling vCPU ran
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

    def forget_blanks(self) -> None:
        """Let its Blank objects go (made again if asked for)."""
        self._blanks = None


class Schedule:
    """The sched events of a span: context switches and, apart, the wake-up records of vCPU threads."""

    def __init__(self, sched: np.ndarray, wake_events: np.ndarray, vcpu_of_tid: dict[int, tuple[int, int]],
                 vm_by_pid: dict[int, str], span: tuple[int, int], range_ns: tuple[int, int] | None,
                 shares_only: bool = False, only: frozenset[int] | None = None) -> None:
        """sched: the switches in time order; vcpu_of_tid: vCPU thread id -> (VMM pid, vCPU id); span: the
        recording's span; range_ns: the span the timelines are cut to (None: all of it); shares_only: no holder
        of each blank, no co-stop (what the shares do not need); only: the vCPU threads (ids) to build timelines
        of, whole VMs (None: all), the vCPUs holding a pCPU found among all (without a range: every one has a
        timeline)."""
        self.sched, self.wake_events = sched, wake_events
        self.vcpu_of_tid, self.vm_by_pid = vcpu_of_tid, vm_by_pid
        self.span, self.range_ns, self.shares_only, self.only = span, range_ns, shares_only, only
        self._holders: dict[tuple[int, bytes], str] = {}  # (next pid, next comm) of a switch -> holder name

    @functools.cached_property
    def switches_on_cpu(self) -> dict[int, np.ndarray]:
        """CPU -> the indices of its context switches in self.sched (in time order): one sort for all CPUs.  Of the
        switches before the span analysed, only the last (what the CPU ran as the span began): a chunk's sched events
        begin with the last switch of each CPU and of each vCPU thread (SwitchContext), and a vCPU thread's
        may be older than its CPU's.  Of those after it, none: a streamed piece's sched events end with the first
        switch of each thread after it (analyse/stream.py first_switches), not every switch of each CPU, and a
        switch from idle among them, without the switch to idle before it, made the CPU look idle from the start."""
        on_cpu = dict(arrays.group_by(self.sched["cpu"], cpu_order(self.sched)))
        if self.range_ns is not None:
            t, (lo, hi) = self.sched["time_ns"], (np.uint64(r) for r in self.range_ns)
            for cpu, at in on_cpu.items():
                before, after = np.searchsorted(t[at], [lo, hi]).tolist()
                on_cpu[cpu] = at[max(before - 1, 0):after]
        return on_cpu

    def timelines(self, thread_samples: dict[int, np.ndarray], sample_times: np.ndarray) -> dict[int, VcpuTimeline]:
        """Per vCPU thread: on-CPU time and blank intervals from the sched events, for every thread at once (its
        switches, in one table by thread and time)."""
        _w0, w1 = self.span
        ev = self.sched
        threads = sorted((tid, v) for tid, v in self.vcpu_of_tid.items() if self.only is None or tid in self.only)
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
        times = sample_times
        for i, key in enumerate(keys.tolist()):
            own = thread_samples.get(key)
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
        if self.range_ns is not None:  # that of the runs in the range
            irq = irq_in_range(irq, ev_time[run_in], ev_time[run_out], *self.range_ns)
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
            timelines, alive, table = self._clip(timelines, alive, table, intervals)
        # from here the table's timeline column is the index among the timelines kept (-1: none)
        index = np.full(count, -1, np.int64)
        index[alive] = np.arange(len(alive))
        table.timeline = index[table.timeline]
        intervals[0] = index[intervals[0]]
        self._set_rows(timelines, np.arange(len(timelines)), table)
        self._pcpu_holders(timelines, table)
        for tl in timelines:
            tl.table = table
        if not self.shares_only:
            self._costop(timelines, table, *intervals[:3])
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
        holders = np.full(len(e), "", object)
        if not self.shares_only:
            holders[:] = self.holders_of(e["next_pid"], e["next_comm"])
        none = np.full(len(e), NO_TIME, np.int64)
        held = np.empty(0, np.int64)
        return BlankTable(timeline, e["time_ns"].astype(np.int64), ends, kind, e["prev_exit_reason"].astype(np.int64),
                          e["cpu"].astype(np.int64), holders, none, np.zeros(len(e), np.int64), none.copy(),
                          none.copy(), held, np.empty(0, bool), held, np.empty(0, object), held)

    def _pcpu_holders(self, timelines: list[VcpuTimeline], table: BlankTable) -> None:
        """Who held the pCPU while each vCPU waited (preempted), and how long: the recorded switches on that CPU
        from the one that began the wait (or the last before a cut wait's start) to the last before its end,
        each holding it until the next recorded switch there (host-to-host switches are not recorded).  A
        switch to a vCPU thread of the analysis gives a held_ row, to any other task a host_ row (named unless
        shares_only).  So a wait's holders never overlap, and add up to at most its length (Blank.holders gives
        the rest to first_holder).

        Not each vCPU thread's own on-CPU intervals: some of its switches go unrecorded (the sched program
        records a thread outside KVM_RUN only once the recorder has discovered it as a vCPU thread, up to a
        discovery interval after it starts), and an interval closed by its next recorded switch can then span
        what other tasks held the CPU: counted beside them, a wait's holders added up to more than the wait.

        A few CPUs at a time (HOLDER_CPUS: their switches and waits sorted at once, not every CPU's), the waits
        found in their CPU's switches (_switches_in_waits)."""
        waits = np.flatnonzero(table.kind == bt.PREEMPTED)
        ev = self.sched
        if not len(waits) or not len(ev):
            return
        ev_cpu, wait_cpu = ev["cpu"], table.cpu[waits]
        cpus = np.unique(ev_cpu).astype(np.int64)
        parts = []
        for lo in range(0, len(cpus), HOLDER_CPUS):
            first, last = int(cpus[lo]), int(cpus[min(lo + HOLDER_CPUS, len(cpus)) - 1])
            mine = (wait_cpu >= first) & (wait_cpu <= last)
            if mine.any():
                on = np.flatnonzero((ev_cpu >= first) & (ev_cpu <= last))
                parts.append(self._switches_in_waits(on, waits[mine], table))
        row, switch, ns = (np.concatenate(c) for c in zip(*parts, strict=True))  # a wait's CPU has its switch
        by_blank = np.argsort(row, kind="stable")  # by blank, then in time order: as for every CPU at once
        row, switch, ns = row[by_blank], switch[by_blank], ns[by_blank]
        # the vCPU thread each switch gives the CPU to (-1: a task that is no vCPU thread of the analysis)
        own = np.array([tl.pid << 32 | tl.tid for tl in timelines], np.int64)
        keys, pid, vcpus, vms = self._holder_threads(timelines)
        by_key = np.argsort(keys)
        nxt = ev["next_pid"][switch].astype(np.int64) << 32 | ev["next_tid"][switch]
        holder = np.full(len(switch), -1, np.int64)
        if len(keys):
            rank = np.searchsorted(keys[by_key], nxt).clip(0, len(keys) - 1)
            holder = np.where(keys[by_key][rank] == nxt, by_key[rank], -1)
        # a switch to the waiting vCPU itself ends its wait: inside one, the records contradict each other
        vcpu = (holder >= 0) & (ns > 0) & (keys[holder] != own[table.timeline[row]])
        if vcpu.any():
            r, h, n = row[vcpu], holder[vcpu], ns[vcpu]
            by_blank = np.lexsort((h, r))  # by blank, then in the order of the timelines
            r, h, n = r[by_blank], h[by_blank], n[by_blank]
            new = np.ones(len(r), bool)
            new[1:] = (r[1:] != r[:-1]) | (h[1:] != h[:-1])
            runs = np.flatnonzero(new)
            r, h, n = r[runs], h[runs], np.add.reduceat(n, runs)
            table.held_blank, table.held_same_vm, table.held_ns = r, pid[h] == own[table.timeline[r]] >> 32, n
            table.held_vcpu, table.held_vm = vcpus[h], vms[h]
        if self.shares_only:  # the shares need the vCPUs that held a pCPU, not the names of the other tasks
            return
        ok = (holder < 0) & (ns > 0)
        used = switch[ok]
        # by blank, then in time order
        table.host_blank, table.host_holder, table.host_ns = row[ok], self.holders_of(ev["next_pid"][used],
                                                                                      ev["next_comm"][used]), ns[ok]

    def _holder_threads(self, timelines: list[VcpuTimeline]) -> tuple[np.ndarray, ...]:
        """The vCPU threads that may hold a pCPU, in the order of their timelines (by thread id): those of the
        timelines, or with `only`, every one (pid << 32 | tid, pid, vCPU id, VM name)."""
        if self.only is None:
            of = [(tl.pid, tl.tid, tl.vcpu, tl.vm) for tl in timelines]
        else:
            of = [(pid, tid, v, self.vm_by_pid.get(pid, f"vm-{pid}"))
                  for tid, (pid, v) in sorted(self.vcpu_of_tid.items())]
        pid, tid, vcpu = (np.array([t[i] for t in of], np.int64) for i in range(3))
        return pid << 32 | tid, pid, vcpu, np.array([t[3] for t in of], object)

    def _switches_in_waits(self, on: np.ndarray, waits: np.ndarray,
                           table: BlankTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The recorded switches `on` some CPUs (indices into self.sched) in the waits on them (rows of `table`): per
        switch in a wait, the wait's row, the switch and how long it held the CPU in the wait, by wait and then in
        time order.  The switches and the waits' ends in one order by (CPU, time), where counting the switches
        before each end finds the switches in each wait."""
        ev = self.sched
        cpu = np.concatenate([ev["cpu"][on].astype(np.int64), table.cpu[waits], table.cpu[waits]])
        time = np.concatenate([ev["time_ns"][on].astype(np.int64), table.start[waits], table.end[waits]])
        # at one time: a wait's end before a switch (switches before its end: side="left"), a switch before a
        # wait's start (the switch that began it, or the last before: side="right")
        what = np.repeat(np.array([1, 2, 0], np.int8), [len(on), len(waits), len(waits)])
        order = np.lexsort((what, time, cpu))
        is_switch = what[order] == 1
        switches_upto = np.cumsum(is_switch)  # switches in the order up to each place
        at = np.empty(len(order), np.int64)
        at[order] = switches_upto
        switch = order[is_switch]  # the switches (indices into `on`) by CPU and time: cpu_order
        s_cpu, s_time = cpu[switch], time[switch]
        cpu_first = np.searchsorted(s_cpu, table.cpu[waits])  # where each wait's CPU's switches begin
        first = np.maximum(at[len(on):len(on) + len(waits)] - 1, cpu_first)
        last = at[len(on) + len(waits):]
        held_until = next_on_cpu(s_cpu, s_time, np.iinfo(np.int64).max)  # the last switch of a CPU: until the end
        many = (last - first).clip(0)
        w = np.repeat(np.arange(len(waits)), many)
        k = first[w] + np.arange(len(w)) - np.repeat(np.cumsum(many) - many, many)
        a, b = table.start[waits][w], table.end[waits][w]
        ns = np.minimum(held_until[k], b) - np.maximum(s_time[k], a)
        return waits[w], on[switch[k]], ns

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
            since, upto = self.range_ns or (-(1 << 63), (1 << 63) - 1)  # the halts that ended in the range count
            counted = (t >= since) & (t <= upto)
            tl.halts, tl.halt_polls_ok = int(np.count_nonzero(counted)), int(np.count_nonzero(ok & counted))
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

    def _costop(self, timelines: list[VcpuTimeline], table: BlankTable, iv_tl: np.ndarray, iv_lo: np.ndarray,
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
                    tl.costop_ns = int(overlap(run_lo, run_hi, start, table.end[a:z][waiting]).sum())

    def _clip(self, timelines: list[VcpuTimeline], alive: np.ndarray, table: BlankTable,
              intervals: list[np.ndarray]) -> tuple[list[VcpuTimeline], np.ndarray, BlankTable]:
        """Restrict the timelines and their blanks (table rows by `alive`, each timeline's index among all threads)
        and their on-CPU time (of `intervals`: thread, from, to) to the analysed time range: what is left of them.
        On-CPU time is of the runs, as for a whole recording: where events went unrecorded (a switch-in after a
        switch-in) a stretch is neither a run nor a blank, and the wall time less the blanks would count it."""
        lo, hi = self.range_ns
        kept = []
        for tl in timelines:
            tl.start_ns, tl.end_ns = max(tl.start_ns, lo), min(tl.end_ns, hi)
            kept.append(tl.end_ns > tl.start_ns)
        # blanks are in time order and do not overlap: only a run at either end of a timeline reaches past the range
        keep = clip_blanks(table, lo, hi)
        keep &= np.isin(table.timeline, alive[np.array(kept, bool)])
        table = table.take(np.flatnonzero(keep))
        run_ns = np.zeros(int(alive.max(initial=-1)) + 1, np.int64)
        thread, since, until = intervals[:3]
        inside = thread <= len(run_ns) - 1
        np.add.at(run_ns, thread[inside], (until[inside].clip(None, hi) - since[inside].clip(lo)).clip(0))
        timelines = [tl for tl, k in zip(timelines, kept, strict=True) if k]
        alive = alive[np.array(kept, bool)]
        for tl, i in zip(timelines, alive.tolist(), strict=True):
            tl.on_cpu_ns = int(run_ns[i])
        return timelines, alive, table

    def holders_of(self, pid: np.ndarray, comm: np.ndarray) -> np.ndarray:
        """holder() of each (pid, comm), as an object array: a call per distinct pair, not per switch (a 64-CPU
        window has hundreds of thousands of switches and a few hundred tasks)."""
        if not len(pid):
            return np.empty(0, object)
        pids, first, by_pid = arrays.unique(pid, return_index=True, return_inverse=True)
        words = np.ascontiguousarray(comm).view(np.uint64).reshape(len(comm), -1) if comm.itemsize % 8 == 0 else None
        if words is not None and (words == words[first[by_pid]]).all():  # one comm per pid (a string sort spared)
            names = [self.holder(p, c) for p, c in zip(pids.tolist(), comm[first].tolist(), strict=True)]
            return np.array(names, object)[by_pid]
        comms, comm_rank = np.unique(comm, return_inverse=True)
        pairs, inverse = arrays.unique(pid.astype(np.int64) << 32 | comm_rank.reshape(-1), return_inverse=True)
        names = [self.holder(p >> 32, comms[p & 0xFFFFFFFF].item()) for p in pairs.tolist()]
        return np.array(names, object)[inverse]

    def holder(self, pid: int, comm: bytes) -> str:
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

    def cpu_idle_ns(self, idle_at_start: set[int] | None = None) -> dict[int, int]:
        """Idle time per CPU from switches to and from the idle task (exact, unlike idle samples).  idle_at_start:
        filled with the CPUs whose first such switch leaves idle (idle from the start of the recording: a streamed
        report adds what came before its piece, analyse/stream.py)."""
        ev = self.sched
        idle: dict[int, int] = {}
        w0, w1 = self.span
        times, next_tid, prev_tid = ev["time_ns"], ev["next_tid"], ev["prev_tid"]
        for cpu, at in self.switches_on_cpu.items():
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
                if idle_at_start is not None:
                    idle_at_start.add(int(cpu))
            if len(to_idle) and not ok[-1]:
                start, end = np.append(start, t[to_idle[-1]]), np.append(end, w1)  # idle to the end
            if self.range_ns is not None:
                start, end = start.clip(*self.range_ns), end.clip(*self.range_ns)
            idle[int(cpu)] = int((end - start).sum())
        return idle
