"""One pass over a recording, a piece at a time, into summaries that add: the profiles of `vmprof report` in memory
bounded by the distinct rows, not by the samples (docs/scale.md).

Each piece of the recording (record/stream.py) is prepared and analysed on its own, with the last switch of each
CPU and vCPU thread before it (timeline.SwitchContext, as the live screen's chunks) and the first switch of each
thread after it; what the level asked for needs of it is summed in samples and nanoseconds, and the piece is let
go.  The profiles made from the sums are those Analysis.host_profile and guest_profile make of the whole
recording: the same rows, in the same order, with the same samples and shares (the virtual samples of blank time
are priced once, from the summed nanoseconds, equal to the whole's up to float rounding).

A recording of one piece is analysed whole (cli/common.py load_streamed): what is small costs nothing new.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import analysis
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.row_table import RowTable
from vmprof_tui.analyse.shares import GuestParts, HostParts, Profile, Row, RowCounts
from vmprof_tui.analyse.timeline import SwitchContext
from vmprof_tui.analyse.vcpu_samples import thread_sample_ns
from vmprof_tui.record.bpf_records import SAMPLE_GUEST_KERNEL, SCHED_NOT_SWITCH
from vmprof_tui.record.recording import KALLSYMS_KEY, STACKS, USTACKS, Recording
from vmprof_tui.record.stream import Piece, Scanned, WholeNeeded, pieces
from vmprof_tui.resolve.memo import new_memo
from vmprof_tui.resolve.prepare import learn_vms, prepare, recording_end
from vmprof_tui.resolve.resolver import Resolver, RowNames

INT32_MAX = (1 << 31) - 1
PIECE_ROWS = 1 << 18  # samples analysed at once (docs/scale.md: the peak memory of a piece against its time)


class _Rows:
    """A profile's function rows summed so far: samples, and of them those in kernel mode (Row.kernel: the ratios
    of a filtered profile are made of it), by the resolver's name codes."""

    def __init__(self, rows: RowCounts | None = None, kernel: RowCounts | None = None) -> None:
        self._all = rows if rows is not None else _empty_rows()
        self._kernel = kernel if kernel is not None else _empty_rows()
        self._pending: list[tuple[RowCounts, RowCounts | None]] = []

    def add(self, rows: RowCounts, kernel: RowCounts | None) -> None:
        # kept aside until read or settled: merging copies the sums, which the loop does once the piece the rows
        # came from is let go (its peak is then not the piece's plus the copy)
        self._pending.append((rows, kernel))

    def settle(self) -> None:
        """The rows added so far merged into the sums (no sort of them again: 150 pieces of a host of 900,000
        rows); rows that cancel out (_add_idle) are dropped at the end (StreamedAnalysis.row_columns)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._all = self._all.plus(RowCounts.combine([rows for rows, _kernel in pending]))
            if kernels := [kernel for _rows, kernel in pending if kernel is not None]:
                self._kernel = self._kernel.plus(RowCounts.combine(kernels))

    @property
    def all(self) -> RowCounts:
        self.settle()
        return self._all

    @property
    def kernel(self) -> RowCounts:
        self.settle()
        return self._kernel

    @staticmethod
    def joined(parts: list[_Rows]) -> _Rows:
        return _Rows(RowCounts.combine([p.all for p in parts]), RowCounts.combine([p.kernel for p in parts]))


class _RowsByCode:
    """_Rows for the host, whose rows are most of the names: summed in arrays indexed by name code, added to in
    place (arrays.longer: in the same pages while they have room), not sorted codes and counts merged into a copy
    each piece.  int32 while every count added is whole and their magnitudes sum below 2**31 (no sum can then
    overflow), else float64."""

    def __init__(self) -> None:
        self._sums = [np.zeros(0, np.int32), np.zeros(0, np.int32)]  # all, kernel
        self._int32_room = [INT32_MAX, INT32_MAX]
        self._names: RowNames | None = None
        self._pending: list[tuple[RowCounts, RowCounts | None]] = []

    def add(self, rows: RowCounts, kernel: RowCounts | None) -> None:
        self._pending.append((rows, kernel))  # as _Rows.add

    def settle(self) -> None:
        pending, self._pending = self._pending, []
        for rows, kernel in pending:
            for i, part in ((0, rows), (1, kernel)):
                if part is not None and len(part.codes):
                    self._sums[i] = self._added(i, part)
                    self._names = self._names or part.names

    @property
    def all(self) -> RowCounts:
        self.settle()
        return _of_codes(self._sums[0], self._names)

    @property
    def kernel(self) -> RowCounts:
        self.settle()
        return _of_codes(self._sums[1], self._names)

    def _added(self, i: int, rows: RowCounts) -> np.ndarray:
        sums = self._sums[i]
        if sums.dtype == np.int32:
            self._int32_room[i] -= float(np.abs(rows.counts).sum())
            if self._int32_room[i] < 0 or not np.array_equal(np.floor(rows.counts), rows.counts):
                sums = arrays.widened(sums, np.float64)
        sums = arrays.longer(sums, int(rows.codes[-1]) + 1)  # the codes ascend
        sums[rows.codes] += rows.counts.astype(sums.dtype, copy=False)  # each code once
        return sums


def _of_codes(sums: np.ndarray, names: RowNames | None) -> RowCounts:
    """The rows of sums by name code (those whose counts are not 0)."""
    codes = np.flatnonzero(sums)
    if not len(codes):
        return _empty_rows()
    return RowCounts(codes, sums[codes].astype(float), names)


@dataclass
class _Vcpu:
    """A vCPU's counts over the pieces so far, in what adds: samples and nanoseconds (virtual samples are priced at
    the vCPU thread's rate over the whole recording, as Analysis.vcpu_parts prices them, once at the end)."""
    tid: int
    rows: _Rows
    kernel: int = 0  # its guest-mode samples in the guest kernel
    user: int = 0
    vmm: int = 0  # its thread's samples outside guest mode (the VMM or KVM working for it), but halt polling
    samples: int = 0  # its thread's samples
    polling: int = 0  # of them, KVM polling the halted vCPU
    on_cpu_ns: int = 0
    exact_poll_ns: int | None = None  # from kvm_vcpu_wakeup records, when the recording has them
    blank_ns: dict = field(default_factory=lambda: defaultdict(float))  # by cause

    def parts(self, period_ns: float) -> GuestParts:
        unit = thread_sample_ns(self.samples, self.on_cpu_ns, self.polling, self.exact_poll_ns, period_ns)
        poll = self.polling if self.exact_poll_ns is None else self.exact_poll_ns / unit
        blank = defaultdict(float, {cause: ns / unit for cause, ns in self.blank_ns.items()})
        return GuestParts(float(self.kernel), float(self.user), blank, float(self.vmm), float(poll))


