"""`vmprof steal` of a recording whose samples and sched events are read a piece at a time (record/stream.py): the
report the whole read gives, byte for byte, in memory bounded by the distinct rows and what is open at a piece's
edge, not by the samples or the sched events (docs/scale.md).

A steal report is made of the vCPUs' timelines (sched events only) and of counts of their samples.  Each piece's
sched events go first to stream_sched.SchedStream, which gives out the blanks nothing later changes: their time
by cause, who held the pCPU and type 1 over the host's span are added on in order, the steal blanks kept until
the guest samples around them are known.  Then the piece's samples: per vCPU thread its counts (guest mode, KVM
polling, exit reasons, the VMM) and, per function and per process, its samples and the steal that sat between two
of its consecutive samples.  What is open at a piece's edge is carried to the next: the key of each thread's last
guest sample, its VMM samples since then, its steal blanks whose guest sample after is still to come, and its
samples that may have caught KVM polling a halt whose polling stretch is not known yet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.analysis import Analysis, Attribution
from vmprof_tui.analyse.blanks import NO_TIME, BlankTable, Cause, steal_split
from vmprof_tui.analyse.steal import (
    VcpuCounts,
    add_holders,
    add_type1_by_cause,
    host_run_delay,
    report_of,
    vcpu_counts,
    vcpu_entry,
)
from vmprof_tui.analyse.stream import PIECE_ROWS, WholeNeeded, given_span, in_range, range_now
from vmprof_tui.analyse.stream_sched import HALT_REACH, MAX, MIN, SchedStream, select_rows
from vmprof_tui.analyse.timeline import VcpuTimeline
from vmprof_tui.analyse.vcpu_samples import inside, maybe_polled, thread_sample_ns
from vmprof_tui.collect import backends
from vmprof_tui.record.bpf_records import SCHED_DTYPE
from vmprof_tui.record.recording import KALLSYMS_KEY, Recording
from vmprof_tui.record.stream import Piece, Scanned, SchedReader, pieces
from vmprof_tui.resolve.memo import new_memo
from vmprof_tui.resolve.prepare import learn_vms, prepare, recording_end
from vmprof_tui.resolve.resolver import Resolved, Resolver

NONE = -1  # no key (no guest sample yet)


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
    # its blanks that are steal (not a halt) whose guest samples around are not all known yet, in time order: start,
    # end (MAX: still open), of type 1 (not the VMM blocked), start before a time range cut it (which blank it is)
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    type1: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    own: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    started: int = 0  # blanks whose key before is known
    ended: int = 0  # blanks whose key after is known
    # its samples that may have caught KVM polling, until the polling stretches around them are known: time, exit
    # reason (counted as polling meanwhile)
    maybe_polled: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.empty(0, np.int64), np.empty(0, np.int64)))

    def open_again(self, starts: np.ndarray, ends: np.ndarray, type1: np.ndarray, own: np.ndarray) -> None:
        """Its steal blanks closed in a piece or open at its end (those open before are among them, or were no
        blank: a switch-out after a switch-out, or one outside the time range)."""
        keyed = (self.by_function, self.by_process)
        if len(self.ends) and self.ends[-1] == MAX:  # the one open: given again, or no blank
            before = [k.before[-1] for k in keyed]
            known = self.started == len(self.ends)
            was = int(self.own[-1])
            self.starts, self.ends, self.type1, self.own = (a[:-1] for a in (self.starts, self.ends, self.type1,
                                                                             self.own))
            for k in keyed:
                k.before = k.before[:-1]
            self.started = min(self.started, len(self.ends))
            if known and len(own) and int(own[0]) == was:
                for k, b in zip(keyed, before, strict=True):
                    k.before = np.append(k.before, b)
                self.started += 1
                self.starts, self.ends, self.type1, self.own = (np.append(a, b[:1]) for a, b in zip(
                    (self.starts, self.ends, self.type1, self.own), (starts, ends, type1, own), strict=True))
                starts, ends, type1, own = starts[1:], ends[1:], type1[1:], own[1:]
        self.starts, self.ends, self.type1, self.own = (np.concatenate([a, b]) for a, b in zip(
            (self.starts, self.ends, self.type1, self.own), (starts, ends, type1, own), strict=True))
        for k in keyed:
            k.before = np.concatenate([k.before, np.full(len(starts), NONE, np.int64)])

    def forget_attributed(self) -> None:
        """Its blanks whose keys before and after are known go."""
        done = self.ended
        self.starts, self.ends, self.type1, self.own = (a[done:] for a in (self.starts, self.ends, self.type1,
                                                                           self.own))
        for k in (self.by_function, self.by_process):
            k.before = k.before[done:]
        self.started -= done
        self.ended = 0


class StreamedSteal:
    """What `vmprof steal` reads of an Analysis (VM names, steal_report), the sched events and samples read piece by
    piece: the timelines built as they come (stream_sched.SchedStream), the samples summed."""

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None,
                 piece_rows: int = PIECE_ROWS, time_range: tuple[float, float] | None = None) -> None:
        """time_range: (from, to) in seconds after the first record, as prepare's: the samples are cut to it and the
        timelines as Schedule cuts them (stream_sched.SchedStream.range_ns); the sched events are read to the end
        (_stretches)."""
        self.rec = rec = scanned.rec
        self.period_ns = 1e9 / int(rec.meta.get("frequency", 1000))
        self.backend = rec.meta.get("backend", backends.NONE)
        # the VM list's VMs and vCPU threads: one that only samples name is left to the whole read
        self.vms = learn_vms(rec, rec.samples, np.zeros(0, bool))
        self.sched = SchedStream(self.vms.vcpu_of_tid, self.vms.by_pid)
        n = len(self.sched.tids)
        # per vCPU thread (its index in sched): its blank time by cause in ns, and what its report entry reads of its
        # blanks one by one (who held its pCPU; its steal of type 1 by cause over the host's run-queue readings)
        self.splits: list[dict[Cause, float]] = [{} for _ in range(n)]
        self.who: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
        self.host_windows = [host_run_delay(rec, VcpuTimeline("", int(p), int(t), 0, 0, 0))
                             for p, t in zip(self.sched.pid.tolist(), self.sched.tids.tolist(), strict=True)]
        self.mine_then: list[dict[str, float]] = [
            {"wakeup": 0.0, "throttled": 0.0, "irq": 0.0, "preempted": 0.0} if w else {} for w in self.host_windows]
        self.threads: dict[int, _Thread] = {int(tid): _Thread() for tid in self.sched.tids.tolist()}
        self.notes: dict[str, None] = {}
        self.pieces = 0
        resolver, memo = Resolver(), new_memo()
        snapshot, processes = rec.snapshot, rec.processes()
        later = {k: v for k, v in rec.snapshot.items() if k != KALLSYMS_KEY}  # kallsyms is parsed once, by the first
        no_sched = np.empty(0, SCHED_DTYPE)
        events = SchedReader(scanned)
        lo = None
        for piece, sched, first, (hi, end), last in _stretches(scanned, piece_rows, events, time_range):
            if len(piece.samples) and int(piece.samples["time_ns"].min()) < piece.lo:
                # a sample that came a whole piece late: the carried keys would be out of the whole's order
                raise WholeNeeded("samples out of order across pieces")
            s = piece.samples
            if len(sched) and lo is not None and int(sched["time_ns"][0]) < lo:  # the same of the sched events
                raise WholeNeeded("sched events out of order across pieces")
            if time_range is not None:
                _span, s = in_range(piece, time_range, first, end)
                self.sched.range_ns = range_now(time_range, first, end)
            thread = self.sched.thread_of(s["pid"], s["tid"])
            self.sched.saw_samples(thread[thread >= 0], s["time_ns"][thread >= 0].astype(np.int64))
            step = self.sched.advance(sched, MIN if lo is None else lo, hi, last)
            lo = piece.hi
            self._blanks(step.finished)
            for i, a, z in _groups(step.steal[0]):
                self.threads[int(self.sched.tids[i])].open_again(*(c[a:z] for c in step.steal[1:]))
            given = set(step.steal[0].tolist())
            for i, t in enumerate(self.threads.values()):
                if i not in given:
                    t.open_again(*(c[:0] for c in step.steal[1:]))
            part = Recording(rec.path, rec.meta, s, no_sched, snapshot, rec.bundles, rec.object_tables,
                             rec.end, problems=list(rec.problems), fixed_processes=processes)
            prepared = prepare(part, guest_bundles, resolver, span_ns=(piece.lo, piece.hi), sched_in_order=True,
                               memo=memo)
            if prepared.vms.by_pid != self.vms.by_pid or prepared.vms.vcpu_of_tid != self.vms.vcpu_of_tid:
                raise WholeNeeded("a VM or vCPU thread that the VM list does not name")
            before = self.sched.range_ns is not None and piece.hi <= self.sched.range_ns[0]
            self._add(Analysis(prepared, shares_only=True), prepared.names, piece.hi, last, before)
            snapshot = later
            self.pieces += 1
        self.timelines = self.sched.timelines()
        # the names of each key as string ids: the resolver (its symbol tables) goes
        self.strings = resolver.strings.array()
        for t in self.threads.values():
            for keyed in (t.by_function, t.by_process):
                keyed.names = np.stack([resolver.row_names.ids(keyed.names, c) for c in NAMES])

    def _blanks(self, table: BlankTable) -> None:
        """Blanks that nothing later changes, by thread and time: into each thread's split by cause and what its
        report entry reads of them one by one (added on in order: as of all its blanks at once)."""
        if not len(table):
            return
        self.splits = steal_split(table, np.ones(len(self.splits)), self.splits)
        # as objects only the blanks those read count in (preempted; for the host's span those of a cause of type
        # 1): most are not (the VMM blocked), and each count is added in the same order without them
        window = np.array([w is not None for w in self.host_windows], bool)
        read = (table.kind == bt.PREEMPTED) | (window[table.timeline] & (
            (table.kind == bt.THROTTLED) | (table.throttled_wakeup != NO_TIME)
            | ((table.kind == bt.IDLE) & (table.wakeup != NO_TIME))))
        if not read.any():
            return
        table = select_rows(table, np.flatnonzero(read))
        for i, a, z in _groups(table.timeline):
            blanks = table.blanks(a, z)
            add_holders(self.who[i], blanks)
            if self.host_windows[i]:
                add_type1_by_cause(self.mine_then[i], blanks, *self.host_windows[i][:2])

    def _add(self, an: Analysis, names: Resolved, hi: int, last: bool, before_range: bool) -> None:
        """A piece's samples, of [.., hi) (the last piece: to the end).  before_range: the piece ends before the
        time range begins (no samples): the key before a blank cut to begin at the range's start is of the samples
        to come."""
        self.notes.update(dict.fromkeys(an.notes))
        s = an.samples
        vm_code = an.vm_code.astype(np.int64) << 32
        function_key, process_key = vm_code | names.name_code, vm_code | names.proc_code
        positions = an.vcpus.positions
        none = np.empty(0, np.int64)
        for i, t in enumerate(self.threads.values()):
            idx = positions.get(int(self.sched.keys[i]), none)
            times = s["time_ns"][idx].astype(np.int64)
            guest = an.is_guest[idx]
            if len(idx):
                maybe = idx[maybe_polled(s["flags"][idx], guest)]
                t.counts.add(vcpu_counts(an, idx, maybe))  # as polling until known
                t.maybe_polled = tuple(np.concatenate([a, b]) for a, b in zip(
                    t.maybe_polled, (s["time_ns"][maybe].astype(np.int64), s["exit_reason"][maybe].astype(np.int64)),
                    strict=True))
            self._settle_polled(i, t, hi, last)
            if before_range:
                continue
            sel = idx[guest]
            vmm_before = np.searchsorted(sel, idx[~guest]) - 1
            began = len(t.starts)  # every blank in the queue began by the end of this piece
            for keyed, keys in ((t.by_function, function_key), (t.by_process, process_key)):
                _attribute(t, keyed, keys[sel], times[guest], vmm_before, began)
                if len(sel):
                    keyed.settle(keys[sel], names.name_code[sel])
            t.started = began
            if len(sel):
                t.ended = int(np.searchsorted(t.ends, times[guest][-1], side="right"))
            t.forget_attributed()

    def _settle_polled(self, i: int, t: _Thread, hi: int, last: bool) -> None:
        """The samples of thread i that may have caught KVM polling and whose polling stretches are known now:
        those outside every stretch were KVM handling an exit (VcpuSamples.polling_samples)."""
        times, reasons = t.maybe_polled
        sched = self.sched
        if not sched.has_wake[i]:  # no record of its halts (yet): all of them polling, if none comes
            if last:
                t.maybe_polled = (times[:0], reasons[:0])
            return
        known = times < max(sched.polling_known_before(i), hi - HALT_REACH + 1) if not last else times >= MIN
        out = known & ~inside(times, sched.poll_iv[i])
        t.counts.polling -= int(np.count_nonzero(out))
        for reason, n in zip(*np.unique(reasons[out], return_counts=True), strict=True):
            t.counts.exits[int(reason)] = t.counts.exits.get(int(reason), 0) + int(n)
        t.maybe_polled = (times[~known], reasons[~known])
        sched.forget_polls(i, min(hi, int(times[~known].min(initial=hi))))

    # -- what `vmprof steal` reads ------------------------------------------------------------------------
    def vm_names(self) -> list[str]:
        return sorted(set(self.vms.by_pid.values()), key=lambda n: self.vms.index.get(n, 0))

    def steal_report(self, vm: str) -> dict:
        """steal.steal_report of the whole recording."""
        vcpus, functions, processes = [], [], []
        index = {int(tid): i for i, tid in enumerate(self.sched.tids.tolist())}
        for tl in sorted((tl for tl in self.timelines.values() if tl.vm == vm), key=lambda t: t.vcpu):
            i = index[tl.tid]
            t = self.threads[tl.tid]
            c = t.counts
            exact = int(self.sched.poll_ns[i]) if self.sched.has_wake[i] else None
            period = thread_sample_ns(c.samples, tl.on_cpu_ns, c.polling, exact, self.period_ns)
            poll_ns = float(c.polling) * period if exact is None else float(exact)
            vcpus.append(vcpu_entry(self.rec, self.backend, tl, c, period, self.splits[i], poll_ns,
                                    (self.who[i], self.mine_then[i])))
            functions += _attributions(t.by_function, tl.vcpu, period, self.strings, True)
            processes += _attributions(t.by_process, tl.vcpu, period, self.strings, False)
        return report_of(vm, vcpus, sorted(processes, key=lambda a: -a.apparent_ns),
                         sorted(functions, key=lambda a: -a.apparent_ns), list(self.notes))


def _groups(thread: np.ndarray) -> list[tuple[int, int, int]]:
    """(thread, first row, end row) of each thread's rows (grouped by thread)."""
    if not len(thread):
        return []
    at = np.flatnonzero(np.diff(thread)) + 1
    a = np.concatenate([[0], at])
    z = np.append(at, len(thread))
    return list(zip(thread[a].tolist(), a.tolist(), z.tolist(), strict=True))


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


