"""What a vCPU did over time, in one place: its segments, and the split of its blank time by cause.

``vcpu_segments`` cuts one vCPU's life into segments that tile it with no hole: runs of
guest samples (same process and function), runs of VMM samples (the vCPU thread outside
guest mode: steal of type 2), on-CPU time no sample landed in, and the blanks (idle,
preempted with who held the pCPU, VMM blocked).  The live screen's timeline and the
Chrome trace export both draw these.

``steal_split`` is the one computation of how blank time divides into idle, steal of
type 1 (by a vCPU of the same VM, by anything outside it, by the pCPU's interrupts, by the
wait after a wake-up, by cpu.max throttling) and steal of type 2 (the VMM blocked); the guest
profile's virtual rows and ratios and `vmprof steal` both come from it.

Blanks and timelines are built from the sched events by analysis.Analysis; this module
only reads them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse.blanks import NO_TIME, Blank, BlankTable
from vmprof_tui.analyse.kinds import RowKind

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis, VcpuTimeline

# a cause of blank time: its row kind, and for STEAL_SIBLING the vCPU (of the same VM) that held the pCPU
Cause = tuple[RowKind, int | None]
IDLE_CAUSE: Cause = (RowKind.IDLE, None)
OUTSIDE_CAUSE: Cause = (RowKind.STEAL_OUTSIDE, None)
BLOCKED_CAUSE: Cause = (RowKind.STEAL_VMM_BLOCKED, None)
WAKEUP_CAUSE: Cause = (RowKind.STEAL_WAKEUP, None)
THROTTLED_CAUSE: Cause = (RowKind.STEAL_THROTTLED, None)
IRQ_CAUSE: Cause = (RowKind.STEAL_IRQ, None)


_CAUSES = (IDLE_CAUSE, WAKEUP_CAUSE, OUTSIDE_CAUSE, IRQ_CAUSE, THROTTLED_CAUSE, BLOCKED_CAUSE)
_IDLE, _WAKEUP, _OUTSIDE, _IRQ, _THROTTLED, _BLOCKED = range(len(_CAUSES))


def steal_split(table: BlankTable, units: np.ndarray) -> list[dict[Cause, float]]:
    """Blank time by cause of each timeline of a table (`units`: one per timeline), in units of its entry in
    `units` (a vCPU's sampling period gives virtual samples, 1 gives ns), for every timeline at once.

    A halt is idle until its wake-up, then ``wakeup`` steal until the vCPU ran.  A preemption counts
    the IRQ time of its pCPU meanwhile as ``irq``, for each vCPU of the same VM the time it held the
    pCPU, and the rest as ``outside`` (other VMs, host tasks).  A throttled blank is ``throttled`` for as
    long as the kernel kept its group throttled, ``outside`` for the wait after that; VMM-blocked blanks
    count whole.  A halted or blocked vCPU woken into a throttled group (it slept as the quota ran out)
    is idle or blocked until the wake-up, ``throttled`` while the group stayed so, then ``wakeup`` or
    ``outside``.  Causes appear in the order blanks first show them: that is the order of the guest
    profile's rows.  Each cause's parts are added blank by blank (np.bincount), as a loop over blanks would.
    """
    u = units[table.timeline]
    dur = table.duration
    n = dur / u
    kind = table.kind
    woken_throttled = table.throttled_wakeup != NO_TIME
    parts: list[tuple[np.ndarray, int | np.ndarray, int | np.ndarray, np.ndarray]] = []  # (rows, order, cause, value)
    # slept, woken into a throttled group: idle or blocked, throttled, then a pCPU wait
    r = np.flatnonzero(woken_throttled)
    w, end, thr_ns = table.throttled_wakeup[r], table.end[r], table.throttled[r]
    slept = (w - table.start[r]) / u[r]
    thr = np.where(thr_ns == NO_TIME, end - w, np.minimum(thr_ns, end - w)) / u[r]
    idle = kind[r] == bt.IDLE
    parts += [(r, 0, np.where(idle, _IDLE, _BLOCKED), slept), (r, 1, _THROTTLED, thr)]
    rest = n[r] - slept - thr
    more = n[r] > slept + thr
    parts.append((r[more], 2, np.where(idle, _WAKEUP, _OUTSIDE)[more], rest[more]))
    # halted: idle until the wake-up
    r = np.flatnonzero(~woken_throttled & (kind == bt.IDLE))
    wake = table.wakeup[r]
    woken = np.where(wake == NO_TIME, 0, table.end[r] - wake) / u[r]
    parts += [(r, 0, _IDLE, n[r] - woken), (r[woken != 0], 1, _WAKEUP, woken[woken != 0])]
    # preempted: by each vCPU of the same VM (in the order found), the pCPU's IRQs, the rest outside
    same = table.held_same_vm
    hb, hv, hn = table.held_blank[same], table.held_vcpu[same], table.held_ns[same]
    siblings = np.zeros(len(table), np.int64)
    np.add.at(siblings, hb, hn)
    parts.append((hb, np.arange(len(hb)) - np.searchsorted(hb, hb), len(_CAUSES) + hv, hn / u[hb]))
    r = np.flatnonzero(~woken_throttled & (kind == bt.PREEMPTED))
    irq = np.minimum(table.irq[r], dur[r] - siblings[r]) / u[r]
    last = int(max(len(hb), 1))  # after every sibling of the blank
    parts += [(r[irq > 0], last, _IRQ, irq[irq > 0]),
              (r, last + 1, _OUTSIDE, n[r] - siblings[r] / u[r] - np.maximum(irq, 0.0))]
    # throttled, then (quota back) waiting for its pCPU
    r = np.flatnonzero(~woken_throttled & (kind == bt.THROTTLED))
    thr_ns = table.throttled[r]
    part = np.where(thr_ns == NO_TIME, dur[r], np.minimum(thr_ns, dur[r])) / u[r]
    more = n[r] > part
    parts += [(r, 0, _THROTTLED, part), (r[more], 1, _OUTSIDE, (n[r] - part)[more])]
    r = np.flatnonzero(~woken_throttled & (kind == bt.BLOCKED))
    parts.append((r, 0, _BLOCKED, n[r]))

    rows = np.concatenate([p[0] for p in parts])
    order_in_blank = np.concatenate([np.broadcast_to(p[1], len(p[0])) for p in parts])
    cause = np.concatenate([np.broadcast_to(p[2], len(p[0])) for p in parts]).astype(np.int64)
    value = np.concatenate([p[3] for p in parts]).astype(float)
    order = np.lexsort((order_in_blank, rows))
    width = len(_CAUSES) + int(hv.max(initial=-1)) + 1  # a sibling vCPU v is cause len(_CAUSES) + v
    key = (table.timeline[rows] * width + cause)[order]
    sums = np.bincount(key, value[order], minlength=len(units) * width)
    keys, first = np.unique(key, return_index=True)
    out: list[dict[Cause, float]] = [defaultdict(float) for _ in range(len(units))]
    for k in keys[np.lexsort((first, keys // width))].tolist():
        tl, c = divmod(k, width)
        out[tl][_CAUSES[c] if c < len(_CAUSES) else (RowKind.STEAL_SIBLING, c - len(_CAUSES))] = float(sums[k])
    return out


def steal_of_type(split: dict[Cause, float], steal_type: int) -> float:
    """The part of a split that is steal of type 1 or 2."""
    return sum(v for (kind, _v), v in split.items() if kind.steal_type == steal_type)


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


def sample_runs(times: np.ndarray, codes: np.ndarray, seg: np.ndarray, seg_lo: np.ndarray,
                seg_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive samples with the same code into runs that tile their on-CPU segments (vectorised).

    ``times`` are sorted sample times, ``seg`` the on-CPU segment of each sample and
    ``seg_lo``/``seg_hi`` the segments' bounds.  A run breaks where the code or the
    segment changes.  Between two runs of one segment the boundary is the midpoint of
    their neighbouring samples; the first run of a segment starts where the segment
    starts and the last one ends where it ends, so the runs cover the on-CPU time.
    Returns (first sample index, sample count, start ns, end ns) per run, runs with
    no duration left out.
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
    ok = end > start
    return first[ok], (last - first + 1)[ok], start[ok], end[ok]


def vcpu_segments(an: Analysis, tl: VcpuTimeline) -> list[Segment]:
    """The segments of one vCPU: sample runs (in time order), then unsampled on-CPU time, then the blanks.

    The on-CPU intervals come from the sched events (exact); the samples in each say what ran: an
    interval is split between its runs of samples at the midpoints between neighbouring samples, so
    the segments cover the vCPU's life with no hole and no overlap.  A sample inside a blank
    contradicts the sched events and is left out.
    """
    blanks = sorted(tl.blanks, key=lambda b: b.start_ns)
    b_start = np.array([b.start_ns for b in blanks], np.int64)
    b_end = np.array([b.end_ns for b in blanks], np.int64)
    # on-CPU interval k runs from the end of blank k-1 to the start of blank k
    seg_lo = np.concatenate([[tl.start_ns], b_end]).astype(np.int64)
    seg_hi = np.concatenate([b_start, [tl.end_ns]]).astype(np.int64)
    idx = np.nonzero(an.thread_mask(tl))[0]
    times = an.samples["time_ns"][idx].astype(np.int64)
    seg = np.searchsorted(b_end, times, side="right")
    keep = np.searchsorted(b_start, times, side="right") <= seg
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
