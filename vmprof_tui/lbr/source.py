"""The LBR data behind the live screen's block view (`b` in `vmprof top`): the block analysis
(lbr/blocks.py) of the LBR samples inside the screen's window, one function at a time.

Sources: a recording made with `vmprof record --lbr` or `--lbr=simulate` (its samples are named
through the recording's maps snapshots, as `vmprof blocks REC` does), or `perf script` text of
`perf record -b` data (named through its mmap events and the ELF files on disk, as
`vmprof blocks --perf-script` does).  A window's report is computed once and kept while the window
holds the same samples, so a still window costs nothing a refresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.lbr import perf_script
from vmprof_tui.lbr.blocks import STATUS_NAMES, STATUS_OK, BlockReport, BlockStat, ChainEntry, FunctionInfo, analyse
from vmprof_tui.lbr.disasm import listing
from vmprof_tui.lbr.model import CodeReader, LbrSample, Resolve
from vmprof_tui.lbr.recording import samples_of_recording, simulated_note
from vmprof_tui.record.recording import Recording
from vmprof_tui.resolve.elfcode import ImageCache

NO_LBR = ("no LBR data here: replay a recording made with `vmprof record --lbr` (--lbr=simulate -- CMD works on any "
          "machine) or open `perf record -b` data with `vmprof top --perf-script FILE`")


@dataclass
class BlockRow:
    """One block of a function in the window: its statistics over every occurrence."""

    stat: BlockStat
    cpi: float | None  # mean measured CPI of the samples it occurred in
    occurrence: tuple[int, int]  # (sample index in the report, block number in it) of its first occurrence

    @property
    def key(self) -> str:
        return f"{self.stat.start:x}-{self.stat.end:x}"


@dataclass
class FunctionBlocks:
    """What the block view shows for one function and window."""

    function: str
    vm: str | None
    info: FunctionInfo | None  # None when the window holds no block of it
    rows: list[BlockRow]
    rejected: dict[str, int]  # blocks with an endpoint in the function that were rejected, by reason
    samples: int  # LBR samples in the window
    samples_with: int  # ... with at least one counted block in the function
    unit: str  # "ns" or "cycles"
    notes: list[str] = field(default_factory=list)

    def row(self, key: str) -> BlockRow | None:
        return next((r for r in self.rows if r.key == key), None)


class LbrSource:
    """LBR samples in time order, with what names their addresses and reads their code."""

    def __init__(self, samples: Sequence[LbrSample], resolve: Resolve, label: str, freq_hz: float | None = None, *,
                 read_code: CodeReader | None = None, resolve_pid: Callable[[int], Resolve | None] | None = None,
                 notes: Sequence[str] = ()) -> None:
        order = np.argsort(np.array([s.time_ns for s in samples], dtype=np.int64), kind="stable")
        self.samples = [samples[int(i)] for i in order]
        self.times = np.array([s.time_ns for s in self.samples], dtype=np.int64)
        self.resolve, self.resolve_pid, self.freq_hz = resolve, resolve_pid, freq_hz
        self.read_code = read_code or ImageCache()
        self.label = label  # where the data come from, shown in the view's title
        self.notes = list(notes)
        self._cache: tuple[tuple[int, int, str | None], BlockReport] | None = None
        self._lock = threading.Lock()  # a live session adds samples in the poll's thread while the screen reads

    def report(self, lo: int | None, hi: int | None, vm: str | None = None) -> BlockReport:
        """The block analysis of the samples in [lo, hi] (None: unbounded), of one VM's samples with `vm`."""
        with self._lock:
            i0 = 0 if lo is None else int(np.searchsorted(self.times, lo, "left"))
            i1 = len(self.samples) if hi is None else int(np.searchsorted(self.times, hi, "right"))
            key = (i0, i1, vm)
            if self._cache is None or self._cache[0] != key:
                rep = analyse(self.samples[i0:i1], self.resolve, self.freq_hz, read_code=self.read_code,
                              resolve_pid=self.resolve_pid, vm=vm)
                rep.notes[:0] = self.notes
                self._cache = (key, rep)
            return self._cache[1]

    def add(self, samples: Sequence[LbrSample], keep_ns: int | None = None) -> None:
        """More samples (a live session's, lbr/live.py); those older than the newest by more than keep_ns are
        forgotten."""
        if not samples:
            return
        with self._lock:
            merged = self.samples + list(samples)
            times = np.array([s.time_ns for s in merged], dtype=np.int64)
            order = np.argsort(times, kind="stable")
            if keep_ns is not None:
                order = order[times[order] >= times[order[-1]] - keep_ns]
            self.samples, self.times = [merged[int(i)] for i in order], times[order]
            self._cache = None

    def function_blocks(self, report: BlockReport, function: str, vm: str | None = None) -> FunctionBlocks:
        fids = report.function_ids(function)
        info = report.functions[int(fids[0])] if fids.size else None
        b = report.blocks
        mine = b[np.isin(b["touches"], fids)]
        rejected = mine[mine["status"] != STATUS_OK]
        reasons = {STATUS_NAMES[int(k)]: int(n) for k, n in zip(*np.unique(rejected["status"], return_counts=True),
                                                               strict=True)}
        ok = mine[mine["status"] == STATUS_OK]
        rows = []
        for st in report.block_stats(function):
            same = ok[(ok["vstart"] == st.start) & (ok["vend"] == st.end)]
            cpi = same["cpi"][~np.isnan(same["cpi"])]
            first = same[np.lexsort((same["pos"], same["sample"]))[0]] if same.size else None
            rows.append(BlockRow(st, float(cpi.mean()) if cpi.size else None,
                                 (int(first["sample"]), int(first["pos"])) if first is not None else (-1, -1)))
        notes = list(report.notes)
        if vm is not None and not report.samples:
            notes.append(f"no LBR sample of VM {vm} in the window: the host's LBR records guest branches only "
                         "where the CPU virtualizes LBR for the guest")
        return FunctionBlocks(function, vm, info, rows, reasons, len(report.samples),
                              len(report.samples_with(function)) if info is not None else 0,
                              "ns" if report.freq_hz else "cycles", notes)

    def disassembly(self, info: FunctionInfo) -> list[tuple[int, int, str, str]]:
        """The function's instructions (capstone), from the object file (or the code the source was given)."""
        return listing(self.read_code, info.object_path, info.start, info.end)


