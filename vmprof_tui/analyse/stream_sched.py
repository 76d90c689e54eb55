"""The vCPU timelines of a recording built from its sched events a piece at a time (analyse/stream_steal.py): what
timeline.Schedule builds from all of them at once (its blanks with their wake-ups, throttling, IRQ time and
holders, each thread's on-CPU and IRQ time, co-stop, halt polling), equal to it, in memory bounded by what is open
at a piece's edge (docs/scale.md).

Each piece's switches continue each vCPU thread's records from its last one before the piece (carried): a
switch-in after a switch-out closes a blank, a switch-out after a switch-in a run, as Schedule pairs them.  A blank
is given out (``Step.finished``) once nothing later changes it: a kernel's throttled-time record counts for the last
blank that ended before it, so a thread's last closed blank waits for its next one to close (or the end).  What a
blank needs from before the piece is carried with it: its first wake-ups, and what held its CPU, summed by holder
(analyse/stream_holders.py).  Co-stop is a measure of time (a wait's overlap with the runs of its
VM's vCPUs), so it adds piece by piece, with what is open at the edge cut there; should an open stretch later turn
out not to be a run or a blank (a switch-in after a switch-in: unrecorded switches) after it counted, the piece
analysis gives up (WholeNeeded) and the recording is read whole.  So does a halt's end that counted on an open
halted switch-out that turns out to be no blank, and halt polling recorded out of order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.blanks import NO_TIME, BlankTable, clip_blanks, clip_span, irq_in_range
from vmprof_tui.analyse.stream import WholeNeeded
from vmprof_tui.analyse.stream_holders import PcpuHolders
from vmprof_tui.analyse.timeline import (
    HALT_NS_UNKNOWN,
    Schedule,
    VcpuTimeline,
    _first_inside,
    irq_between,
    overlap,
)
from vmprof_tui.record.bpf_records import (
    SCHED_DTYPE,
    SCHED_HALT_END,
    SCHED_NOT_SWITCH,
    SCHED_PREV_HALTED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_THROTTLED,
    SCHED_THROTTLE_END,
    SCHED_WAKEUP,
)

MAX = np.iinfo(np.int64).max
MIN = np.iinfo(np.int64).min
HALT_REACH = 1 << 32  # a known halt began less than this before its record (its length takes 32 bits)


def blank_kind(flags: np.ndarray) -> np.ndarray:
    """The kind of the blank a switch-out begins (Schedule._blank_table)."""
    kind = np.full(len(flags), bt.BLOCKED, np.int8)
    kind[(flags & SCHED_PREV_RUNNABLE) != 0] = bt.PREEMPTED
    kind[(flags & SCHED_PREV_THROTTLED) != 0] = bt.THROTTLED
    kind[(flags & SCHED_PREV_HALTED) != 0] = bt.IDLE
    return kind


def concat_tables(tables: list[BlankTable]) -> BlankTable:
    """Blank tables one after the other (their holders' rows moved on with their blanks)."""
    out = {}
    rows = np.cumsum([0] + [len(t) for t in tables[:-1]])
    for f in fields(BlankTable):
        parts = [getattr(t, f.name) for t in tables]
        if f.name in ("held_blank", "host_blank"):
            parts = [p + r for p, r in zip(parts, rows.tolist(), strict=True)]
        out[f.name] = np.concatenate(parts)
    return BlankTable(**out)


def select_rows(table: BlankTable, rows: np.ndarray) -> BlankTable:
    """The blanks `rows`, in that order, with their holders (each blank's in their order)."""
    new = np.full(len(table), -1, np.int64)
    new[rows] = np.arange(len(rows))
    out = {f.name: getattr(table, f.name)[rows] for f in fields(table) if not f.name.startswith(("held_", "host_"))}
    for prefix in ("held_", "host_"):
        moved = new[getattr(table, prefix + "blank")]
        keep = np.flatnonzero(moved >= 0)
        keep = keep[np.argsort(moved[keep], kind="stable")]
        for f in fields(table):
            if f.name.startswith(prefix):
                out[f.name] = getattr(table, f.name)[keep]
        out[prefix + "blank"] = moved[keep]
    return BlankTable(**out)


def _empty_table() -> BlankTable:
    i, o = np.empty(0, np.int64), np.empty(0, object)
    return BlankTable(i, i, i, np.empty(0, np.int8), i, i, o, i, i, i, i, i, np.empty(0, bool), i, o, i, i, o, i)


@dataclass
class Step:
    """What a piece's sched events settled: blanks that nothing later changes (rows by thread, then time), and the
    blanks that are steal (not a halt) closed in it or open at its end (thread, start, end: MAX while open, of type
    1, start before the time range cut it: each blank's own), by thread and time.  With a time range, all of it
    cut to the range as Schedule cuts it, and the blanks outside left out."""
    finished: BlankTable
    steal: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SchedStream:
    """Every vCPU thread's timeline so far, its records given a piece at a time (``advance``)."""

    def __init__(self, vcpu_of_tid: dict[int, tuple[int, int]], vm_by_pid: dict[int, str]) -> None:
        threads = sorted(vcpu_of_tid.items())
        self.tids = np.array([tid for tid, _v in threads], np.int64)
        self.pid = np.array([pid for _tid, (pid, _v) in threads], np.int64)
        self.vcpu = np.array([v for _tid, (_pid, v) in threads], np.int64)
        self.keys = self.pid << 32 | self.tids
        self.vm = np.array([vm_by_pid.get(int(p), f"vm-{p}") for p in self.pid], object)
        self.by_key = np.argsort(self.keys)
        n = len(threads)
        self.namer = Schedule(np.empty(0, SCHED_DTYPE), np.empty(0, SCHED_DTYPE), vcpu_of_tid, vm_by_pid, (0, 0), None)
        self.first_sample, self.last_sample = np.full(n, MAX), np.full(n, MIN)
        self.first_rec, self.last_rec = np.full(n, MAX), np.full(n, MIN)
        self.last_in = np.zeros(n, bool)  # its last record is a switch-in (else a switch-out, or none)
        self.last = np.zeros(n, SCHED_DTYPE)  # its last record
        self.on_cpu, self.irq_running, self.costop = (np.zeros(n, np.int64) for _ in range(3))
        # of its open switch-out: the first wake-up and throttled wake-up since
        self.wake, self.thr_wake = np.full(n, NO_TIME), np.full(n, NO_TIME)
        self.run_used, self.wait_used, self.idle_used = (np.zeros(n, bool) for _ in range(3))
        self.has_wake = np.zeros(n, bool)  # any record that is not a switch: its halt polling is of those
        self.halts, self.polls_ok, self.poll_ns = (np.zeros(n, np.int64) for _ in range(3))
        self.poll_edges: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # not yet known inside its span
        self.poll_iv = [np.empty((0, 2), np.int64) for _ in range(n)]  # its recent polling stretches
        self.poll_from = np.full(n, MIN)  # no stretch recorded later begins before this
        self.idle_starts = [np.empty(0, np.int64) for _ in range(n)]  # its recent idle blanks' starts
        self.pending = _empty_table()  # each thread's last closed blank, until its next closes
        self.holders = PcpuHolders(self)  # who held the pCPU while a preempted blank waited
        # --time-range [lo, hi] on the host clock (None: all of it): what is measured is cut to it as Schedule cuts
        # the timelines (set once the recording's first record is known)
        self.range_ns: tuple[int, int] | None = None

    def _within(self, since: np.ndarray, until: np.ndarray) -> np.ndarray:
        """The length of each [since, until) inside the time range."""
        if self.range_ns is None:
            return until - since
        lo, hi = self.range_ns
        return (until.clip(None, hi) - since.clip(lo)).clip(0)

    def thread_of(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """The thread index of each (pid, tid), -1: no vCPU thread."""
        if not len(self.keys):
            return np.full(len(pid), -1, np.int64)
        key = pid.astype(np.int64) << 32 | tid
        rank = np.searchsorted(self.keys[self.by_key], key).clip(0, len(self.keys) - 1)
        return np.where(self.keys[self.by_key][rank] == key, self.by_key[rank], -1)

    def saw_samples(self, threads: np.ndarray, times: np.ndarray) -> None:
        """A piece's samples of vCPU threads (thread index, time), given before its sched events."""
        np.minimum.at(self.first_sample, threads, times)
        np.maximum.at(self.last_sample, threads, times)

    # -- a piece -----------------------------------------------------------------------------------------
    def advance(self, sched: np.ndarray, lo: int, hi: int, last: bool) -> Step:
        """A piece's sched events [lo, hi), in prepare's order (the last piece: hi is the recording's end)."""
        not_switch = (sched["flags"] & SCHED_NOT_SWITCH) != 0
        switches, wakes = sched[~not_switch], sched[not_switch]
        closed, runs, touched = self._records(switches)
        if last:
            closed = concat_tables([closed, self._tails(hi)])
        self._wakeups(closed, wakes, touched)
        out = self.open_out()
        self.holders.advance(closed, switches, out[blank_kind(self.last["flags"][out]) == bt.PREEMPTED])
        table = concat_tables([self.pending, closed])
        if np.any(np.diff(table.timeline) < 0):  # by thread: each one's pending blank before its closed ones
            table = select_rows(table, np.argsort(table.timeline, kind="stable"))
        self._throttle_ends(table, wakes[(wakes["flags"] & SCHED_NOT_SWITCH) == SCHED_THROTTLE_END])
        self._halt_ends(closed, wakes[(wakes["flags"] & SCHED_NOT_SWITCH) == SCHED_HALT_END], hi)
        self._costop(closed, runs, lo, hi, last)
        if last:
            self._still(hi)
            finished, self.pending = table, _empty_table()
        else:
            final = np.ones(len(table), bool)
            final[np.flatnonzero(np.diff(np.append(table.timeline, -1)) != 0)] = False  # each thread's last
            finished = select_rows(table, np.flatnonzero(final))
            self.pending = select_rows(table, np.flatnonzero(~final))
        if self.range_ns is not None:
            finished = select_rows(finished, np.flatnonzero(clip_blanks(finished, *self.range_ns)))
        return Step(finished, self._steal(closed, last))

    def _records(self, switches: np.ndarray) -> tuple[BlankTable, tuple[np.ndarray, ...], np.ndarray]:
        """The piece's switches of vCPU threads after each one's last before: the blanks they close, on-CPU and IRQ
        time, the runs they close (thread, from, to), and the threads with a record in the piece."""
        parts = []
        for side, switched_in in (("prev", False), ("next", True)):
            thread = self.thread_of(switches[f"{side}_pid"], switches[f"{side}_tid"])
            at = np.flatnonzero(thread >= 0)
            parts.append((thread[at], at, np.full(len(at), switched_in)))
        thread, event, is_in = (np.concatenate(c) for c in zip(*parts, strict=True))
        order = np.lexsort((is_in, switches["time_ns"][event], thread))
        thread, event, is_in = thread[order], event[order], is_in[order]
        ev = switches[event]
        t, cpu, irq = (ev[f].astype(np.int64) for f in ("time_ns", "cpu", "cpu_irq_ns"))
        first = np.ones(len(event), bool)
        first[1:] = thread[1:] != thread[:-1]
        had = self.last_rec[thread] != MIN  # a record before, carried
        ever = first & ~had  # the thread's first record of all
        np.minimum.at(self.first_rec, thread[ever], t[ever])
        prev = np.roll(ev, 1)
        prev[first] = self.last[thread[first]]
        prev_in = np.where(first, self.last_in[thread], np.roll(is_in, 1))
        # an open stretch counted in co-stop that turns out to be no run (a switch-in after a switch-in, or first) or
        # no blank (a switch-out after a switch-out): the pieces cannot give the whole's co-stop
        carried = thread[first]
        waited = self.wait_used[carried] | self.idle_used[carried]
        if np.any((self.run_used[carried] & is_in[first] & (prev_in[first] | ever[first]))
                  | (waited & ~is_in[first] & ~prev_in[first] & had[first])):
            raise WholeNeeded("an open stretch of a vCPU thread that was no run or blank")
        self.run_used[carried] = self.wait_used[carried] = self.idle_used[carried] = False
        after_in = ever | prev_in
        start = np.minimum(t, self.first_sample[thread])
        since = np.where(ever, start, prev["time_ns"].astype(np.int64))
        closes_run = ~is_in & after_in
        closes_blank = is_in & ~after_in
        np.add.at(self.on_cpu, thread[closes_run], self._within(since[closes_run], t[closes_run]))
        ran = np.flatnonzero(closes_run & ~ever)
        p = prev[ran]
        irq_ns = np.minimum(irq_between(p["cpu_irq_ns"].astype(np.int64), irq[ran]),
                            t[ran] - p["time_ns"].astype(np.int64))
        if self.range_ns is not None:  # that of the runs in the range
            irq_ns = irq_in_range(irq_ns, p["time_ns"].astype(np.int64), t[ran], *self.range_ns)
        same = p["cpu"].astype(np.int64) == cpu[ran]
        np.add.at(self.irq_running, thread[ran][same], irq_ns[same])
        runs = (thread[closes_run], since[closes_run], t[closes_run])
        # the blanks closed: from the switch-out before each closing switch-in
        at = np.flatnonzero(closes_blank)
        out, back = prev[at], ev[at]
        closed = self.blank_table(thread[at], out, t[at])
        irq_ns = np.minimum(irq_between(out["cpu_irq_ns"].astype(np.int64), irq[at]),
                            t[at] - out["time_ns"].astype(np.int64))
        closed.irq[:] = np.where((out["cpu"] == back["cpu"]) & (closed.kind == bt.PREEMPTED), irq_ns, 0)
        # what each thread's last record leaves open
        ends = np.flatnonzero(np.append(first[1:], True)) if len(event) else np.empty(0, np.int64)
        gone = thread[ends]
        self.last[gone], self.last_in[gone], self.last_rec[gone] = ev[ends], is_in[ends], t[ends]
        return closed, runs, gone

    def blank_table(self, thread: np.ndarray, out: np.ndarray, end: np.ndarray) -> BlankTable:
        """Blanks of `thread` that began with the switch-outs `out` and end at `end` (Schedule._blank_table)."""
        table = _empty_table()
        none = np.full(len(out), NO_TIME, np.int64)
        return replace(table, timeline=thread, start=out["time_ns"].astype(np.int64), end=end,
                       kind=blank_kind(out["flags"]), exit_reason=out["prev_exit_reason"].astype(np.int64),
                       cpu=out["cpu"].astype(np.int64), first_holder=self.namer.holders_of(out["next_pid"],
                                                                                           out["next_comm"]),
                       wakeup=none, irq=np.zeros(len(out), np.int64), throttled=none.copy(),
                       throttled_wakeup=none.copy())

    def _tails(self, end: int) -> BlankTable:
        """At the end: what a thread's last switch-out leaves open runs to the end if it left runnable or halted."""
        open_out = np.flatnonzero((self.last_rec != MIN) & ~self.last_in)
        left = (self.last["flags"][open_out] & (SCHED_PREV_RUNNABLE | SCHED_PREV_HALTED)) != 0
        if np.any((self.wait_used[open_out] | self.idle_used[open_out]) & ~left):
            raise WholeNeeded("an open switch-out of a vCPU thread that was no blank")
        tail = open_out[left]
        out = self.last[tail]
        return self.blank_table(tail, out, np.maximum(out["time_ns"].astype(np.int64), end))

    def open_out(self) -> np.ndarray:
        """The threads whose last record is a switch-out."""
        return np.flatnonzero((self.last_rec != MIN) & ~self.last_in)

    # -- what each blank reads of other records ----------------------------------------------------------
    def _wakeups(self, closed: BlankTable, wakes: np.ndarray, touched: np.ndarray) -> None:
        """The first wake-up (and throttled one) inside each closed blank, and since each open switch-out (those
        carried are since the one open as the piece began: before any later one's start)."""
        thread = self.thread_of(wakes["prev_pid"], wakes["prev_tid"])
        mine = thread >= 0
        self.has_wake[thread[mine]] = True
        kind = wakes["flags"] & SCHED_NOT_SWITCH
        woke = mine & (kind == SCHED_WAKEUP)
        w_thread, w_time = thread[woke], wakes["time_ns"][woke].astype(np.int64)
        w_thr = (wakes["flags"][woke] & SCHED_PREV_THROTTLED) != 0
        open_out = self.open_out()
        for i in np.unique(np.concatenate([w_thread, closed.timeline])).tolist():
            times = w_time[w_thread == i]
            rows = np.flatnonzero(closed.timeline == i)
            starts = closed.start[rows]
            first = [_first_inside(starts, closed.end[rows], np.concatenate([[c], ts]) if c != NO_TIME else ts)
                     for c, ts in ((self.wake[i], times), (self.thr_wake[i], times[w_thr[w_thread == i]]))]
            kinds = closed.kind[rows]
            closed.wakeup[rows] = np.where(kinds == bt.IDLE, first[0], NO_TIME)
            closed.throttled_wakeup[rows] = np.where((kinds == bt.IDLE) | (kinds == bt.BLOCKED), first[1], NO_TIME)
        moved = np.union1d(touched, w_thread)
        for i in np.intersect1d(open_out, moved).tolist():
            a = np.array([int(self.last["time_ns"][i])], np.int64)
            times = w_time[w_thread == i]
            for column, ts in ((self.wake, times), (self.thr_wake, times[w_thr[w_thread == i]])):
                c = int(column[i])
                column[i] = _first_inside(a, np.array([MAX]), np.concatenate([[c], ts]) if c != NO_TIME else ts)[0]
        gone = np.setdiff1d(touched, open_out)
        self.wake[gone] = self.thr_wake[gone] = NO_TIME

    def _throttle_ends(self, table: BlankTable, done: np.ndarray) -> None:
        """The kernel's throttled time, recorded as a thread took a CPU again: for its last blank ended by then."""
        thread = self.thread_of(done["prev_pid"], done["prev_tid"])
        for i in np.unique(thread[thread >= 0]).tolist():
            mine = done[thread == i]
            rows = np.flatnonzero(table.timeline == i)
            if not len(rows):
                continue
            k = np.searchsorted(table.end[rows], mine["time_ns"].astype(np.int64), side="right") - 1
            ns = mine["prev_exit_reason"].astype(np.int64)
            row = rows[k.clip(0)]
            ok = (k >= 0) & (ns != HALT_NS_UNKNOWN) & (
                (table.kind[row] == bt.THROTTLED) | (table.throttled_wakeup[row] != NO_TIME))
            last, at = np.unique(row[ok][::-1], return_index=True)  # the last count of a blank holds
            table.throttled[last] = ns[ok][::-1][at]

    def _halt_ends(self, closed: BlankTable, halts: np.ndarray, hi: int) -> None:
        """How long KVM polled each halt that ended (Schedule._wakeups): all of it when polling ended it, else
        until the thread first left its CPU halted after the halt began."""
        thread = self.thread_of(halts["prev_pid"], halts["prev_tid"])
        idle = closed.kind == bt.IDLE
        open_out = self.open_out()
        for i in np.unique(np.concatenate([thread[thread >= 0], closed.timeline[idle]])).tolist():
            starts = np.concatenate([self.idle_starts[i], closed.start[idle & (closed.timeline == i)]])
            self.idle_starts[i] = starts[starts >= hi - HALT_REACH]
            mine = halts[thread == i]
            if not len(mine):
                continue
            tentative = i in open_out and bool(self.last["flags"][i] & SCHED_PREV_HALTED)
            if tentative:  # an open halted switch-out: a blank unless a switch-out follows it
                starts = np.append(starts, int(self.last["time_ns"][i]))
            t = mine["time_ns"].astype(np.int64)
            halt_ns = mine["prev_exit_reason"].astype(np.int64)
            known = halt_ns != HALT_NS_UNKNOWN
            ok = (mine["flags"] & SCHED_PREV_RUNNABLE) != 0
            since, upto = self.range_ns or (MIN, MAX)  # the halts that ended in the range count
            counted = (t >= since) & (t <= upto)
            self.halts[i] += int(np.count_nonzero(counted))
            self.polls_ok[i] += int(np.count_nonzero(ok & counted))
            poll = np.where(ok, halt_ns, 0)
            if len(starts):
                halt_start = t - halt_ns
                k = np.searchsorted(starts, halt_start)
                first = starts[k.clip(0, len(starts) - 1)]
                blocked = ~ok & (k < len(starts)) & (first <= t)
                poll = np.where(blocked, np.clip(first - halt_start, 0, halt_ns), poll)
                if tentative and np.any(blocked & known & (k == len(starts) - 1)):
                    self.idle_used[i] = True
            begun = (t - halt_ns)[known]
            iv = np.stack([begun, begun + poll[known]], axis=1)
            if len(iv) and (np.any(np.diff(begun) < 0) or begun[0] < self.poll_from[i]):
                raise WholeNeeded("halt polling recorded out of order")
            if len(iv):
                self.poll_from[i] = int(begun[-1])
                self.poll_iv[i] = np.concatenate([self.poll_iv[i], iv])
                edges = iv if self.range_ns is None else iv.clip(*self.range_ns)
                self.poll_edges[i] += [tuple(x) for x in edges.tolist()]
        self._settle_polls()

    def _settle_polls(self, final: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Halt polling inside each thread's span added up (exact_poll_ns): a stretch once its span is known to hold
        it (or, `final`, each thread's start and end: cut to them)."""
        for i, edges in enumerate(self.poll_edges):
            if not edges:
                continue
            iv = np.array(edges, np.int64)
            if final is not None:
                iv = np.clip(iv, final[0][i], final[1][i])
                inside = np.ones(len(iv), bool)
            else:
                inside = (iv[:, 0] >= min(self.first_rec[i], self.first_sample[i])) & (
                    iv[:, 1] <= max(self.last_rec[i], self.last_sample[i]))
            self.poll_ns[i] += int((iv[inside, 1] - iv[inside, 0]).sum())
            self.poll_edges[i] = [tuple(x) for x in iv[~inside].tolist()]

    def polling_known_before(self, i: int) -> int:
        """Samples of thread i before this time are known to be inside a polling stretch or not (by poll_iv)."""
        return int(self.poll_from[i])

    def forget_polls(self, i: int, before: int) -> None:
        """Thread i's polling stretches that end by `before` are asked about no more."""
        iv = self.poll_iv[i]
        self.poll_iv[i] = iv[iv[:, 1] > before]

    # -- co-stop -------------------------------------------------------------------------------------------
    def _costop(self, closed: BlankTable, runs: tuple[np.ndarray, ...], lo: int, hi: int, last: bool) -> None:
        """Each vCPU's waits' overlap with the runs of its VM's vCPUs within [lo, hi) (Schedule._costop: a measure
        of time, which adds piece by piece).  What is open at the edge counts to it, as run or wait."""
        r_thr, r_lo, r_hi = runs
        end = hi if not last else MAX
        open_runs = np.flatnonzero(self.last_in | ((self.last_rec == MIN) & (self.first_sample != MAX)))
        since = np.where(self.last_in[open_runs], self.last["time_ns"][open_runs].astype(np.int64),
                         self.first_sample[open_runs])
        if last:  # what is on a CPU at the end runs to its thread's end
            run_end = self._ends(hi)[open_runs]
            if np.any(self.run_used[open_runs] & (run_end < lo)):  # counted in pieces past its end
                raise WholeNeeded("a run of a vCPU thread that ended before the last piece")
        else:
            run_end = np.full(len(open_runs), hi)
        waiting = (closed.kind != bt.IDLE) | (closed.wakeup != NO_TIME)
        w_thr = closed.timeline[waiting]
        w_lo = np.where(closed.kind == bt.IDLE, closed.wakeup, closed.start)[waiting]
        w_hi = closed.end[waiting]
        open_waits = np.empty(0, np.int64)
        if not last:
            out = self.open_out()
            kind = blank_kind(self.last["flags"][out])
            wait_from = np.where(kind == bt.IDLE, self.wake[out], self.last["time_ns"][out].astype(np.int64))
            out, wait_from = out[wait_from != NO_TIME], wait_from[wait_from != NO_TIME]
            open_waits = out
            w_thr, w_lo, w_hi = (np.concatenate(c) for c in ((w_thr, out), (w_lo, wait_from),
                                                             (w_hi, np.full(len(out), hi))))
        r_thr, r_lo, r_hi = (np.concatenate(c) for c in ((r_thr, open_runs), (r_lo, since), (r_hi, run_end)))
        tentative_run = np.zeros(len(r_thr), bool)
        if not last:
            tentative_run[len(runs[0]):] = True
        if self.range_ns is not None:  # the overlap inside the range
            lo, end = max(lo, self.range_ns[0]), min(end, self.range_ns[1])
        r_lo, r_hi, w_lo, w_hi = r_lo.clip(lo), r_hi.clip(None, end), w_lo.clip(lo), w_hi.clip(None, end)
        keep = r_hi > r_lo
        r_thr, r_lo, r_hi, tentative_run = r_thr[keep], r_lo[keep], r_hi[keep], tentative_run[keep]
        tentative_wait = np.zeros(len(w_thr), bool)
        tentative_wait[len(w_thr) - len(open_waits):] = True
        keep = w_hi > w_lo
        w_thr, w_lo, w_hi, tentative_wait = w_thr[keep], w_lo[keep], w_hi[keep], tentative_wait[keep]
        r_pid, w_pid = self.pid[r_thr], self.pid[w_thr]
        for vm_pid in np.intersect1d(r_pid, w_pid).tolist():
            at = np.flatnonzero(r_pid == vm_pid)
            order = np.argsort(r_lo[at])
            run_lo, run_hi = _merged(r_lo[at][order], r_hi[at][order])
            mine = np.flatnonzero(w_pid == vm_pid)
            got = overlap(run_lo, run_hi, w_lo[mine], w_hi[mine])
            np.add.at(self.costop, w_thr[mine], got)
            self.wait_used[w_thr[mine][tentative_wait[mine] & (got > 0)]] = True
            t_runs = at[tentative_run[at]]
            if len(t_runs):
                order = np.argsort(w_lo[mine])
                wait_lo, wait_hi = _merged(w_lo[mine][order], w_hi[mine][order])
                used = overlap(wait_lo, wait_hi, r_lo[t_runs], r_hi[t_runs]) > 0
                self.run_used[r_thr[t_runs][used]] = True

    def _ends(self, end: int) -> np.ndarray:
        """Each thread's end (Schedule.timelines): its last record or sample; the recording's `end` if its last
        switch-out left it runnable or halted."""
        out = np.maximum(self.last_rec, self.last_sample)
        tail = (self.last_rec != MIN) & ~self.last_in & (
            (self.last["flags"] & (SCHED_PREV_RUNNABLE | SCHED_PREV_HALTED)) != 0)
        out[tail] = end
        return out

    def _still(self, w1: int) -> None:
        """At the end (`w1`: the recording's): on-CPU time of what is on a CPU to its thread's end."""
        self.end = end = self._ends(w1)
        self.start = start = np.minimum(self.first_rec, self.first_sample)
        on_since = np.where(self.last_in, self.last["time_ns"].astype(np.int64),
                            np.where(self.last_rec == MIN, start, MAX))
        still = (on_since <= end) & (start <= end)
        self.on_cpu[still] += self._within(on_since[still], end[still])
        if self.range_ns is not None:  # the timelines cut to the range
            self.start, self.end = start.clip(self.range_ns[0]), end.clip(None, self.range_ns[1])
        self._settle_polls((self.start, self.end))

    def _steal(self, closed: BlankTable, last: bool) -> tuple[np.ndarray, ...]:
        steal = closed.kind != bt.IDLE
        thread, start, end = closed.timeline[steal], closed.start[steal], closed.end[steal]
        type1 = closed.kind[steal] != bt.BLOCKED
        own = start
        if self.range_ns is not None:
            start, end, keep = clip_span(start, end, *self.range_ns)
            thread, start, end, type1, own = thread[keep], start[keep], end[keep], type1[keep], own[keep]
        if not last:
            out = self.open_out()
            kind = blank_kind(self.last["flags"][out])
            out, kind = out[kind != bt.IDLE], kind[kind != bt.IDLE]
            began = self.last["time_ns"][out].astype(np.int64)
            thread, start, end, type1, own = (np.concatenate(c) for c in (
                (thread, out), (start, began if self.range_ns is None else began.clip(self.range_ns[0])),
                (end, np.full(len(out), MAX)), (type1, kind != bt.BLOCKED), (own, began)))
        order = np.lexsort((own, thread))
        return thread[order], start[order], end[order], type1[order], own[order]

    def timelines(self) -> dict[int, VcpuTimeline]:
        """Each vCPU thread's timeline with a life (a record or a sample), once the last piece is in: no blanks
        (given out piece by piece), no polling stretches (halt polling: poll_ns, has_wake)."""
        out = {}
        alive = self.start <= self.end if self.range_ns is None else self.start < self.end  # as Schedule._clip keeps
        for i in np.flatnonzero(alive).tolist():
            out[int(self.tids[i])] = VcpuTimeline(
                str(self.vm[i]), int(self.pid[i]), int(self.tids[i]), int(self.vcpu[i]), int(self.start[i]),
                int(self.end[i]), int(self.on_cpu[i]), int(self.irq_running[i]), int(self.costop[i]), 0,
                int(self.polls_ok[i]), int(self.halts[i]))
        return out


def _merged(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals sorted by start merged where they overlap or touch (Schedule._costop)."""
    if not len(lo):
        return lo, hi
    reach = np.maximum.accumulate(hi)
    new = np.ones(len(lo), bool)
    new[1:] = lo[1:] > reach[:-1]
    return lo[new], np.append(reach[np.nonzero(new)[0][1:] - 1], reach[-1])
