"""`vmprof steal` of a recording whose samples are read a piece at a time (record/stream.py): the report the whole
read gives, byte for byte, in memory bounded by the sched events and the distinct rows, not by the samples
(docs/scale.md).

A steal report is made of the vCPUs' timelines (sched events only) and of counts of their samples.  The sched
events are read whole (the synthetic 64-CPU host switches 7 times less often than it is sampled at 1 kHz) and the
timelines built from them by the code the whole read runs (timeline.Schedule), so every blank, with its wake-up,
throttling, IRQ time, holders and co-stop, is the whole read's.  The samples then pass a piece at a time: per vCPU
thread its counts (guest mode, KVM polling, exit reasons, the VMM) and, per function and per process, its samples
and the steal that sat between two of its consecutive samples.  What is open at a piece's edge is carried to the
next: the key of each thread's last guest sample, its VMM samples since then, and its blanks whose guest sample
after is still to come.

The blanks and polling stretches are known before the samples (the steal between two samples needs the blanks;
polling, the stretches); the timelines' spans (each thread's first and last sample, the recording's end) after
them: the timelines are built a second time then, as the whole read builds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.analysis import Analysis, Attribution
from vmprof_tui.analyse.blanks import Cause, steal_split
from vmprof_tui.analyse.steal import VcpuCounts, blank_parts, report_of, vcpu_counts, vcpu_entry
from vmprof_tui.analyse.stream import PIECE_ROWS, WholeNeeded
from vmprof_tui.analyse.timeline import Schedule, VcpuTimeline
from vmprof_tui.analyse.vcpu_samples import exact_poll_ns, polled, thread_sample_ns
from vmprof_tui.arrays import rank_among
from vmprof_tui.collect import backends
from vmprof_tui.record.bpf_records import SCHED_DTYPE, SCHED_NOT_SWITCH
from vmprof_tui.record.recording import KALLSYMS_KEY, Recording
from vmprof_tui.record.stream import Piece, Scanned, pieces, read_sched, sample_tables
from vmprof_tui.resolve.memo import new_memo
from vmprof_tui.resolve.prepare import learn_vms, prepare, recording_end
from vmprof_tui.resolve.resolver import Resolved, Resolver

NONE = -1  # no key (no guest sample yet)
VMS_AT_ONCE = 4  # VMs whose timelines are built at once


SAMPLES, STEAL, STEAL_TYPE1, VMM = range(4)  # the sums kept per key
NAMES = ("process", "func", "module")


@dataclass
class _Keyed:
    """One vCPU thread's guest samples grouped by a key (VM and function, or VM and process: the resolver's codes)
    over the pieces so far, as arrays by key (ascending): samples, the steal between two consecutive samples of one
    key (integer ns, all of it and of type 1), the VMM samples between two of them; and a name code of each key's
    samples (the resolver's RowNames: its names; once the pieces are done, the string ids of its process, function
    and module)."""
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    sums: np.ndarray = field(default_factory=lambda: np.zeros((4, 0), np.int64))  # SAMPLES, STEAL, ...
    names: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    last: int = NONE  # the key of the thread's last guest sample
    pending_vmm: int = 0  # its VMM samples since then
    before: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # per steal blank: the key before it
    _added: list[tuple[int, np.ndarray, np.ndarray | None]] = field(default_factory=list)

    def add(self, column: int, keys: np.ndarray, values: np.ndarray | None = None) -> None:
        """Counts (or the sums of integer `values`) by key to one of the sums (added by settle)."""
        if len(keys):
            self._added.append((column, keys, values))

    def settle(self, keys: np.ndarray, codes: np.ndarray) -> None:
        """The piece's sums added: `keys` and `codes` are its guest samples' keys and name codes (a key new in the
        piece is among them)."""
        u, first = np.unique(keys, return_index=True)
        at = np.searchsorted(self.keys, u)
        new = at >= len(self.keys)
        new[~new] = self.keys[at[~new]] != u[~new]
        if new.any():
            self.keys = np.insert(self.keys, at[new], u[new])
            self.names = np.insert(self.names, at[new], codes[first[new]])
            self.sums = np.insert(self.sums, at[new], 0, axis=1)
        for column, k, v in self._added:
            np.add.at(self.sums[column], np.searchsorted(self.keys, k), 1 if v is None else v.astype(np.int64))
        self._added.clear()


@dataclass
class _Thread:
    """A vCPU thread over the pieces so far."""
    counts: VcpuCounts = field(default_factory=VcpuCounts)
    by_function: _Keyed = field(default_factory=_Keyed)
    by_process: _Keyed = field(default_factory=_Keyed)
    # its blanks that are steal (not a halt), in time order: start, end, of type 1 (not the VMM blocked)
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    type1: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    started: int = 0  # blanks whose key before is known
    ended: int = 0  # blanks whose key after is known


class StreamedSteal:
    """What `vmprof steal` reads of an Analysis (VM names, steal_report), the samples summed piece by piece."""

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None,
                 piece_rows: int = PIECE_ROWS) -> None:
        self.rec = rec = scanned.rec
        self.period_ns = 1e9 / int(rec.meta.get("frequency", 1000))
        self.backend = rec.meta.get("backend", backends.NONE)
        # the VM list's VMs and vCPU threads: one that only samples name is left to the whole read
        self.vms = learn_vms(rec, rec.samples, np.zeros(0, bool))
        # per vCPU thread id with a timeline (one without has no sample): its blank time by cause in ns, what its
        # report entry reads of its blanks one by one, and its samples' sums
        self.splits: dict[int, dict[Cause, float]] = {}
        self.parts: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        self.threads: dict[int, _Thread] = {}
        self.timelines = self._timelines(scanned, piece_rows)
        self.notes: dict[str, None] = {}
        self.pieces = 0
        resolver, memo = Resolver(), new_memo()
        snapshot, processes = rec.snapshot, rec.processes()
        later = {k: v for k, v in rec.snapshot.items() if k != KALLSYMS_KEY}  # kallsyms is parsed once, by the first
        no_sched = np.empty(0, SCHED_DTYPE)
        for piece, last in _with_last(pieces(scanned, piece_rows, lambda a, b: recording_end(a, b, rec.end), False)):
            if len(piece.samples) and int(piece.samples["time_ns"].min()) < piece.lo:
                # a sample that came a whole piece late: the carried keys would be out of the whole's order
                raise WholeNeeded("samples out of order across pieces")
            part = Recording(rec.path, rec.meta, piece.samples, no_sched, snapshot, rec.bundles, rec.object_tables,
                             rec.end, problems=list(rec.problems), fixed_processes=processes)
            prepared = prepare(part, guest_bundles, resolver, span_ns=(piece.lo, piece.hi), sched_in_order=True,
                               memo=memo)
            if prepared.vms.by_pid != self.vms.by_pid or prepared.vms.vcpu_of_tid != self.vms.vcpu_of_tid:
                raise WholeNeeded("a VM or vCPU thread that the VM list does not name")
            self._add(Analysis(prepared, shares_only=True), prepared.names, piece.hi, last)
            snapshot = later
            self.pieces += 1
        # the names of each key as string ids: the resolver (its symbol tables) goes
        self.strings = resolver.strings.array()
        for t in self.threads.values():
            for keyed in (t.by_function, t.by_process):
                keyed.names = np.stack([resolver.row_names.ids(keyed.names, c) for c in NAMES])

    def _timelines(self, scanned: Scanned, rows: int) -> dict[int, VcpuTimeline]:
        """The timelines of the whole recording, as the whole read builds them (Schedule.timelines), once, before
        the samples are analysed: of the samples they read only each vCPU thread's first and last and the
        recording's first and last, found by a look at the samples first.  The sched events are let go after."""
        keys = np.array(sorted({pid << 32 | tid for tid, (pid, _v) in self.vms.vcpu_of_tid.items()}), np.int64)
        first = np.full(len(keys), np.iinfo(np.int64).max)
        last = np.full(len(keys), np.iinfo(np.int64).min)
        times = []
        for samples in sample_tables(scanned, rows):
            if not len(samples):
                continue
            t = samples["time_ns"].astype(np.int64)
            times += [int(t.min()), int(t.max())]
            if len(keys):
                _keys, rank, found = rank_among(samples["pid"].astype(np.int64) << 32 | samples["tid"], keys)
                np.minimum.at(first, rank[found], t[found])
                np.maximum.at(last, rank[found], t[found])
        sched = read_sched(scanned)
        if len(sched):
            times += [int(sched["time_ns"][0]), int(sched["time_ns"][-1])]
        not_switch = (sched["flags"] & SCHED_NOT_SWITCH) != 0
        switches, wake_events = sched[~not_switch], sched[not_switch]
        del sched, not_switch
        span = (min(times), recording_end(min(times), max(times), self.rec.end)) if times else (0, 0)
        seen = np.flatnonzero(first <= last).tolist()
        positions = {int(keys[i]): np.array([2 * j, 2 * j + 1]) for j, i in enumerate(seen)}
        sample_times = np.stack([first[seen], last[seen]], axis=1).reshape(-1)
        # a few VMs at a time: the memory of building them is of their vCPUs' switches, not all
        out: dict[int, VcpuTimeline] = {}
        pids = sorted({pid for pid, _v in self.vms.vcpu_of_tid.values()})
        for at in range(0, len(pids), VMS_AT_ONCE):
            mine = set(pids[at:at + VMS_AT_ONCE])
            only = frozenset(tid for tid, (pid, _v) in self.vms.vcpu_of_tid.items() if pid in mine)
            timelines = Schedule(switches, wake_events, self.vms.vcpu_of_tid, self.vms.by_pid, span, None,
                                 only=only).timelines(positions, sample_times)
            if timelines:
                table = next(iter(timelines.values())).table
                self.splits.update(zip(timelines, steal_split(table, np.ones(len(timelines))), strict=True))
            for tl in timelines.values():
                self._keep(tl)
            out.update(timelines)
        return dict(sorted(out.items()))

    def _keep(self, tl: VcpuTimeline) -> None:
        """What is read of a timeline's blanks: its blanks that are steal (start, end, of type 1: the samples are
        set against them) and what its report entry reads of them one by one; then its blanks go."""
        t = self.threads[tl.tid] = _Thread()
        table, (lo, hi) = tl.table, tl.rows
        steal = lo + np.flatnonzero(table.kind[lo:hi] != bt.IDLE)
        t.starts, t.ends, t.type1 = table.start[steal], table.end[steal], table.kind[steal] != bt.BLOCKED
        t.by_function.before = np.full(len(steal), NONE, np.int64)
        t.by_process.before = np.full(len(steal), NONE, np.int64)
        self.parts[tl.tid] = blank_parts(self.rec, tl)
        tl.forget_blanks()
        tl.table = None  # the table of its VMs' blanks goes with the last of them

    def _add(self, an: Analysis, names: Resolved, hi: int, last: bool) -> None:
        """A piece's samples, of [.., hi) (the last piece: to the end)."""
        self.notes.update(dict.fromkeys(an.notes))
        s = an.samples
        vm_code = an.vm_code.astype(np.int64) << 32
        function_key, process_key = vm_code | names.name_code, vm_code | names.proc_code
        positions = an.vcpus.positions
        none = np.empty(0, np.int64)
        for tl in self.timelines.values():
            t = self.threads[tl.tid]
            idx = positions.get(tl.pid << 32 | tl.tid, none)
            times = s["time_ns"][idx].astype(np.int64)
            guest = an.is_guest[idx]
            if len(idx):
                t.counts.add(vcpu_counts(an, idx, idx[polled(times, s["flags"][idx], guest, tl)]))
            sel = idx[guest]
            vmm_before = np.searchsorted(sel, idx[~guest]) - 1
            # its blanks that began in this piece: the key of the guest sample before each is known now
            began = len(t.starts) if last else int(np.searchsorted(t.starts, hi))
            for keyed, keys in ((t.by_function, function_key), (t.by_process, process_key)):
                _attribute(t, keyed, keys[sel], times[guest], vmm_before, began)
                if len(sel):
                    keyed.settle(keys[sel], names.name_code[sel])
            t.started = began
            if len(sel):
                t.ended = int(np.searchsorted(t.ends, times[guest][-1], side="right"))

    # -- what `vmprof steal` reads ------------------------------------------------------------------------
    def vm_names(self) -> list[str]:
        return sorted(set(self.vms.by_pid.values()), key=lambda n: self.vms.index.get(n, 0))

    def steal_report(self, vm: str) -> dict:
        """steal.steal_report of the whole recording."""
        vcpus, functions, processes = [], [], []
        for tl in sorted((tl for tl in self.timelines.values() if tl.vm == vm), key=lambda t: t.vcpu):
            t = self.threads.get(tl.tid, _Thread())
            c = t.counts
            exact = exact_poll_ns(tl)
            period = thread_sample_ns(c.samples, tl.on_cpu_ns, c.polling, exact, self.period_ns)
            poll_ns = float(c.polling) * period if exact is None else float(exact)
            vcpus.append(vcpu_entry(self.rec, self.backend, tl, c, period, self.splits[tl.tid], poll_ns,
                                    self.parts[tl.tid]))
            functions += _attributions(t.by_function, tl.vcpu, period, self.strings, True)
            processes += _attributions(t.by_process, tl.vcpu, period, self.strings, False)
        return report_of(vm, vcpus, sorted(processes, key=lambda a: -a.apparent_ns),
                         sorted(functions, key=lambda a: -a.apparent_ns), list(self.notes))


