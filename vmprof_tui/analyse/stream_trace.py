"""`vmprof report --format chrome` of a recording read a piece at a time: the segments of every vCPU
(analyse/segments.py vcpu_segments) and the report's profile, in memory bounded by the sched events and the
slices, not by the samples (docs/scale.md, "The Chrome trace a piece at a time").

The vCPUs' timelines are the whole recording's, built from its sched events before the samples pass (as
analyse/stream_steal.py builds them).  Each piece's samples of a vCPU thread are then cut into runs against the
thread's blanks as sample_runs cuts the whole thread's: the run still open at the piece's edge (its start, its
first sample's names and the last sample's time, code and on-CPU segment) is carried to the next piece, where a
sample of another code or segment closes it.  A run is kept as its start, end and an index of its slice's name
and args: not a sample is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.segments import on_cpu_segments, sample_runs, segment_bounds
from vmprof_tui.analyse.stream import PIECE_ROWS, StreamedAnalysis, WholeNeeded
from vmprof_tui.analyse.timeline import Schedule, VcpuTimeline
from vmprof_tui.arrays import rank_among
from vmprof_tui.collect import backends
from vmprof_tui.record.bpf_records import SCHED_NOT_SWITCH
from vmprof_tui.record.stream import Scanned, read_sched, sample_tables
from vmprof_tui.resolve.prepare import Vms, learn_vms, recording_end

VMS_AT_ONCE = 4  # VMs whose timelines are built at once
Label = tuple[str, str, str]  # a slice's name, category and args (as JSON)
Labeller = Callable[[Analysis, VcpuTimeline, int, bool], tuple[str, str, dict]]


@dataclass
class Track:
    """One vCPU thread's runs of samples so far, and the one still open."""
    tl: VcpuTimeline
    pid: int  # the trace's pid of its VM
    b_start: np.ndarray
    b_end: np.ndarray
    seg_lo: np.ndarray  # on-CPU segment k: from the end of blank k-1 to the start of blank k
    seg_hi: np.ndarray
    sampled: np.ndarray  # per on-CPU segment: a sample landed in it
    starts: list[np.ndarray] = field(default_factory=list)  # the closed runs: start, end (ns), label
    ends: list[np.ndarray] = field(default_factory=list)
    labels: list[np.ndarray] = field(default_factory=list)
    open: tuple[int, int, int, int, int] | None = None  # start ns, label, last sample's time, code, segment


