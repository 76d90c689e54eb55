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

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.analysis import Analysis, Attribution
from vmprof_tui.analyse.blanks import steal_split
from vmprof_tui.analyse.steal import VcpuCounts, report_of, vcpu_counts, vcpu_entry
from vmprof_tui.analyse.stream import PIECE_ROWS, WholeNeeded
from vmprof_tui.analyse.timeline import Schedule, VcpuTimeline
from vmprof_tui.analyse.vcpu_samples import exact_poll_ns, polled, thread_sample_ns
from vmprof_tui.collect import backends
from vmprof_tui.record import recording as fmt
from vmprof_tui.record.bpf_records import SCHED_NOT_SWITCH
from vmprof_tui.record.recording import KALLSYMS_KEY, Recording
from vmprof_tui.record.stream import Piece, Scanned, _ordered_sched, _read_group, pieces
from vmprof_tui.resolve.memo import new_memo
from vmprof_tui.resolve.prepare import learn_vms, prepare, recording_end
from vmprof_tui.resolve.resolver import Resolved, Resolver

NONE = -1  # no key (no guest sample yet)


def _add(table: dict[int, int], keys: np.ndarray, values: np.ndarray | None = None) -> None:
    """Counts (or the sums of integer `values`) by key into `table`."""
    if not len(keys):
        return
    u, inverse = np.unique(keys, return_inverse=True)
    weights = None if values is None else values.astype(np.int64)
    n = np.bincount(inverse.reshape(-1), weights, len(u))
    for k, c in zip(u.tolist(), n.astype(np.int64).tolist(), strict=True):
        table[k] = table.get(k, 0) + c


@dataclass
class _Keyed:
    """One vCPU thread's guest samples grouped by a key (VM and function, or VM and process: the resolver's codes)
    over the pieces so far: samples, the steal between two consecutive samples of one key (integer ns, all of it
    and of type 1), the VMM samples between two of them, and the names of each key's first sample."""
    samples: dict[int, int] = field(default_factory=dict)
    steal: dict[int, int] = field(default_factory=dict)
    steal_type1: dict[int, int] = field(default_factory=dict)
    vmm: dict[int, int] = field(default_factory=dict)
    names: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    last: int = NONE  # the key of the thread's last guest sample
    pending_vmm: int = 0  # its VMM samples since then
    before: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # per steal blank: the key before it

    def add_names(self, keys: np.ndarray, an: Analysis, sel: np.ndarray, functions: bool) -> None:
        """The names of the keys not seen before, from their first samples (sel: the samples of `keys`)."""
        u, first = np.unique(keys, return_index=True)
        new = np.array([j for j, k in enumerate(u.tolist()) if k not in self.names], np.int64)
        i = sel[first[new]]
        blank = [""] * len(new)
        func, module = (an.func[i].tolist(), an.module[i].tolist()) if functions else (blank, blank)
        for k, p, f, m in zip(u[new].tolist(), an.process[i].tolist(), func, module, strict=True):
            self.names[k] = (str(p), str(f), str(m))


