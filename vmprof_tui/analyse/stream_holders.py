"""Who held the pCPU while each preempted blank of a vCPU thread waited (timeline.Schedule._pcpu_holders), from
the sched events a piece at a time (analyse/stream_sched.py): the switches on its CPU from the last at or before
its start to the last before its end, each holding the CPU until the next there.

Only each CPU's last switch is carried from piece to piece.  What held a blank still open at a piece's edge is
summed by holder as the pieces pass, each holder where it first came (the order the steal tables list holders of
equal time in): a blank that stays open (a lost switch-in record leaves one open to the end) carries a sum per
task that held its CPU, not the CPU's switches since it began."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.blanks import BlankTable
from vmprof_tui.analyse.timeline import Schedule
from vmprof_tui.record.bpf_records import SCHED_DTYPE, cpu_order

MAX = np.iinfo(np.int64).max
MIN = np.iinfo(np.int64).min
# a switch and until when it held its CPU (MAX: the CPU's last so far)
HELD_DTYPE = np.dtype([("cpu", "<i8"), ("start", "<i8"), ("until", "<i8"), ("next_pid", "<u4"), ("next_tid", "<u4"),
                       ("next_comm", "S16")])
Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # blank row, holder thread (-1: host task), name, ns


def no_holders() -> Rows:
    i = np.empty(0, np.int64)
    return i, i.copy(), np.empty(0, object), i.copy()


def joined(a: Rows, b: Rows) -> Rows:
    """Holder rows `a` before `b`, by row (each row's from `a` first)."""
    out = tuple(np.concatenate(c) for c in zip(a, b, strict=True))
    order = np.argsort(out[0], kind="stable")
    return tuple(c[order] for c in out)


class Threads(Protocol):
    """What PcpuHolders reads of its SchedStream (analyse/stream_sched.py imports this module, not the reverse)."""
    tids: np.ndarray  # per vCPU thread: its tid, pid, pid << 32 | tid, vCPU id, VM name, last sched record
    pid: np.ndarray
    keys: np.ndarray
    vcpu: np.ndarray
    vm: np.ndarray
    last: np.ndarray
    namer: Schedule
    range_ns: tuple[int, int] | None

    def thread_of(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray: ...


class PcpuHolders:
    """The holders of the preempted blanks of a SchedStream, given its pieces' closed blanks and switches."""

    def __init__(self, sched: Threads) -> None:
        self.sched = sched
        self.cpu_last = np.zeros(0, SCHED_DTYPE)  # each CPU's last switch (by CPU number; valid where seen)
        self.cpu_seen = np.zeros(0, bool)
        # what held each thread's open preempted blank in the pieces before (rows: the thread), and its start
        # (MIN: none)
        self.so_far = no_holders()
        self.start = np.full(len(sched.tids), MIN)

    def advance(self, closed: BlankTable, switches: np.ndarray, preempted: np.ndarray) -> None:
        """Set the holders of a piece's closed blanks (`closed`, its held_ and host_ rows); sum what held the blanks
        still open: of `preempted`, the threads whose last record is a switch-out that left them runnable."""
        s = self.sched
        known = self._known(switches)
        waits = np.flatnonzero(closed.kind == bt.PREEMPTED)
        so_far = self.so_far
        # the open blanks wait until their CPU's last switch (the one still holding it: not yet summed)
        start = s.last["time_ns"][preempted].astype(np.int64)
        cpu = s.last["cpu"][preempted].astype(np.int64)
        held_now = known[known["until"] == MAX]
        until = held_now["start"][np.searchsorted(held_now["cpu"], cpu).clip(0, max(len(held_now) - 1, 0))] \
            if len(held_now) else start
        # the closed waits and the open ones at once (one pass over their CPUs)
        row, holder, name, ns = self._rows(*(np.concatenate(c) for c in (
            (closed.timeline[waits], preempted), (closed.start[waits], start), (closed.end[waits], until),
            (closed.cpu[waits], cpu))), known)
        now = row < len(waits)
        if len(waits):
            # the blanks open as the piece began: what held them before it comes first
            row_of = np.full(len(s.tids), -1, np.int64)
            began = waits[self.start[closed.timeline[waits]] == closed.start[waits]]
            row_of[closed.timeline[began]] = began
            at = row_of[so_far[0]]
            before = tuple(c[at >= 0] for c in (at, *so_far[1:]))
            self._set(closed, joined(before, (waits[row[now]], holder[now], name[now], ns[now])))
        # what held the blanks still open in the piece, added to what held them before (a switch-out after the
        # one a blank began with: that was no blank, and what held it is dropped)
        same = np.zeros(len(s.tids), bool)
        same[preempted[self.start[preempted] == start]] = True
        self.start[:] = MIN
        self.start[preempted] = start
        before = tuple(c[same[so_far[0]]] for c in so_far)
        later = ~now
        self.so_far = self._summed(*joined(before, (preempted[row[later] - len(waits)], holder[later], name[later],
                                                    ns[later])))

    def _known(self, switches: np.ndarray) -> np.ndarray:
        """The piece's switches with each CPU's last before, each held until the next on its CPU (by CPU, then
        time); each CPU's last switch carried on."""
        order = cpu_order(switches)
        ev = switches[order]
        cpu = ev["cpu"].astype(np.int64)
        top = int(cpu.max(initial=-1)) + 1
        if top > len(self.cpu_last):
            self.cpu_last = np.concatenate([self.cpu_last, np.zeros(top - len(self.cpu_last), SCHED_DTYPE)])
            self.cpu_seen = np.concatenate([self.cpu_seen, np.zeros(top - len(self.cpu_seen), bool)])
        first = np.ones(len(ev), bool)
        first[1:] = cpu[1:] != cpu[:-1]
        carried = self.cpu_last[self.cpu_seen]  # each CPU's last switch before: open until its next
        all_ev = np.concatenate([carried, ev])
        all_cpu = all_ev["cpu"].astype(np.int64)
        o = np.lexsort((np.arange(len(all_ev)) >= len(carried), all_cpu))  # by CPU, the carried first
        all_ev, all_cpu = all_ev[o], all_cpu[o]
        until = np.append(all_ev["time_ns"][1:].astype(np.int64), MAX)
        until[:-1][all_cpu[1:] != all_cpu[:-1]] = MAX
        known = np.zeros(len(all_ev), HELD_DTYPE)
        known["cpu"], known["start"], known["until"] = all_cpu, all_ev["time_ns"].astype(np.int64), until
        for f in ("next_pid", "next_tid", "next_comm"):
            known[f] = all_ev[f]
        last = np.flatnonzero(first)[1:] - 1 if len(ev) else np.empty(0, np.int64)
        last = np.append(last, len(ev) - 1) if len(ev) else last
        self.cpu_last[cpu[last]] = ev[last]
        self.cpu_seen[cpu[last]] = True
        return known

    def _rows(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray, cpu: np.ndarray,
              known: np.ndarray) -> Rows:
        """Per switch of `known` inside a wait (of `thread`, from `start` to `end` on `cpu`): the wait's index, the
        vCPU thread it gave the CPU to (-1: a host task), that task's name, and how long it held the CPU in the
        wait (not the wait's own thread, no zero times), by wait and then in time order."""
        s = self.sched
        if not len(thread):
            return no_holders()
        known = known[np.lexsort((known["start"], known["cpu"]))]
        rows, picks, ns = [], [], []
        for c in np.unique(cpu).tolist():
            mine = np.flatnonzero(cpu == c)
            a, z = np.searchsorted(known["cpu"], [c, c + 1])
            begin, until = known["start"][a:z], known["until"][a:z]
            lo, hi = start[mine], end[mine]
            if s.range_ns is not None:  # what held it in the range
                lo, hi = lo.clip(s.range_ns[0]), hi.clip(None, s.range_ns[1])
            first = np.searchsorted(until, lo, side="right")
            upto = np.searchsorted(begin, hi, side="left")
            many = (upto - first).clip(0)
            w = np.repeat(np.arange(len(mine)), many)
            k = first[w] + np.arange(len(w)) - np.repeat(np.cumsum(many) - many, many)
            rows.append(mine[w])
            picks.append(a + k)
            ns.append(np.minimum(until[k], hi[w]) - np.maximum(begin[k], lo[w]))
        row, pick, ns = (np.concatenate(c) for c in (rows, picks, ns))
        by_blank = np.argsort(row, kind="stable")
        row, pick, ns = row[by_blank], pick[by_blank], ns[by_blank]
        sw = known[pick]
        holder = s.thread_of(sw["next_pid"], sw["next_tid"])
        # a switch to the waiting vCPU itself ends its wait: inside one, the records contradict each other
        ok = (ns > 0) & ((holder < 0) | (s.keys[holder.clip(0)] != s.keys[thread[row]]))
        row, holder, ns, sw = row[ok], holder[ok], ns[ok], sw[ok]
        name = np.full(len(row), None, object)
        host = holder < 0
        name[host] = s.namer.holders_of(sw["next_pid"][host], sw["next_comm"][host])
        return row, holder, name, ns

    def _summed(self, row: np.ndarray, holder: np.ndarray, name: np.ndarray, ns: np.ndarray) -> Rows:
        """Holder rows (by row) summed by row and holder (a vCPU thread, or a host task's name), each where it first
        comes."""
        if not len(row):
            return row, holder, name, ns
        code = holder.copy()
        host = holder < 0
        if host.any():
            _names, at = np.unique(name[host].astype(str), return_inverse=True)
            code[host] = len(self.sched.keys) + at.reshape(-1)
        pairs, first, inverse = arrays.unique(row << 32 | code, return_index=True, return_inverse=True)
        total = np.zeros(len(pairs), np.int64)
        np.add.at(total, inverse, ns)
        order = np.argsort(first, kind="stable")
        at = first[order]
        return row[at], holder[at], name[at], total[order]

    def _set(self, table: BlankTable, rows: Rows) -> None:
        """The holder rows of `table` (Schedule._pcpu_holders): vCPU threads by blank and thread, host tasks by
        blank in the order they first held the CPU, each summed."""
        s = self.sched
        row, holder, name, ns = self._summed(*rows)
        vcpu = holder >= 0
        if vcpu.any():
            r, h, n = row[vcpu], holder[vcpu], ns[vcpu]
            o = np.lexsort((h, r))
            r, h, n = r[o], h[o], n[o]
            table.held_blank, table.held_same_vm, table.held_ns = r, s.pid[h] == s.pid[table.timeline[r]], n
            table.held_vcpu, table.held_vm = s.vcpu[h], s.vm[h]
        table.host_blank, table.host_holder, table.host_ns = row[~vcpu], name[~vcpu], ns[~vcpu]