def _empty_rows() -> RowCounts:
    return RowCounts(np.empty(0, np.int64), np.empty(0), None)


def _nonzero(rows: RowCounts) -> RowCounts:
    keep = rows.counts != 0
    return rows if keep.all() else replace(rows, codes=rows.codes[keep], counts=rows.counts[keep])


@dataclass
class RowColumns:
    """Function rows as columns: samples, names (ids into `strings`, by column: func, module, process; process ""
    and pid -1: none), unknown functions, kernel samples."""
    samples: np.ndarray
    ids: dict[str, np.ndarray]
    strings: np.ndarray  # object: the resolver's strings, index = id
    pid: np.ndarray
    unknown: np.ndarray
    kernel: np.ndarray

    def names(self, column: str) -> np.ndarray:
        return self.strings[self.ids[column]]


class Analysis(analysis.Analysis):
    """The Analysis of one piece: its rows are summed by name code (row_counts_of), so the per-sample row keys are
    made only if something reads them."""

    eager_keys = False


class RangeAfterEnd(Exception):
    """--time-range starts at or after the end of the recording, which spans `span_s` seconds."""

    def __init__(self, span_s: float) -> None:
        super().__init__(span_s)
        self.span_s = span_s


class StreamedAnalysis:
    """What `vmprof report` reads of an Analysis (VM names, vCPUs, host and guest profiles), summed piece by piece."""

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None, level: str = "host",
                 vm: str | None = None, piece_rows: int = PIECE_ROWS,
                 keep: Callable[[np.ndarray], np.ndarray] | None = None, kernel: bool = True,
                 shares_only: bool = True, resolver: Resolver | None = None, cpu: int | None = None,
                 time_range: tuple[float, float] | None = None) -> None:
        """level: the profiles asked for, host or guest (of `vm`, else of every VM), or all (both: the fleet's one
        pass over a window); only their sums are kept.
        keep: the samples to analyse (`report -K/-U`), as prepare's.  kernel: each row's kernel-mode samples are
        summed too (Row.kernel: what a filtered profile's ratios are made of; else 0).  shares_only: each piece's
        Analysis as Analysis(shares_only) makes it (False: with the holders and co-stop a subclass's _add sums).
        resolver: a new one for this recording, with symbols loaded already (the fleet's workers keep guest bundles
        and kallsyms across windows); its kallsyms, when set, are the recording's, which are then not parsed.
        cpu: the host level of that CPU only (report --cpu).  time_range: (from, to) in seconds after the first
        record, as prepare's: the pieces are cut to it, and those outside it only carry their switches on."""
        self.kernel = kernel
        self.cpu, self.time_range = cpu, time_range
        self.range_ns: tuple[int, int] | None = None  # the span of time_range, as prepare makes it
        self.sample_cpus: set[int] = set()  # the CPUs the samples name (report --cpu checks it names one)
        self.rec = rec = scanned.rec
        self.level, self.vm = level, vm
        self.period_ns = 1e9 / int(rec.meta.get("frequency", 1000))
        self.host = HostParts()
        self.host_rows = _RowsByCode()
        self.others: dict[tuple, Row] = {}  # CPU idle, one row per VM (by pid)
        self.vcpus: dict[tuple[str, int, int], _Vcpu] = {}  # by VM, vCPU and thread (a VM's name can be two VMs')
        self.vm_index: dict[str, int] = {}
        self.vm_by_pid: dict[int, str] = {}
        self.unresolved = 0  # samples whose function did not resolve (host level: of every sample)
        self.notes: dict[str, None] = {}
        self.has_sched = False
        self.pieces = 0
        # the whole recording's idle per CPU (see _add_idle): CPUs whose idle samples the sched events replace,
        # idle samples kept in pieces where they were not replaced (CPU -> count, rows), idle before the pieces
        self.idle_cpus: set[int] = set()
        self.kept_idle: dict[int, tuple[int, _Rows]] = {}
        self.start_ns: int | None = None
        self.piece_lo = 0  # where the piece being added starts (its span starts later in a --time-range)
        # the vCPU threads of the VM list: one that only its samples name is learned in the pieces where it ran
        # guest code, where the whole recording knows it in every piece (its timeline): not streamed
        listed = learn_vms(rec, np.empty(0, rec.samples.dtype), np.empty(0, bool)).vcpu_of_tid
        resolver = resolver or Resolver()
        resolver.objects.places.clear()  # of this recording's walk (_in_walk_order)
        context = SwitchContext()
        without_kallsyms = {k: v for k, v in rec.snapshot.items() if k != KALLSYMS_KEY}
        snapshot = rec.snapshot if resolver.kallsyms is None else without_kallsyms
        processes = rec.processes()  # the same in every piece
        memo = new_memo()  # so is what a sample's key resolves to
        ends: list[int] = []  # where the recording ends, known at its last piece

        def end_of(first: int, last: int) -> int:
            ends.append(recording_end(first, last, rec.end))
            return ends[0]

        first_ns: int | None = None  # the recording's first record: time_range counts from it
        read = pieces(scanned, piece_rows, end_of)
        for piece in read:
            first_ns = piece.lo if first_ns is None else first_ns
            if cpu is not None:
                self.sample_cpus.update(np.flatnonzero(np.bincount(piece.samples["cpu"])).tolist())
            span, samples = (piece.lo, piece.hi), piece.samples
            if time_range is not None:
                span, samples = in_range(piece, time_range, first_ns, ends[0] if ends else None)
            self.has_sched |= bool(len(piece.sched))
            # the pieces after the range add nothing but whether there are sched events and (--cpu) CPUs; a piece
            # ends before its `hi`, so the one ending at the range's end leaves out a record there, which the
            # whole read keeps when the range ends at the recording's end
            done = (time_range is not None and cpu is None
                    and piece.hi > given_span(time_range, first_ns)[1])
            if time_range is not None and span[0] >= span[1] and not len(samples):
                context.advance(piece.sched)  # outside the range: only what is open at its end goes on
                if done and self.has_sched:
                    read.close()  # its reader thread and file
                    break
                continue
            sched = np.concatenate([context.events, piece.sched, first_switches(piece.following)])
            part = Recording(rec.path, rec.meta, samples, sched, snapshot, rec.bundles, rec.object_tables,
                             rec.end, problems=list(rec.problems), fixed_processes=processes)
            if rec.stacks is not None:  # call stacks, cut as the samples (analyse/stream_callgraph.py)
                part.stacks, part.ustacks = piece.stacks[STACKS], piece.stacks.get(USTACKS)
                part.host_stacks = rec.host_stacks
            # the switches before the piece, its own, the first after it: each in prepare's order, and in time order
            an = Analysis(prepare(part, guest_bundles, resolver, keep=keep, span_ns=span,
                                  sched_in_order=True, memo=memo),
                          shares_only=shares_only)
            if any(listed.get(tid) != vcpu for tid, vcpu in an.vcpu_of_tid.items()):
                raise WholeNeeded("a vCPU thread that the VM list does not name")
            if self.start_ns is None:
                self.start_ns = span[0]
            self.piece_lo = piece.lo
            self._add(an, span[0])
            context.advance(piece.sched)
            snapshot = without_kallsyms  # parsed once, by the first piece
            self.pieces += 1
            del an, part, sched, piece, samples  # before the next piece is read and prepared, not once it is
            for rows in [self.host_rows, *(v.rows for v in self.vcpus.values())]:
                rows.settle()
            if done and self.has_sched:
                read.close()  # its reader thread and file
                break
        if time_range is not None and first_ns is not None:
            # ended before the recording's end, the range is as given: it ends before the recording does
            self.range_ns = range_now(time_range, first_ns, ends[0] if ends else None)
        self.notes = _in_walk_order(self.notes, resolver.objects.places)

    def _add(self, an: Analysis, lo: int) -> None:
        self.vm_index.update(an.vm_index)
        self.vm_by_pid.update(an.vm_by_pid)
        self.notes.update(dict.fromkeys(an.notes))
        if self.level in ("host", "all"):
            parts, rows, kernel, others = an.host_sums(self.kernel, self.cpu)
            self.host.add(parts)
            self.host_rows.add(rows, kernel)
            for r in others:
                self._add_other(r)
            self._add_idle(an, lo)
            unresolved = an.unresolved if self.cpu is None else an.unresolved & (an.samples["cpu"] == self.cpu)
            self.unresolved += int(np.count_nonzero(unresolved))
        if self.level != "host":
            self._add_guest(an)

    def _add_guest(self, an: Analysis) -> None:
        flags, counts = an.samples["flags"], an.vcpus
        timelines = [tl for tl in an.timelines.values() if self.vm in (None, tl.vm)]
        guest = [counts.thread_samples(tl) for tl in timelines]
        guest = [idx[an.is_guest[idx]] for idx in guest]
        in_kernel = [real[(flags[real] & SAMPLE_GUEST_KERNEL) != 0] for real in guest] if self.kernel else []
        rows = an.row_counts_of(guest + in_kernel) if timelines else []
        kernel_rows = rows[len(guest):] if self.kernel else [None] * len(guest)
        for tl, real, names, kernel_names in zip(timelines, guest, rows[:len(guest)], kernel_rows, strict=True):
            mine = self.vcpus.setdefault((tl.vm, tl.vcpu, tl.tid), _Vcpu(tl.tid, _Rows()))
            mine.rows.add(names, kernel_names)
            idx = counts.thread_samples(tl)
            kernel = int(np.count_nonzero(flags[real] & SAMPLE_GUEST_KERNEL))
            polling = len(counts.polling_samples(tl))
            mine.kernel += kernel
            mine.user += len(real) - kernel
            mine.vmm += len(idx) - len(real) - polling
            mine.samples += len(idx)
            mine.polling += polling
            mine.on_cpu_ns += tl.on_cpu_ns
            if (exact := counts.exact_poll_ns(tl)) is not None:
                mine.exact_poll_ns = (mine.exact_poll_ns or 0) + exact
            for cause, ns in an.blank_split(tl, in_ns=True).items():
                mine.blank_ns[cause] += ns

    def _add_other(self, r: Row) -> None:
        key = (r.kind, r.function, r.module, r.pid)
        if key in self.others:
            self.others[key].samples += r.samples
        else:
            self.others[key] = replace(r)

    def _add_idle(self, an: Analysis, lo: int) -> None:
        """The whole recording replaces the idle samples of every CPU that switches to or from idle anywhere in it
        by its idle time from the sched events, which runs from the recording's start on a CPU whose first such
        switch leaves idle; a piece knows only the switches up to its end.  So a CPU's idle samples kept in a
        piece are taken away again once it switches to or from idle, and a CPU first seen leaving idle gets the
        time from the recording's start to its piece."""
        replaced, at_start, kept = an.idle_sums(self.kernel, self.cpu)
        assert self.start_ns is not None
        if self.cpu is not None:
            at_start = at_start & {self.cpu}
        if first := len(at_start - self.idle_cpus):
            before = first * (lo - self.start_ns) / self.period_ns
            self._add_other(Row(before, *RowKind.CPU_IDLE.label(), kind=RowKind.CPU_IDLE))
            self.host.idle += before
        self.idle_cpus |= replaced
        for cpu, (count, rows) in kept.items():
            count_before, rows_before = self.kept_idle.get(cpu, (0, _Rows()))
            rows_before.add(rows[0], rows[1] if self.kernel else None)
            self.kept_idle[cpu] = (count_before + count, rows_before)
        for cpu in sorted(self.idle_cpus & self.kept_idle.keys()):
            count, rows = self.kept_idle.pop(cpu)
            self.host.idle -= count
            self.host_rows.add(rows.all.negated(), rows.kernel.negated() if self.kernel else None)

    # -- what the report reads -----------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        if self.range_ns is not None:
            return (self.range_ns[1] - self.range_ns[0]) / 1e9
        return self.rec.duration_s

    def vm_names(self) -> list[str]:
        return sorted(set(self.vm_by_pid.values()), key=lambda n: self.vm_index.get(n, 0))

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        return sorted((vcpu, tid) for (v_vm, vcpu, tid) in self.vcpus if v_vm == vm)

    def _rows(self, summed: _Rows | _RowsByCode, vm: str | None, by_vm: bool = True) -> list[Row]:
        """Rows in the order Analysis.aggregate gives them: by VM code (of the row's process), then name code
        (by_vm=False: by name code, as aggregate orders samples of one VM's processes, analyse/stream_stacks.py)."""
        return self._table(summed, vm, by_vm).rows()

    def _table(self, summed: _Rows | _RowsByCode, vm: str | None, by_vm: bool = True) -> RowTable:
        """_rows as columns."""
        c = self.row_columns(summed, by_vm)
        if c is None:
            return RowTable.of_rows([])
        return RowTable.of_functions(c.samples, c.kernel, c.ids, c.pid, c.unknown, vm, c.strings)

    def row_columns(self, summed: _Rows | _RowsByCode, by_vm: bool = True) -> RowColumns | None:
        """The rows _rows makes, in its order, as columns (the fleet's store writes them so: a window's guest
        profiles have hundreds of thousands of rows); None when there are none."""
        counts = summed.all
        names = counts.names
        if names is None or not len(counts.codes):
            return None
        counts, in_kernel = (_nonzero(c) for c in (counts, summed.kernel))  # _add_idle takes samples away again
        # a row's VM code by its pid, a function of its process code (few): looked up per process, not per row
        pid_of_proc = names.of_processes("pid")
        code_of_pid = {pid: self.vm_index.get(name, 0) for pid, name in self.vm_by_pid.items()}
        vm_of_proc = np.array([code_of_pid.get(p, 0) for p in pid_of_proc.tolist()], np.int32)
        proc = names.ids(counts.codes, "proc_code")
        # by VM code, then name code: the codes ascend already, so by VM code alone, stably (VMs are few)
        vm_code = vm_of_proc[proc]
        vms = np.unique(vm_code) if by_vm else np.zeros(1, np.int32)
        if len(vms) == 1:
            codes, samples, pids = counts.codes, counts.counts, pid_of_proc[proc]
            order = None
        else:
            order = np.concatenate([np.flatnonzero(vm_code == v) for v in vms.tolist()])
            codes, samples, pids = counts.codes[order], counts.counts[order], pid_of_proc[proc[order]]
        del proc, vm_code
        kernel = np.zeros(len(counts.codes))
        if len(in_kernel.codes):
            kernel[np.searchsorted(counts.codes, in_kernel.codes)] = in_kernel.counts  # of some of the codes
            kernel = kernel if order is None else kernel[order]
        return RowColumns(samples, {c: names.ids(codes, c) for c in ("func", "module", "process")},
                          names.strings.array(), pids, names.unknown(codes), kernel)

    def host_profile(self, cpu: int | None = None, table: bool = False) -> Profile:
        """table: its rows as a RowTable (a report's table, JSON and CSV), else as Rows."""
        if cpu != self.cpu or self.level not in ("host", "all"):
            raise ValueError("this streamed analysis has no host profile of that: analyse it whole")
        rows: list[Row] | RowTable = self._table(self.host_rows, None).extended(RowTable.of_rows(self.other_rows()))
        if not table:
            rows = rows.rows()
        notes = [*self.notes, f"CPU {cpu} only"] if cpu is not None else list(self.notes)
        return Profile("host", None, None, self.host.total, self.duration_s, self.rec.lost_samples, self.host.ratios(),
                       rows, self.unresolved, notes)

    def other_rows(self) -> list[Row]:
        """The host profile's rows after its functions: CPU idle, then each VM's."""
        idle = [r for r in self.others.values() if r.kind is RowKind.CPU_IDLE and r.samples]
        return idle + sorted((r for r in self.others.values() if r.kind is RowKind.VM), key=lambda r: r.pid)

    def guest_profile(self, vm: str, vcpu: int | None = None, table: bool = False) -> Profile:
        """table: as host_profile's."""
        if vm not in self.vm_names():
            raise KeyError(vm)
        if self.level not in ("guest", "all") or self.vm not in (None, vm):
            raise ValueError(f"this streamed analysis has no guest profile of {vm}: analyse it whole")
        parts = GuestParts()
        mine = [v for (v_vm, v_id, _tid), v in sorted(self.vcpus.items(), key=lambda kv: kv[1].tid)
                if v_vm == vm and vcpu in (None, v_id)]
        for v in mine:
            parts.add(v.parts(self.period_ns))
        summed = _Rows.joined([v.rows for v in mine])
        counts = summed.all
        virtual = [Row(n, *kind.label(vcpu=v), None, None, vm, kind) for (kind, v), n in parts.virtual().items()]
        rows: list[Row] | RowTable = self._table(summed, vm).extended(RowTable.of_rows(virtual))
        if not table:
            rows = rows.rows()
        unresolved = int(counts.counts[counts.names.unknown(counts.codes)].sum()) if counts.names is not None else 0
        notes = list(self.notes)
        if not self.has_sched:
            notes.append("no scheduler events in this recording: idle and steal are unknown")
        return Profile("guest", vm, vcpu, parts.total, self.duration_s, self.rec.lost_samples, parts.ratios(), rows,
                       unresolved, notes)