class StreamedTrace(StreamedAnalysis):
    """A StreamedAnalysis (the report's profile) that also cuts the samples of the traced vCPUs into runs."""

    def __init__(self, scanned: Scanned, labeller: Labeller, guest_bundles: dict[str, Path] | None = None,
                 level: str = "host", vm: str | None = None, vcpu: int | None = None, piece_rows: int = PIECE_ROWS,
                 cpu: int | None = None) -> None:
        """labeller: the name, category and args of a slice whose run starts with sample i of a piece (guest or
        VMM; show/formats/chrome.py)."""
        rec = scanned.rec
        self.labeller = labeller
        self.frequency = int(rec.meta.get("frequency", 1000))
        self.backend = rec.meta.get("backend", backends.NONE)
        self.vms = learn_vms(rec, rec.samples, np.zeros(0, bool))
        self.timelines, self.span_ns = whole_timelines(scanned, self.vms, piece_rows, rec.end)
        self.label_ids: dict[Label, int] = {}  # the slices' labels, numbered as met
        self.label_of: dict[tuple[int, int], int] = {}  # a guest run's thread and code -> its label
        self.tracks: dict[int, Track] = {}
        self.scanned = scanned
        for tl in self.timelines.values():
            if vm not in (None, tl.vm) or vcpu not in (None, tl.vcpu):
                continue
            _blanks, b_start, b_end, seg_lo, seg_hi = segment_bounds(tl)
            tl.forget_blanks()  # made again for its slices once the samples are done
            self.tracks[tl.tid] = Track(tl, self.vms.index.get(tl.vm, 0) or len(self.vms.index) + 1, b_start, b_end,
                                        seg_lo, seg_hi, np.zeros(len(seg_lo), bool))
        super().__init__(scanned, guest_bundles, level, vm, piece_rows, kernel=False, cpu=cpu)
        for track in self.tracks.values():
            if track.open is not None:  # the thread's last sample: its run ends with its segment
                start, label, _t, _code, seg = track.open
                self._closed(track, np.array([start]), np.array([track.seg_hi[seg]]), [label])

    def host_view(self) -> SimpleNamespace:
        """What chrome.host_events reads of an Analysis: the context switches (read again: Analysis.sched, without
        the wake-up records), the vCPU threads, the VMs' names."""
        sched = read_sched(self.scanned)
        return SimpleNamespace(sched=sched[(sched["flags"] & SCHED_NOT_SWITCH) == 0],
                               vcpu_of_tid=self.vms.vcpu_of_tid, vm_by_pid=self.vms.by_pid)

    def _add(self, an: Analysis, lo: int) -> None:
        super()._add(an, lo)
        positions = an.vcpus.positions
        none = np.empty(0, np.int64)
        for track in self.tracks.values():
            tl = track.tl
            idx = positions.get(tl.pid << 32 | tl.tid, none)
            if len(idx):
                self._runs(an, track, idx)

    def _runs(self, an: Analysis, track: Track, idx: np.ndarray) -> None:
        """A piece's samples of a thread cut into runs as sample_runs cuts the whole thread's (vcpu_segments)."""
        times = an.samples["time_ns"][idx].astype(np.int64)
        seg, keep = on_cpu_segments(track.b_start, track.b_end, times)
        idx, times, seg = idx[keep], times[keep], seg[keep]
        if not len(idx):
            return
        track.sampled[seg] = True
        guest = an.is_guest[idx]
        keys = an.key[idx]  # (made first: it makes name_code_of_key)
        codes = np.where(guest, an.name_code_of_key[keys], -1)  # the resolver's: the same in every piece
        carry = track.open is not None
        if carry:
            start0, label0, t_last, code_last, seg_last = track.open
            if times[0] < t_last:
                raise WholeNeeded("samples of a vCPU thread out of order across pieces")
            times = np.concatenate([[t_last], times])
            codes = np.concatenate([[code_last], codes])
            seg = np.concatenate([[seg_last], seg])
        # every run, the last one's end not known yet (it stays open), the first's start carried when it goes on
        first, _count, start, end = sample_runs(times, codes, seg, track.seg_lo, track.seg_hi, every=True)
        labels = [label0 if carry and f == 0 else self._first_label(an, track, int(idx[f - carry]), guest[f - carry],
                                                                      int(codes[f]))
                  for f in first.tolist()]
        if carry:
            start[0] = start0
        self._closed(track, start[:-1], end[:-1], labels[:-1])
        track.open = (int(start[-1]), labels[-1], int(times[-1]), int(codes[-1]), int(seg[-1]))

    def _first_label(self, an: Analysis, track: Track, i: int, guest: bool, code: int) -> int:
        """The label of a run whose first sample is sample i of the piece (a guest run's by its code: the same
        names)."""
        key = (track.tl.tid, code)
        if guest and key in self.label_of:
            return self.label_of[key]
        name, cat, args = self.labeller(an, track.tl, i, guest)
        got = self.label_ids.setdefault((name, cat, json.dumps(args, separators=(",", ":"))), len(self.label_ids))
        if guest:
            self.label_of[key] = got
        return got

    @staticmethod
    def _closed(track: Track, start: np.ndarray, end: np.ndarray, labels: list[int]) -> None:
        ok = end > start
        if ok.any():
            track.starts.append(start[ok])
            track.ends.append(end[ok])
            track.labels.append(np.array(labels, np.int64)[ok])


def whole_timelines(scanned: Scanned, vms: Vms, rows: int, end: int | None) -> tuple[dict[int, VcpuTimeline],
                                                                                        tuple[int, int]]:
    """The timelines of the whole recording as the whole read builds them (Schedule.timelines), and its span: of
    the samples they read each vCPU thread's first and last and the recording's first and last, found by a look
    at the samples first; a few VMs at a time (the memory of building them is of their vCPUs' switches)."""
    keys = np.array(sorted({pid << 32 | tid for tid, (pid, _v) in vms.vcpu_of_tid.items()}), np.int64)
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
    span = (min(times), recording_end(min(times), max(times), end)) if times else (0, 0)
    seen = np.flatnonzero(first <= last).tolist()
    positions = {int(keys[i]): np.array([2 * j, 2 * j + 1]) for j, i in enumerate(seen)}
    sample_times = np.stack([first[seen], last[seen]], axis=1).reshape(-1)
    out: dict[int, VcpuTimeline] = {}
    pids = sorted({pid for pid, _v in vms.vcpu_of_tid.values()})
    for at in range(0, len(pids), VMS_AT_ONCE):
        mine = set(pids[at:at + VMS_AT_ONCE])
        only = frozenset(tid for tid, (pid, _v) in vms.vcpu_of_tid.items() if pid in mine)
        out.update(Schedule(switches, wake_events, vms.vcpu_of_tid, vms.by_pid, span, None,
                            only=only).timelines(positions, sample_times))
    return dict(sorted(out.items())), span
