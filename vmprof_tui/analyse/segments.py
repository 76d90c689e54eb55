"""What a vCPU did over time, as segments that tile its life with no hole.

``vcpu_segments`` cuts one vCPU's life into runs of guest samples (same process and function), runs of VMM
samples (the vCPU thread outside guest mode: steal of type 2), on-CPU time no sample landed in, and the blanks
(idle, preempted with who held the pCPU, VMM blocked).  The live screen's timeline and the Chrome trace export
both draw these: the timelines (timeline.py) and the samples of an analysis together.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.blanks import Blank
from vmprof_tui.analyse.timeline import VcpuTimeline


class SegmentKind(Enum):
    GUEST = "guest"  # a run of guest samples of one process and function
    VMM = "vmm"  # a run of samples of the vCPU thread outside guest mode (the VMM or KVM at work)
    UNSAMPLED = "unsampled"  # on a CPU, but no sample landed there (shorter than a period, or lost)
    BLANK = "blank"  # off the CPU: see blank.kind


@dataclass(frozen=True)
class Segment:
    """One stretch of a vCPU's life on the host clock."""
    start_ns: int
    end_ns: int
    kind: SegmentKind
    sample: int = -1  # GUEST, VMM: index in Analysis.samples of the run's first sample
    samples: int = 0  # GUEST, VMM: how many samples the run holds
    blank: Blank | None = None  # BLANK: why the vCPU was off the CPU and who held it meanwhile

    @property
    def holder(self) -> str:
        """BLANK: who held the pCPU the longest (the task that took it when nobody is known)."""
        assert self.blank is not None
        holders = self.blank.holders()
        return max(holders, key=holders.get) if holders else self.blank.first_holder


def segment_bounds(tl: VcpuTimeline) -> tuple[list[Blank], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A vCPU's blanks in time order, their starts and ends, and the bounds of its on-CPU segments: segment k runs
    from the end of blank k-1 to the start of blank k."""
    blanks = sorted(tl.blanks, key=lambda b: b.start_ns)
    b_start = np.array([b.start_ns for b in blanks], np.int64)
    b_end = np.array([b.end_ns for b in blanks], np.int64)
    seg_lo = np.concatenate([[tl.start_ns], b_end]).astype(np.int64)
    seg_hi = np.concatenate([b_start, [tl.end_ns]]).astype(np.int64)
    return blanks, b_start, b_end, seg_lo, seg_hi


def on_cpu_segments(b_start: np.ndarray, b_end: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The on-CPU segment of each sample time (segment_bounds), and which samples to keep: a sample inside a blank
    contradicts the sched events."""
    seg = np.searchsorted(b_end, times, side="right")
    return seg, np.searchsorted(b_start, times, side="right") <= seg


def sample_runs(times: np.ndarray, codes: np.ndarray, seg: np.ndarray, seg_lo: np.ndarray,
                seg_hi: np.ndarray, every: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive samples with the same code into runs that tile their on-CPU segments (vectorised).

    ``times`` are sorted sample times, ``seg`` the on-CPU segment of each sample and
    ``seg_lo``/``seg_hi`` the segments' bounds.  A run breaks where the code or the
    segment changes.  Between two runs of one segment the boundary is the midpoint of
    their neighbouring samples; the first run of a segment starts where the segment
    starts and the last one ends where it ends, so the runs cover the on-CPU time.
    Returns (first sample index, sample count, start ns, end ns) per run, runs with
    no duration left out (every: kept, for a caller that carries a piece's first and
    last runs on: analyse/stream_trace.py).
    """
    n = len(times)
    if not n:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty
    t = times.astype(np.int64)
    new_seg = np.ones(n, bool)
    new_seg[1:] = seg[1:] != seg[:-1]
    brk = new_seg.copy()
    brk[1:] |= codes[1:] != codes[:-1]
    first = np.nonzero(brk)[0]
    last = np.append(first[1:] - 1, n - 1)
    mid = t[:-1] + (t[1:] - t[:-1]) // 2  # mid[i]: between samples i and i+1
    before = np.concatenate([t[:1], mid])  # before[i]: between samples i-1 and i
    after = np.concatenate([mid, t[-1:]])  # after[i]: between samples i and i+1
    seg_end = np.append(new_seg[1:], True)
    start = np.where(new_seg[first], seg_lo[seg[first]], before[first])
    end = np.where(seg_end[last], seg_hi[seg[last]], after[last])
    if every:
        return first, last - first + 1, start, end
    ok = end > start
    return first[ok], (last - first + 1)[ok], start[ok], end[ok]


def vcpu_segments(an: Analysis, tl: VcpuTimeline) -> list[Segment]:
    """The segments of one vCPU: sample runs (in time order), then unsampled on-CPU time, then the blanks.

    The on-CPU intervals come from the sched events (exact); the samples in each say what ran: an
    interval is split between its runs of samples at the midpoints between neighbouring samples, so
    the segments cover the vCPU's life with no hole and no overlap.  A sample inside a blank
    contradicts the sched events and is left out.
    """
    blanks, b_start, b_end, seg_lo, seg_hi = segment_bounds(tl)
    idx = np.nonzero(an.vcpus.thread_mask(tl))[0]
    times = an.samples["time_ns"][idx].astype(np.int64)
    seg, keep = on_cpu_segments(b_start, b_end, times)
    idx, times, seg = idx[keep], times[keep], seg[keep]
    guest = an.is_guest[idx]
    # a run is one guest (process, function), or the VMM at work (all non-guest samples alike)
    codes = np.where(guest, an.key[idx], -1)
    first, count, start, end = sample_runs(times, codes, seg, seg_lo, seg_hi)
    out = [Segment(a, z, SegmentKind.GUEST if g else SegmentKind.VMM, i, n) for i, n, a, z, g in zip(
        idx[first].tolist(), count.tolist(), start.tolist(), end.tolist(), guest[first].tolist(), strict=True)]
    unsampled = np.ones(len(seg_lo), bool)
    unsampled[seg] = False
    unsampled &= seg_hi > seg_lo
    out += [Segment(a, z, SegmentKind.UNSAMPLED) for a, z in zip(seg_lo[unsampled].tolist(),
                                                                 seg_hi[unsampled].tolist(), strict=True)]
    out += [Segment(b.start_ns, b.end_ns, SegmentKind.BLANK, blank=b) for b in blanks]
    return out