def chain_of(report: BlockReport, sample: int) -> list[ChainEntry]:
    """The call/return chain (the paper's Table 7) of one sample, oldest entry first."""
    return report.chains[sample] if 0 <= sample < len(report.chains) else []


def from_recording(rec: Recording, freq_hz: float | None = None) -> LbrSource | None:
    """The LBR samples of a recording (`vmprof record --lbr` or --lbr=simulate); None when it holds none."""
    if rec.lbr is None or not len(rec.lbr):
        return None
    samples, resolve, resolve_pid, _ = samples_of_recording(rec)
    note = simulated_note(rec.meta)
    label = "SIMULATED LBR (single-step truth)" if note else f"LBR of {rec.path.name}"
    return LbrSource(samples, resolve, label, freq_hz, resolve_pid=resolve_pid, notes=[note] if note else [])


def from_perf_script(path: str, objects: Sequence[str] = (), freq_hz: float | None = None
                     ) -> tuple[LbrSource, perf_script.PerfScriptData]:
    """`perf script` text of `perf record -b` data, named as `vmprof blocks --perf-script` names it
    (PerfScriptError when unusable)."""
    data = perf_script.read(path)
    cache = ImageCache()
    glob, per_pid, errors = perf_script.build_resolvers(data, objects, cache)
    notes = [f"object not used: {e}" for e in errors] + perf_script.notes_of(data)
    return LbrSource(data.samples, glob, f"perf script {path}", freq_hz, read_code=cache,
                     resolve_pid=perf_script.make_resolve_pid(glob, per_pid), notes=notes), data