@dataclass
class _Thread:
    """A vCPU thread over the pieces so far."""
    counts: VcpuCounts = field(default_factory=VcpuCounts)
    first_ns: int | None = None  # its first and last sample
    last_ns: int = 0
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
        sched = _read_sched(scanned)
        not_switch = (sched["flags"] & SCHED_NOT_SWITCH) != 0
        self.switches, self.wake_events = sched[~not_switch], sched[not_switch]
        # the VM list's VMs and vCPU threads: one that only samples name is left to the whole read
        self.vms = learn_vms(rec, rec.samples, np.zeros(0, bool))
        # the blanks and polling stretches of every listed vCPU thread (each given a sample, so that every one has
        # a timeline); their ends at the recording's end are not known yet, nor needed (no sample comes after)
        first = int(sched["time_ns"][0]) if len(sched) else 0
        keys = [pid << 32 | tid for tid, (pid, _v) in self.vms.vcpu_of_tid.items()]
        early = self._timelines((first, np.iinfo(np.int64).max // 2), dict.fromkeys(keys, (first, first)), True)
        self.threads: dict[int, _Thread] = {}
        for tl in early.values():
            t = self.threads[tl.tid] = _Thread()
            table, (lo, hi) = tl.table, tl.rows
            steal = lo + np.flatnonzero(table.kind[lo:hi] != bt.IDLE)
            t.starts, t.ends, t.type1 = table.start[steal], table.end[steal], table.kind[steal] != bt.BLOCKED
            t.by_function.before = np.full(len(steal), NONE, np.int64)
            t.by_process.before = np.full(len(steal), NONE, np.int64)
        self.notes: dict[str, None] = {}
        self.pieces = 0
        times = [int(sched["time_ns"][0]), int(sched["time_ns"][-1])] if len(sched) else []
        resolver, memo = Resolver(), new_memo()
        snapshot, processes = rec.snapshot, rec.processes()
        later = {k: v for k, v in rec.snapshot.items() if k != KALLSYMS_KEY}  # kallsyms is parsed once, by the first
        for piece, last in _with_last(pieces(scanned, piece_rows, lambda a, b: recording_end(a, b, rec.end))):
            if len(piece.samples) and int(piece.samples["time_ns"].min()) < piece.lo:
                # a sample that came a whole piece late: the carried keys would be out of the whole's order
                raise WholeNeeded("samples out of order across pieces")
            part = Recording(rec.path, rec.meta, piece.samples, sched[:0], snapshot, rec.bundles, rec.object_tables,
                             rec.end, problems=list(rec.problems), fixed_processes=processes)
            prepared = prepare(part, guest_bundles, resolver, span_ns=(piece.lo, piece.hi), sched_in_order=True,
                               memo=memo)
            if prepared.vms.by_pid != self.vms.by_pid or prepared.vms.vcpu_of_tid != self.vms.vcpu_of_tid:
                raise WholeNeeded("a VM or vCPU thread that the VM list does not name")
            self._add(Analysis(prepared, shares_only=True), prepared.names, early, piece.hi, last)
            if len(piece.samples):
                t = piece.samples["time_ns"]
                times += [int(t.min()), int(t.max())]
            snapshot = later
            self.pieces += 1
        del early  # its blanks: the final timelines hold their own
        spans = {key: (t.first_ns, t.last_ns) for key, t in
                 ((pid << 32 | tid, self.threads.get(tid)) for tid, (pid, _v) in self.vms.vcpu_of_tid.items())
                 if t is not None and t.first_ns is not None}
        span = (min(times), recording_end(min(times), max(times), rec.end)) if times else (0, 0)
        self.timelines = self._timelines(span, spans, False)
        table = next(iter(self.timelines.values())).table if self.timelines else None
        splits = steal_split(table, np.ones(len(self.timelines))) if table is not None else []
        self.splits = dict(zip(self.timelines, splits, strict=True))

    def _timelines(self, span: tuple[int, int], spans: dict[int, tuple[int, int]],
                   shares_only: bool) -> dict[int, VcpuTimeline]:
        """The timelines of the whole recording (Schedule.timelines), each thread's samples given by its first and
        last (all that the timelines read of them)."""
        schedule = Schedule(self.switches, self.wake_events, self.vms.vcpu_of_tid, self.vms.by_pid, span, None,
                            shares_only)
        times = np.array([t for pair in spans.values() for t in pair], np.int64)
        positions = {key: np.array([2 * i, 2 * i + 1]) for i, key in enumerate(spans)}
        return schedule.timelines(positions, times)

    def _add(self, an: Analysis, names: Resolved, early: dict[int, VcpuTimeline], hi: int, last: bool) -> None:
        """A piece's samples, of [.., hi) (the last piece: to the end)."""
        self.notes.update(dict.fromkeys(an.notes))
        s = an.samples
        vm_code = an.vm_code.astype(np.int64) << 32
        function_key, process_key = vm_code | names.name_code, vm_code | names.proc_code
        positions = an.vcpus.positions
        none = np.empty(0, np.int64)
        for tl in early.values():
            t = self.threads[tl.tid]
            idx = positions.get(tl.pid << 32 | tl.tid, none)
            times = s["time_ns"][idx].astype(np.int64)
            guest = an.is_guest[idx]
            if len(idx):
                t.first_ns = int(times[0]) if t.first_ns is None else t.first_ns
                t.last_ns = int(times[-1])
                t.counts.add(vcpu_counts(an, idx, idx[polled(times, s["flags"][idx], guest, tl)]))
            sel = idx[guest]
            vmm_before = np.searchsorted(sel, idx[~guest]) - 1
            # its blanks that began in this piece: the key of the guest sample before each is known now
            began = len(t.starts) if last else int(np.searchsorted(t.starts, hi))
            for keyed, keys in ((t.by_function, function_key), (t.by_process, process_key)):
                if len(sel):
                    keyed.add_names(keys[sel], an, sel, keyed is t.by_function)
                _attribute(t, keyed, keys[sel], times[guest], vmm_before, began)
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
            vcpus.append(vcpu_entry(self.rec, self.backend, tl, c, period, self.splits[tl.tid], poll_ns))
            functions += _attributions(t.by_function, tl.vcpu, period)
            processes += _attributions(t.by_process, tl.vcpu, period)
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
        _add(keyed.steal, after[same], dur[same])
        type1 = same & t.type1[t.ended:done]
        _add(keyed.steal_type1, after[type1], dur[type1])
    # VMM samples: after the carried last guest sample (up to this piece's first), between two of this piece's,
    # and after its last (carried on)
    if keyed.pending_vmm and keyed.last == keys[0]:
        keyed.vmm[int(keys[0])] = keyed.vmm.get(int(keys[0]), 0) + keyed.pending_vmm
    prev = np.where(vmm_before >= 0, keys[vmm_before.clip(0)], keyed.last)
    has_next = vmm_before + 1 < len(keys)
    nxt = keys[(vmm_before + 1).clip(0, len(keys) - 1)]
    _add(keyed.vmm, prev[has_next & (prev == nxt) & (prev != NONE)])
    keyed.pending_vmm = int(np.count_nonzero(~has_next))
    _add(keyed.samples, keys)
    keyed.last = int(keys[-1])


def _attributions(keyed: _Keyed, vcpu: int, ns_per_sample: float) -> list[Attribution]:
    """steal.attributions of one vCPU from its sums, by key (VM, then the resolver's code: the whole read's order),
    the steal added up as the whole read adds it (the blanks' integer ns, then each VMM sample's time in turn)."""
    out = []
    for k in sorted(keyed.samples):
        steal = np.array([float(keyed.steal.get(k, 0))])
        np.add.at(steal, np.zeros(keyed.vmm.get(k, 0), np.int64), ns_per_sample)
        c = keyed.samples[k]
        out.append(Attribution(*keyed.names[k], vcpu, c, c * ns_per_sample,
                               float(steal[0]), float(keyed.steal_type1.get(k, 0))))
    return out


def _with_last(items: Iterator[Piece]) -> Iterator[tuple[Piece, bool]]:
    """Each piece, and whether it is the last."""
    held = next(items, None)
    for item in items:
        yield held, False
        held = item
    if held is not None:
        yield held, True


def _read_sched(scanned: Scanned) -> np.ndarray:
    """Every sched event of the recording, in prepare's order."""
    fd = os.open(scanned.rec.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _samples, sched = _read_group(fd, [c for c in scanned.chunks if c.kind == fmt.SCHED])
    finally:
        os.close(fd)
    return _ordered_sched(sched)