def _in_walk_order(notes: dict[str, None], places: dict[str, tuple]) -> dict[str, None]:
    """The notes in the whole read's order: those about the files of the samples' mappings come last (as the
    resolver adds them), in the order one walk over every sample meets them (by process, then mapping), where the
    pieces met them piece after piece."""
    placed = sorted((note for note in notes if note in places), key=places.__getitem__)
    return dict.fromkeys([*(note for note in notes if note not in places), *placed])


def range_span(time_range: tuple[float, float], first_ns: int, end_ns: int) -> tuple[int, int]:
    """[lo, hi) on the host clock of --time-range (from, to) in a recording from first_ns to end_ns, as
    load_analysis and prepare make it: `to` past the end is the end (RangeAfterEnd: `from` is)."""
    span_s = (end_ns - first_ns) / 1e9
    if time_range[0] >= span_s:
        raise RangeAfterEnd(span_s)
    return first_ns + round(time_range[0] * 1e9), first_ns + round(min(time_range[1], span_s) * 1e9)


FAR_S = 2**62 / 1e9  # seconds: past any host clock reading, and within int64 from any


def given_span(time_range: tuple[float, float], first_ns: int) -> tuple[int, int]:
    """[lo, hi) on the host clock of --time-range (from, to) as given, before the recording's end is known
    (range_span once it is): a bound past FAR_S seconds is FAR_S, which is past the end too (FROM:TO may be
    any finite seconds, 1e300 too)."""
    lo, hi = (first_ns + round(min(x, FAR_S) * 1e9) for x in time_range)
    return lo, hi