def _stretches(scanned: Scanned, piece_rows: int, events: SchedReader, time_range: tuple[float, float] | None
               ) -> Iterator[tuple[Piece, np.ndarray, int, tuple[int, int | None], bool]]:
    """Each piece of samples with the sched events before its end, the recording's first record, where the
    stretch ends and the recording's end (known at its last piece, else None), and whether it is the last.  With a
    time range, once a piece reaches past the range's end no more samples are read: the rest of the sched events
    come in stretches of the pieces' mean length (or to the next event) with no samples (the whole read counts
    every halt of a vCPU and its IRQ time while running over the whole recording), the last one ending after every
    record it gives."""
    def end_of(first: int, last: int) -> int:
        return recording_end(first, last, scanned.rec.end)

    read = pieces(scanned, piece_rows, end_of, False)
    first_sample: int | None = None
    count = 0
    for piece, last in _with_last(read):
        first_sample = piece.lo if first_sample is None else first_sample
        sched = events.until(None if last else piece.hi)
        first = min(t for t in (first_sample, events.first) if t is not None)
        count += 1
        if last:  # the recording's end, of its samples and sched events (prepare.recording_span)
            times = [t for t in (first_sample, events.first, int(piece.samples["time_ns"].max(initial=0)),
                                 events.last) if t is not None]
            end = end_of(min(times), max(times))
            yield piece, sched, first, (end, end), True
            return
        yield piece, sched, first, (piece.hi, None), False
        if time_range is not None and piece.hi > given_span(time_range, first)[1]:
            read.close()  # its reader thread and file
            break
    else:
        return
    lo, mean = piece.hi, max((piece.hi - first) // count, 1)
    no_samples = piece.samples[:0]
    while True:
        # to the next event at least: a gap with none (a hostile timestamp far out) is one stretch, not many
        after = events.next_time()
        if after is not None and after >= MAX:  # past the int64 clock the stretches end on
            raise WholeNeeded("a sched event after 2^63 ns")
        hi = lo + mean if after is None else max(lo + mean, after + 1)
        sched = events.until(hi)
        last = events.done()
        yield Piece(lo, hi, no_samples, sched[:0], sched[:0]), sched, first, (hi, None), last
        if last:
            return
        lo = hi


def _with_last(items: Iterator[Piece]) -> Iterator[tuple[Piece, bool]]:
    """Each piece, and whether it is the last."""
    held = next(items, None)
    for item in items:
        yield held, False
        held = item
    if held is not None:
        yield held, True