def _attribute(t: _Thread, keyed: _Keyed, keys: np.ndarray, times: np.ndarray, vmm_before: np.ndarray,
               began: int) -> None:
    """A piece's guest samples of a thread (their keys and times, in time order) and where its VMM samples fall
    among them (the index of the guest sample before each, -1: none in the piece) into `keyed`, as
    steal.attributions counts them over the whole recording: a blank's steal goes to the key of the guest samples
    before and after it when it is the same, and so does a VMM sample's time.  The thread's blanks up to `began`
    began in this piece or before."""
    # the key before each blank that began in this piece: of the last guest sample at or before its start
    at = np.searchsorted(times, t.starts[t.started:began], side="right") - 1
    keyed.before[t.started:began] = np.where(at >= 0, keys[at.clip(0)], keyed.last) if len(keys) else keyed.last
    if not len(keys):
        keyed.pending_vmm += len(vmm_before)
        return
    # the blanks that end by the last guest sample have their key after in this piece: the first at or after
    done = int(np.searchsorted(t.ends, times[-1], side="right"))
    if done > t.ended:
        after = keys[np.searchsorted(times, t.ends[t.ended:done], side="left")]
        before = keyed.before[t.ended:done]
        same = (before == after) & (before != NONE)
        dur = (t.ends - t.starts)[t.ended:done]
        keyed.add(STEAL, after[same], dur[same])
        type1 = same & t.type1[t.ended:done]
        keyed.add(STEAL_TYPE1, after[type1], dur[type1])
    # VMM samples: after the carried last guest sample (up to this piece's first), between two of this piece's,
    # and after its last (carried on)
    if keyed.pending_vmm and keyed.last == keys[0]:
        keyed.add(VMM, keys[:1], np.array([keyed.pending_vmm]))
    prev = np.where(vmm_before >= 0, keys[vmm_before.clip(0)], keyed.last)
    has_next = vmm_before + 1 < len(keys)
    nxt = keys[(vmm_before + 1).clip(0, len(keys) - 1)]
    keyed.add(VMM, prev[has_next & (prev == nxt) & (prev != NONE)])
    keyed.pending_vmm = int(np.count_nonzero(~has_next))
    keyed.add(SAMPLES, keys)
    keyed.last = int(keys[-1])


def _attributions(keyed: _Keyed, vcpu: int, ns_per_sample: float, strings: np.ndarray,
                  functions: bool) -> list[Attribution]:
    """steal.attributions of one vCPU from its sums, by key (VM, then the resolver's code: the whole read's order),
    the steal added up as the whole read adds it (the blanks' integer ns, then each VMM sample's time in turn)."""
    process, func, module = (strings[ids].tolist() for ids in keyed.names) if len(keyed.keys) else ([], [], [])
    if not functions:
        func = module = [""] * len(keyed.keys)
    out = []
    for p, f, m, (c, steal_ns, type1_ns, vmm) in zip(process, func, module, keyed.sums.T.tolist(), strict=True):
        steal = np.array([float(steal_ns)])
        np.add.at(steal, np.zeros(vmm, np.int64), ns_per_sample)
        out.append(Attribution(p, f, m, vcpu, c, c * ns_per_sample, float(steal[0]), float(type1_ns)))
    return out


def _with_last(items: Iterator[Piece]) -> Iterator[tuple[Piece, bool]]:
    """Each piece, and whether it is the last."""
    held = next(items, None)
    for item in items:
        yield held, False
        held = item
    if held is not None:
        yield held, True