def range_now(time_range: tuple[float, float], first_ns: int, end_ns: int | None) -> tuple[int, int]:
    """range_span once the recording's end (end_ns) is known, given_span before."""
    return range_span(time_range, first_ns, end_ns) if end_ns is not None else given_span(time_range, first_ns)


def in_range(piece: Piece, time_range: tuple[float, float], first_ns: int,
              end_ns: int | None) -> tuple[tuple[int, int], np.ndarray]:
    """The span of a piece inside --time-range and its samples there, as prepare cuts the whole recording (end_ns:
    the recording's end, known at its last piece; before it, the range's end is as given, which no earlier piece
    reaches past the recording's end)."""
    lo, hi = range_now(time_range, first_ns, end_ns)
    t = piece.samples["time_ns"]
    inside = (t >= lo) & ((t < hi) | (end_ns is not None and hi >= end_ns))
    return (max(piece.lo, lo), min(piece.hi, hi)), piece.samples[inside]


def first_switches(sched: np.ndarray) -> np.ndarray:
    """The first context switch of each thread (as the one leaving or the one coming) among sched events in time
    order: with them a piece's vCPUs end as they do in the whole recording (on a CPU to the end of the piece, or in
    a blank that a later switch-in closes), where without them a vCPU's life would end at its last record."""
    switches = sched[(sched["flags"] & SCHED_NOT_SWITCH) == 0]
    keep = []
    for side in ("prev", "next"):
        thread = arrays.thread_keys(switches[f"{side}_pid"], switches[f"{side}_tid"])
        keep.append(arrays.unique(thread, return_index=True)[1])
    return switches[np.unique(np.concatenate(keep))] if keep else switches
