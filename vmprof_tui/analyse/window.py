"""Sliding windows that feed the live screen: the last N seconds, a chunk at a time.

``LiveWindow`` keeps the chunks of a collection session on this host (the same session as
`vmprof record`); ``ReplayWindow`` plays a recording at its own pace.  Each chunk is resolved and
analysed once, when it arrives, into a summary of its span (analyse/shares.py); both windows hand out
the same thing, a ``WindowView`` (a source.ProfileSource): the summed summaries, each chunk's detail, and the
window's whole ``Analysis`` for its call paths, so `vmprof top` has no analysis code of its own
(docs/analysis.md).  Both windows are a source.Window.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import WeightedStacks, call_paths
from vmprof_tui.analyse.segments import Segment, vcpu_segments
from vmprof_tui.analyse.shares import (
    GuestSummary,
    HostParts,
    HostSummary,
    Row,
    RowCounts,
    SpanSummary,
    WindowSummary,
)
from vmprof_tui.analyse.steal import add_vcpu_steal, vcpu_steal
from vmprof_tui.analyse.timeline import SwitchContext
from vmprof_tui.collect.session import CollectionSession, read_kallsyms
from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import (
    SAMPLE_DTYPE,
    SAMPLE_HOST_KERNEL,
    SCHED_DTYPE,
    STACK_DTYPE,
)
from vmprof_tui.resolve.prepare import prepare
from vmprof_tui.resolve.resolver import Resolved, Resolver, RowNames
from vmprof_tui.resolve.symtab import kallsyms_table


def _window_recording(path: Path, meta: dict, samples: np.ndarray, sched: np.ndarray, snapshot: dict,
                      bundles: dict[str, bytes], seconds: float, lost: dict | None = None,
                      stacks: np.ndarray | None = None, host_stacks: dict | None = None,
                      ustacks: np.ndarray | None = None) -> recording.Recording:
    rec = recording.Recording(path, meta, samples, sched, snapshot, bundles, stacks=stacks,
                              host_stacks=host_stacks or {}, ustacks=ustacks)
    # rec.end is still None here, so vms() reads the window's snapshot
    rec.end = {"duration_s": seconds, "lost": lost or {"samples": [], "sched": []}, recording.VMS_KEY: rec.vms()}
    return rec


def _time_ordered(samples: np.ndarray) -> np.ndarray:
    """Samples in time order (a stable sort, as Analysis does; drained chunks usually are already)."""
    t = samples["time_ns"]
    return samples if np.all(t[1:] >= t[:-1]) else samples[arrays.stable_argsort(t)]


# (samples, their names, sched events with the switches before the span, the span, shares_only) -> its Analysis
AnalyseSpan = Callable[[np.ndarray, "Resolved | None", np.ndarray, tuple[int, int], bool], Analysis]


@dataclass
class WindowChunk:
    """A drained stretch of records covering [lo, hi) of the host clock, resolved once when it arrived, and the
    summary of its span (analysed with the switches before it)."""
    lo: int
    hi: int
    samples: np.ndarray
    resolved: Resolved | None
    sched: np.ndarray
    before: np.ndarray  # the switches before the span (timeline.SwitchContext)
    stacks: np.ndarray | None
    summary: SpanSummary
    analyse: AnalyseSpan
    counted_pids: np.ndarray  # the processes of the host tasks' samples counted in the kernel (--host-counts)
    _detail: Analysis | None = field(default=None, repr=False)
    _steal: dict[str, list[dict]] = field(default_factory=dict, repr=False)  # VM -> vcpu_steal of the span
    _segments: dict[str, dict[int, list[Segment]]] = field(default_factory=dict, repr=False)  # VM -> vCPU -> ...

    def detail(self) -> Analysis:
        """The span analysed in full (holders, co-stop), the first time a screen asks for more than its summary."""
        if self._detail is None:
            self._detail = self.analyse(self.samples, self.resolved, np.concatenate([self.before, self.sched]),
                                        (self.lo, self.hi), False)
        return self._detail

    def steal(self, vm: str) -> list[dict]:
        """The steal detail of a VM over this span."""
        if vm not in self._steal:
            self._steal[vm] = vcpu_steal(self.detail(), vm)
        return self._steal[vm]

    def segments(self, vm: str) -> dict[int, list[Segment]]:
        """What each vCPU of a VM did over this span, in segments (segments.vcpu_segments)."""
        if vm not in self._segments:
            an = self.detail()
            self._segments[vm] = {tl.vcpu: vcpu_segments(an, tl) for tl in an.vm_timelines(vm)}
        return self._segments[vm]


class ResolvedChunks:
    """The chunks of a sliding window, each resolved and summarised once when it arrives: a refresh sums the
    summaries of the window's chunks for the overview, and joins the chunks into one Analysis only for the
    screens that need more (the cost of a refresh does not grow with what earlier refreshes saw)."""

    def __init__(self) -> None:
        self.chunks: deque[WindowChunk] = deque()
        self.context = SwitchContext()
        self._summary: WindowSummary | None = None

    def add(self, lo: int, hi: int, samples: np.ndarray, sched: np.ndarray,
            resolve: Callable[[np.ndarray], Resolved], analyse: AnalyseSpan, stacks: np.ndarray | None = None,
            host_counts: np.ndarray | None = None, detail: bool = False) -> None:
        """Take in the records of [lo, hi) (and the host tasks' samples the kernel counted meanwhile).  detail: a
        screen will ask for the span's detail (WindowChunk.detail), so it is analysed in full now, once, and summarised
        from that (the summary's parts do not depend on the detail: holders and co-stop)."""
        samples, sched = _time_ordered(samples), _time_ordered(sched)
        resolved = resolve(samples) if len(samples) else None
        # the switches before the span say what each CPU and vCPU was doing as it began
        before = self.context.events
        an = analyse(samples, resolved, np.concatenate([before, sched]), (lo, hi), not detail)
        summary = an.span_summary()
        if host_counts is not None and len(host_counts):
            summary = with_host_counts(summary, host_counts, resolve, an.resolver.row_names)
        self.context.advance(sched)
        counted = np.unique(host_counts["pid"]) if host_counts is not None else np.empty(0, np.uint32)
        self.chunks.append(WindowChunk(lo, hi, samples, resolved, sched, before, stacks, summary, analyse, counted,
                                 _detail=an if detail else None))

    def summary(self, chunks: list[WindowChunk], lost_samples: int) -> WindowSummary:
        """The summary of the window made of `chunks`, slid from the last one this made."""
        self._summary = WindowSummary([c.summary for c in chunks], lost_samples, self._summary)
        return self._summary

    def pids(self) -> set[int]:
        return {int(pid) for c in self.chunks for pid in np.unique(c.samples["pid"]).tolist() + c.counted_pids.tolist()}

    def current(self, horizon: int) -> tuple[list[WindowChunk], int]:
        """The window's chunks and where the first begins: the window is made of whole chunks, those with the
        larger part of their span after `horizon` (ns), so that its summaries add up exactly (older chunks are
        forgotten)."""
        while self.chunks and self.chunks[0].lo + self.chunks[0].hi < 2 * horizon:
            self.chunks.popleft()
        return list(self.chunks), self.chunks[0].lo if self.chunks else horizon


def with_host_counts(summary: SpanSummary, counts: np.ndarray, resolve: Callable[[np.ndarray], Resolved],
                     row_names: RowNames) -> SpanSummary:
    """A span's summary with the host tasks' samples the kernel counted (collect.bpf.HOST_COUNTS_DTYPE) added to its
    host parts and rows: each (process, privilege, IP) is resolved once, as a sample of its own, and weighs its
    count.  (The ring buffer then carries only vCPU threads' and the idle task's samples.)"""
    keys = np.zeros(len(counts), SAMPLE_DTYPE)
    keys["pid"] = keys["tid"] = counts["pid"]
    keys["host_ip"], keys["flags"] = counts["ip"], counts["flags"]
    names = resolve(keys)
    codes, inverse = arrays.unique(names.name_code, return_inverse=True)
    rows = RowCounts(codes, np.bincount(inverse, counts["count"].astype(float), minlength=len(codes)), row_names)
    kernel = float(counts["count"][(counts["flags"] & SAMPLE_HOST_KERNEL) != 0].sum())
    host = summary.host
    parts = HostParts(host.kernel + kernel, host.user + float(counts["count"].sum()) - kernel, host.idle, host.vm)
    return replace(summary, host=parts, host_rows=RowCounts.combine([summary.host_rows, rows]))


def joined(chunks: list[WindowChunk]) -> tuple[np.ndarray, Resolved | None, np.ndarray, np.ndarray]:
    """(samples, their names, sched events, stack records) of the window's chunks, whole (as their summaries
    count them); the sched events begin with the switches before the first chunk."""
    names = [c.resolved for c in chunks if c.resolved is not None]
    samples = np.concatenate([c.samples for c in chunks if c.resolved is not None] or [np.empty(0, SAMPLE_DTYPE)])
    resolved = Resolved.concatenate(names) if names else None
    sched = np.concatenate([chunks[0].before] + [c.sched for c in chunks] if chunks else [np.empty(0, SCHED_DTYPE)])
    stacks = np.concatenate([c.stacks for c in chunks if c.stacks is not None] or [np.empty(0, STACK_DTYPE)])
    return samples, resolved, sched, stacks


class WindowView:
    """One refresh of the live screen (a source.ProfileSource).  The overview's numbers (host and guest
    summaries, each VM's shares and vCPUs) and the rows come from the summaries of the window's chunks, steal
    and segments from each chunk's detail; call paths from the window's whole Analysis, joined and analysed the
    first time a screen asks for it."""

    def __init__(self, summary: WindowSummary, analysis: Callable[[], Analysis], chunks: list[WindowChunk]) -> None:
        self.summary = summary
        self._analyse = analysis
        self._chunks = chunks
        self._steal: dict[str, list[dict]] = {}  # VM -> vcpu_steal, summed once a refresh (prepare, then drawing)
        self._segments: dict[str, dict[int, list[Segment]]] = {}

    @functools.cached_property
    def analysis(self) -> Analysis:
        return self._analyse()

    def span(self) -> tuple[int, int]:
        return self.summary.span()

    def vm_names(self) -> list[str]:
        return self.summary.vm_names()

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        return self.summary.vcpu_threads(vm)

    def host_summary(self) -> HostSummary:
        return self.summary.host_summary()

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary:
        return self.summary.guest_summary(vm, vcpu)

    def host_rows(self, limit: int | None) -> tuple[list[Row], int]:
        return self.summary.host_rows(limit)

    def guest_rows(self, vm: str, vcpu: int | None = None) -> list[Row]:
        return self.summary.guest_rows(vm, vcpu)

    def vcpu_steal(self, vm: str) -> list[dict]:
        """steal.vcpu_steal of the window, summed from each chunk's (each analysed once, the first time asked)."""
        if vm not in self._steal:
            self._steal[vm] = add_vcpu_steal([c.steal(vm) for c in self._chunks])
        return self._steal[vm]

    def vcpu_segments(self, vm: str) -> dict[int, list[Segment]]:
        """Per vCPU of a VM, its segments over the window: those of each chunk, one after the other."""
        if vm not in self._segments:
            out: dict[int, list[Segment]] = {}
            for c in self._chunks:
                for vcpu, segments in c.segments(vm).items():
                    out.setdefault(vcpu, []).extend(segments)
            self._segments[vm] = out
        return self._segments[vm]

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]:
        return self.summary.guest_ratios(vm, vcpu)

    def call_paths(self, vm: str | None) -> WeightedStacks | None:
        return call_paths(self.analysis, vm)


class LiveWindow:
    """The last `window_s` seconds of a collection session on this host."""

    live = True
    damage = None
    at_end = False  # a live window never ends

    def __init__(self, session: CollectionSession, window_s: float = 10.0) -> None:
        self.session = session
        self.window_s = window_s
        self.resolver = Resolver()
        self.processes: dict[int, dict] = {}  # host pid -> its snapshot, while it has samples in the window
        self.vms: list[dict] | None = None  # the running VMs (None until the first discovery)
        self.chunks = ResolvedChunks()
        self.host_stacks: dict[int, np.ndarray] = {}  # host stack-map id -> addresses, for the session's life
        self.ustacks: list[tuple[int, np.ndarray]] = []  # (chunk end, its user-stack copies): --call-graph cfi
        self.messages: list[str] = []  # for the screen: VMs that started or stopped
        self._last_forget = time.monotonic()
        self._chunk_end: int | None = None  # where the last chunk's span ended (the next one begins there)
        # where each chunk's LBR records go, with the processes' snapshots: the block view's (lbr/live.py)
        self.lbr_sink: Callable[[np.ndarray, dict[int, dict]], None] | None = None

    @property
    def meta(self) -> dict:
        return {"backend": self.session.backend.name, "frequency": self.session.frequency,
                "event": self.session.collector.event}

    @property
    def started(self) -> bool:
        return self.session.started

    def start(self) -> None:
        if self.started:
            return
        self.session.start()
        self.resolver.kallsyms = kallsyms_table(read_kallsyms())

    def _forget_processes(self) -> None:
        """Drop the snapshots of processes with no sample left in the window: a host that starts many short
        processes would otherwise fill memory, and a reused pid gets a fresh snapshot."""
        self._last_forget = time.monotonic()
        gone = self.session.pids_seen - self.chunks.pids()
        for pid in gone:
            self.processes.pop(pid, None)
        self.session.forget_processes(gone)

    def bundles(self) -> dict[str, Path]:
        return {vm.name: Path(vm.bundle) for vm in self.session.vms.values() if vm.bundle}

    def poll(self, detail: bool = False) -> WindowView:
        """The window after draining what came since the last poll; detail: the screen shown asks for each
        chunk's detail (steal detail, segments), so the new chunk is analysed in full at once."""
        chunk = self.session.poll(discover_every_s=2.0)
        hi = time.monotonic_ns()  # after the drain: the chunk's records are all before it
        if chunk.new_vms or chunk.gone_vms:
            if self.vms is not None:  # the first discovery is no news
                self.messages += [f"VM {vm.name} (pid {vm.pid}) started" for vm in chunk.new_vms]
            self.messages += [f"VM {vm.name} (pid {vm.pid}) stopped" for vm in chunk.gone_vms]
        if time.monotonic() - self._last_forget >= 2.0:
            self._forget_processes()
        # VMs that went away drop out of the live view as the window moves on
        self.vms = [vm.to_json() for vm in self.session.vms.values()]
        self.processes.update(chunk.processes)
        if self.lbr_sink is not None and chunk.lbr is not None:
            self.lbr_sink(chunk.lbr, self.processes)
        vm_of_pid = {int(vm["pid"]): vm["name"] for vm in self.vms}
        if len(chunk.samples):
            self.resolver.load_guests(vm_of_pid.values(), self.bundles(), {})
        lo = self._chunk_end if self._chunk_end is not None else hi - int(chunk.elapsed_s * 1e9)
        self.chunks.add(lo, hi, chunk.samples, chunk.sched,
                        lambda s: self.resolver.resolve(s, self.processes, vm_of_pid), self._analyse_span, chunk.stacks,
                        chunk.host_counts, detail)
        self._chunk_end = hi
        self.host_stacks.update(chunk.host_stacks)
        horizon = hi - int(self.window_s * 1e9)
        chunks, horizon = self.chunks.current(horizon)
        if chunk.ustacks is not None:  # kept while their chunk is in the window (8 KiB each)
            self.ustacks = [(end, u) for end, u in self.ustacks if end > horizon] + [(hi, chunk.ustacks)]
        ustacks = np.concatenate([u for _end, u in self.ustacks]) if self.ustacks else None
        lost = self.session.lost()
        vms, processes, bundles = self.vms, dict(self.processes), self.bundles()
        seconds = (hi - horizon) / 1e9

        def analyse() -> Analysis:
            samples, resolved, sched, stacks = joined(chunks)
            rec = _window_recording(Path("(live)"), self.meta, samples, sched,
                                    recording.snapshot(vms=vms, processes=processes), {}, seconds, lost,
                                    stacks if self.session.collector.stacks else None, self.host_stacks, ustacks)
            return Analysis(prepare(rec, bundles, self.resolver, resolved=resolved, span_ns=(horizon, hi)))

        lost_samples = sum(lost.get("samples", [])) + sum(lost.get("host_counts", []))  # sent or counted
        return WindowView(self.chunks.summary(chunks, int(lost_samples)), analyse, chunks)

    def _analyse_span(self, samples: np.ndarray, resolved: Resolved | None, sched: np.ndarray,
                      span: tuple[int, int], shares_only: bool) -> Analysis:
        vmms = {int(vm["pid"]): self.processes[int(vm["pid"])] for vm in self.vms or []
                if int(vm["pid"]) in self.processes}  # the host view's VM rows name the VMM process
        rec = _window_recording(Path("(live)"), self.meta, samples, sched, recording.snapshot(self.vms, vmms), {},
                                (span[1] - span[0]) / 1e9)
        return Analysis(prepare(rec, self.bundles(), self.resolver, resolved=resolved, span_ns=span), shares_only)

    def close(self) -> None:
        self.session.close()


class ReplayWindow:
    """Play a recording through the same screens, one refresh interval of recorded time per poll."""

    live = False
    messages: list[str] = []  # nothing happens in a recording played back (the list stays empty)

    def __init__(self, path: Path, window_s: float = 10.0, rec: recording.Recording | None = None) -> None:
        self.rec = rec if rec is not None else recording.load(path)  # rec: one made in memory (perf script)
        self.damage = self.rec.damage()  # shown on the status line: what corruption cost this replay
        self.window_s = window_s
        self.step_s = 1.0  # recorded seconds a poll moves on (a simulated LBR recording lasts milliseconds)
        self.resolver = Resolver()
        times = [a["time_ns"] for a in (self.rec.samples, self.rec.sched) if len(a)]
        self.t0 = int(min(t.min() for t in times)) if times else 0
        self.t_end = int(max(t.max() for t in times)) if times else 0
        self.now = self.t0
        self.samples = _time_ordered(self.rec.samples)  # load gives them in time order already
        self.sched = np.sort(self.rec.sched, order="time_ns")
        self.stacks = None if self.rec.stacks is None else np.sort(self.rec.stacks, order="time_ns")
        self._times: dict[int, np.ndarray] = {}  # id of one of the tables above -> its times
        self.meta = self.rec.meta
        # kallsyms is parsed once into the resolver (start); without it in the snapshot no window re-parses it
        self.snapshot = {k: v for k, v in self.rec.snapshot.items() if k != recording.KALLSYMS_KEY}
        self.chunks = ResolvedChunks()
        self._loaded_ns = self.t0  # the records up to this time are in self.chunks (or were)
        self._fresh = True
        self._processes = self.rec.processes()
        self._vm_of_pid = {int(vm["pid"]): vm["name"] for vm in self.rec.vms()}

    started = True

    def start(self) -> None:
        self.resolver.kallsyms = kallsyms_table(self.rec.kallsyms() or "")
        self.resolver.objects.add_tables(self.rec.object_tables)  # a window of `vmprof agent` replayed

    @property
    def at_end(self) -> bool:
        return self.now >= self.t_end

    def _between(self, table: np.ndarray, lo: int, hi: int, fresh: bool) -> np.ndarray:
        """The records of a time-sorted table in (lo, hi], or [lo, hi] for a fresh window."""
        t = self._times.get(id(table))
        if t is None:  # a contiguous int64 copy of the times: the field of a table is strided, and a uint64 array
            # searched for a Python int is converted to float whole, every time
            t = self._times[id(table)] = table["time_ns"].astype(np.int64)
        return table[np.searchsorted(t, lo, "left" if fresh else "right"):np.searchsorted(t, hi, "right")]

    def poll(self, detail: bool = False, step_s: float | None = None) -> WindowView:
        step_s = self.step_s if step_s is None else step_s
        self.now = min(self.now + int(step_s * 1e9), self.t_end)
        lo = max(self.t0, self.now - int(self.window_s * 1e9))
        if self._fresh or self.now < self._loaded_ns or lo > self._loaded_ns:
            # the first poll, or a jump back or past a whole window: start over, from the window's start
            self.chunks = ResolvedChunks()
            self._loaded_ns, self._fresh = lo, False
            self.resolver.load_guests(self._vm_of_pid.values(), {}, self.rec.bundles)
        # as on a live host, each new stretch of records is resolved and summarised once, when it arrives, a
        # refresh interval at a time
        step = max(int(step_s * 1e9), 1)
        while self._loaded_ns < self.now or not self.chunks.chunks:
            hi = min(self._loaded_ns + step, self.now)
            first = not self.chunks.chunks
            self.chunks.add(self._loaded_ns, hi, self._between(self.samples, self._loaded_ns, hi, first),
                            self._between(self.sched, self._loaded_ns, hi, first),
                            lambda s: self.resolver.resolve(s, self._processes, self._vm_of_pid), self._analyse_span,
                            None if self.stacks is None else self._between(self.stacks, self._loaded_ns, hi, first),
                            detail=detail)
            self._loaded_ns = hi
        chunks, lo = self.chunks.current(lo)
        now = self.now
        seconds = (now - lo) / 1e9

        def analyse() -> Analysis:
            s, resolved, e, st = joined(chunks)
            rec = _window_recording(self.rec.path, self.meta, s, e, self.snapshot, self.rec.bundles, seconds,
                                    stacks=None if self.stacks is None else st, host_stacks=self.rec.host_stacks,
                                    ustacks=self.rec.ustacks)  # joined to the window's samples by (cpu, time)
            rec.problems = list(self.rec.problems)
            return Analysis(prepare(rec, resolver=self.resolver, resolved=resolved, span_ns=(lo, now)))

        return WindowView(self.chunks.summary(chunks, 0), analyse, chunks)  # a replay loses nothing

    def _analyse_span(self, samples: np.ndarray, resolved: Resolved | None, sched: np.ndarray,
                      span: tuple[int, int], shares_only: bool) -> Analysis:
        rec = _window_recording(self.rec.path, self.meta, samples, sched, self.snapshot, self.rec.bundles,
                                (span[1] - span[0]) / 1e9)
        return Analysis(prepare(rec, resolver=self.resolver, resolved=resolved, span_ns=span), shares_only)

    def close(self) -> None:
        pass
