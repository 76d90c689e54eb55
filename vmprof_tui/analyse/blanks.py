"""The blanks of vCPUs (the intervals in which a vCPU was not on a CPU): a table of arrays, single ``Blank``s,
and the split of blank time by cause.

At 64 CPUs there are tens of thousands of blanks a second.  timeline.Schedule builds them as one ``BlankTable`` for
every vCPU at once and the shares (steal_split) read the table; a ``Blank`` object is made only when a screen,
an export or the steal report looks at blanks one by one (VcpuTimeline.blanks).

``steal_split`` is the one computation of how blank time divides into idle, steal of type 1 (by a vCPU of the
same VM, by anything outside it, by the pCPU's interrupts, by the wait after a wake-up, by cpu.max throttling)
and steal of type 2 (the VMM blocked); the guest profile's virtual rows and ratios and `vmprof steal` both come
from it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

import numpy as np

from vmprof_tui.analyse.kinds import BlankKind, RowKind

NO_TIME = -1  # in a table's time columns: none (no wake-up, not recorded)
# a table's kind codes
BLANK_KINDS = (BlankKind.IDLE, BlankKind.THROTTLED, BlankKind.PREEMPTED, BlankKind.BLOCKED)
IDLE, THROTTLED, PREEMPTED, BLOCKED = range(len(BLANK_KINDS))

NO_HOLDERS: Mapping = MappingProxyType({})


def _plus(held: dict | None, who: object, ns: int) -> dict:
    """A blank's table of holders with `ns` more for `who` (made on the first: most blanks have none)."""
    held = {} if held is None else held
    held[who] = held.get(who, 0) + ns
    return held


@dataclass(slots=True)
class Blank:
    """An interval in which a vCPU was not on a CPU (slots, and the tables of holders made only for blanks that
    have some: a report can make millions)."""
    start_ns: int
    end_ns: int
    kind: BlankKind
    exit_reason: int
    cpu: int
    first_holder: str  # the task that took the pCPU when the vCPU left it
    _same_vm: dict[int, int] | None = None
    _other_vm: dict[str, int] | None = None
    _host: dict[str, int] | None = None
    # IDLE: when a wake-up made the thread runnable again (sched_wakeup); from then to the end it waited
    # for its pCPU (steal), not for work.  None: no wake-up recorded (then the whole blank is idle).
    wakeup_ns: int | None = None
    irq_ns: int = 0  # PREEMPTED: IRQ time on its pCPU while it waited (known when it came back on that CPU)
    # THROTTLED: how long its group stayed throttled (the kernel's count, SCHED_THROTTLE_END); the rest of the
    # blank it waited for its pCPU after the group's quota came back.  None: not recorded (all throttled).
    throttled_ns: int | None = None
    # IDLE or BLOCKED: the wake-up found its group throttled (it slept as the quota ran out); from then it
    # waited throttled_ns for the quota, then for its pCPU.  None: no such wake-up.
    throttled_wakeup_ns: int | None = None

    @property
    def same_vm_ns(self) -> Mapping[int, int]:
        """vCPU id of the same VM -> ns it held the pCPU."""
        return self._same_vm or NO_HOLDERS

    @property
    def other_vm_ns(self) -> Mapping[str, int]:
        """Another VM -> ns its vCPUs held the pCPU."""
        return self._other_vm or NO_HOLDERS

    @property
    def host_ns(self) -> Mapping[str, int]:
        """A task that is no vCPU -> ns it held the pCPU."""
        return self._host or NO_HOLDERS

    @property
    def throttled_part_ns(self) -> int:
        return self.duration_ns if self.throttled_ns is None else min(self.throttled_ns, self.duration_ns)

    def throttled_interval(self) -> tuple[int, int] | None:
        """When the blank waited for its group's quota: from its start (THROTTLED) or from a throttled
        wake-up, for as long as the kernel kept the group throttled."""
        if self.kind == BlankKind.THROTTLED:
            return self.start_ns, self.start_ns + self.throttled_part_ns
        if self.throttled_wakeup_ns is None:
            return None
        w = self.throttled_wakeup_ns
        ns = self.end_ns - w if self.throttled_ns is None else min(self.throttled_ns, self.end_ns - w)
        return w, w + ns

    def throttled_after_wakeup(self) -> tuple[int, int] | None:
        """throttled_interval of a blank woken into a throttled group; None for any other."""
        return self.throttled_interval() if self.throttled_wakeup_ns is not None else None

    @property
    def throttled_wait_ns(self) -> int:
        """Of the blank, the time spent waiting for its group's quota."""
        iv = self.throttled_interval()
        return iv[1] - iv[0] if iv else 0

    @property
    def wakeup_wait_ns(self) -> int:
        """IDLE: from the wake-up until it ran, less a throttled wait (the rest is waiting for its pCPU)."""
        if self.wakeup_ns is None:
            return 0
        return self.end_ns - self.wakeup_ns - self.throttled_wait_ns

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def holders(self) -> dict[str, int]:
        """Who held the pCPU during the blank: vCPUs of the same VM, other VMs, the rest (host tasks)."""
        out = {f"vcpu{v}": ns for v, ns in self.same_vm_ns.items()}
        out.update(self.other_vm_ns)
        for holder, ns in self.host_ns.items():
            out[holder] = out.get(holder, 0) + ns
        rest = self.duration_ns - sum(out.values())
        if rest > 0:
            out[self.first_holder] = out.get(self.first_holder, 0) + rest
        return out


@dataclass
class BlankTable:
    """The blanks of every vCPU of an analysis, by vCPU (its timeline's index) and then in time order: one row per
    blank, the columns of Blank (NO_TIME for None), and apart, the vCPUs that held the pCPU while a blank waited."""
    timeline: np.ndarray  # int64
    start: np.ndarray  # int64, and so every time column
    end: np.ndarray
    kind: np.ndarray  # int8: BLANK_KINDS
    exit_reason: np.ndarray
    cpu: np.ndarray
    first_holder: np.ndarray  # object (str; "" in an analysis of shares only)
    wakeup: np.ndarray
    irq: np.ndarray
    throttled: np.ndarray
    throttled_wakeup: np.ndarray
    # (PREEMPTED) a vCPU that held the pCPU while a blank waited, one row per blank and vCPU, by blank and then in
    # the order of the vCPUs' timelines: the blank's row, whether it is of the same VM, its vCPU id, its VM, how long
    held_blank: np.ndarray
    held_same_vm: np.ndarray  # bool
    held_vcpu: np.ndarray
    held_vm: np.ndarray  # object (str)
    held_ns: np.ndarray
    # (PREEMPTED) a task that is no vCPU and held the pCPU while a blank waited, one row per recorded switch to it,
    # by blank and then in time order: the blank's row, the task, how long (several rows of one task add)
    host_blank: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    host_holder: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    host_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    def take(self, rows: np.ndarray) -> BlankTable:
        """The blanks `rows` (ascending), before any holder is known."""
        assert not len(self.held_blank) and not len(self.host_blank)
        return replace(self, **{f.name: getattr(self, f.name)[rows] for f in fields(self)
                                if not f.name.startswith(("held_", "host_"))})

    def bounds(self, count: int) -> np.ndarray:
        """Where each of `count` timelines' rows begin, and (last) where the table ends."""
        return np.searchsorted(self.timeline, np.arange(count + 1))

    def blanks(self, lo: int, hi: int) -> list[Blank]:
        """The rows [lo, hi) as Blank objects (one vCPU's, for the screens and reports that read blanks one by one)."""
        def opt(a: np.ndarray) -> list[int | None]:
            return [None if t == NO_TIME else t for t in a[lo:hi].tolist()]

        out = [Blank(*row) for row in zip(
            *(getattr(self, c)[lo:hi].tolist() for c in ("start", "end")),
            [BLANK_KINDS[k] for k in self.kind[lo:hi].tolist()],
            *(getattr(self, c)[lo:hi].tolist() for c in ("exit_reason", "cpu", "first_holder")),
            [None] * (hi - lo), [None] * (hi - lo), [None] * (hi - lo),
            opt(self.wakeup), self.irq[lo:hi].tolist(), opt(self.throttled), opt(self.throttled_wakeup), strict=True)]
        a, z = np.searchsorted(self.held_blank, [lo, hi]).tolist()
        for row, same, vcpu, vm, ns in zip(*(getattr(self, c)[a:z].tolist() for c in (
                "held_blank", "held_same_vm", "held_vcpu", "held_vm", "held_ns")), strict=True):
            b = out[row - lo]
            if same:
                b._same_vm = _plus(b._same_vm, vcpu, ns)
            else:
                b._other_vm = _plus(b._other_vm, vm, ns)
        a, z = np.searchsorted(self.host_blank, [lo, hi]).tolist()
        for row, holder, ns in zip(*(getattr(self, c)[a:z].tolist() for c in ("host_blank", "host_holder", "host_ns")),
                                   strict=True):
            b = out[row - lo]
            b._host = _plus(b._host, holder, ns)
        return out


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


def steal_split(table: BlankTable, units: np.ndarray,
                carried: list[dict[Cause, float]] | None = None) -> list[dict[Cause, float]]:
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

    carried: each timeline's split of the blanks before the table's (analyse/stream_sched.py: a recording's blanks
    a piece at a time), added on in the same order: the split of all of them is that of one table of all of them.
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
    idle = kind[r] == IDLE
    parts += [(r, 0, np.where(idle, _IDLE, _BLOCKED), slept), (r, 1, _THROTTLED, thr)]
    rest = n[r] - slept - thr
    more = n[r] > slept + thr
    parts.append((r[more], 2, np.where(idle, _WAKEUP, _OUTSIDE)[more], rest[more]))
    # halted: idle until the wake-up
    r = np.flatnonzero(~woken_throttled & (kind == IDLE))
    wake = table.wakeup[r]
    woken = np.where(wake == NO_TIME, 0, table.end[r] - wake) / u[r]
    parts += [(r, 0, _IDLE, n[r] - woken), (r[woken != 0], 1, _WAKEUP, woken[woken != 0])]
    # preempted: by each vCPU of the same VM (in the order found), the pCPU's IRQs, the rest outside
    same = table.held_same_vm
    hb, hv, hn = table.held_blank[same], table.held_vcpu[same], table.held_ns[same]
    siblings = np.zeros(len(table), np.int64)
    np.add.at(siblings, hb, hn)
    parts.append((hb, np.arange(len(hb)) - np.searchsorted(hb, hb), len(_CAUSES) + hv, hn / u[hb]))
    r = np.flatnonzero(~woken_throttled & (kind == PREEMPTED))
    irq = np.minimum(table.irq[r], dur[r] - siblings[r]) / u[r]
    last = int(max(len(hb), 1))  # after every sibling of the blank
    parts += [(r[irq > 0], last, _IRQ, irq[irq > 0]),
              (r, last + 1, _OUTSIDE, n[r] - siblings[r] / u[r] - np.maximum(irq, 0.0))]
    # throttled, then (quota back) waiting for its pCPU
    r = np.flatnonzero(~woken_throttled & (kind == THROTTLED))
    thr_ns = table.throttled[r]
    part = np.where(thr_ns == NO_TIME, dur[r], np.minimum(thr_ns, dur[r])) / u[r]
    more = n[r] > part
    parts += [(r, 0, _THROTTLED, part), (r[more], 1, _OUTSIDE, (n[r] - part)[more])]
    r = np.flatnonzero(~woken_throttled & (kind == BLOCKED))
    parts.append((r, 0, _BLOCKED, n[r]))

    rows = np.concatenate([p[0] for p in parts])
    order_in_blank = np.concatenate([np.broadcast_to(p[1], len(p[0])) for p in parts])
    cause = np.concatenate([np.broadcast_to(p[2], len(p[0])) for p in parts]).astype(np.int64)
    value = np.concatenate([p[3] for p in parts]).astype(float)
    order = np.lexsort((order_in_blank, rows))
    before = [(tl, c, v) for tl, split in enumerate(carried or ()) for c, v in split.items()]
    siblings_before = [c[1] for _tl, c, _v in before if c[0] == RowKind.STEAL_SIBLING]
    width = len(_CAUSES) + max(int(hv.max(initial=-1)), *siblings_before, -1) + 1  # a sibling v: len(_CAUSES) + v
    key = (table.timeline[rows] * width + cause)[order]
    value = value[order]
    if before:  # first in each bin: its sum so far, to which this table's parts are added in turn
        codes = [_CAUSES.index(c) if c in _CAUSES else len(_CAUSES) + c[1] for _tl, c, _v in before]
        key = np.concatenate([np.array([tl * width for tl, _c, _v in before], np.int64) + codes, key])
        value = np.concatenate([np.array([v for _tl, _c, v in before], float), value])
    sums = np.bincount(key, value, minlength=len(units) * width)
    keys, first = np.unique(key, return_index=True)
    out: list[dict[Cause, float]] = [defaultdict(float) for _ in range(len(units))]
    for k in keys[np.lexsort((first, keys // width))].tolist():
        tl, c = divmod(k, width)
        out[tl][_CAUSES[c] if c < len(_CAUSES) else (RowKind.STEAL_SIBLING, c - len(_CAUSES))] = float(sums[k])
    return out


def steal_of_type(split: dict[Cause, float], steal_type: int) -> float:
    """The part of a split that is steal of type 1 or 2."""
    return sum(v for (kind, _v), v in split.items() if kind.steal_type == steal_type)


def clip_span(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blanks [start, end] cut to a time range [lo, hi] (timeline.Schedule._clip): their start and end there, and
    which are kept (those inside it, and those cut to a part of positive length)."""
    cut = (start < lo) | (end > hi)
    start, end = np.where(cut, start.clip(lo), start), np.where(cut, end.clip(None, hi), end)
    return start, end, ~cut | (end > start)


def irq_in_range(irq: np.ndarray, since: np.ndarray, until: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """IRQ time of runs [since, until] inside [lo, hi], known for the whole run only: F(b) - F(a), F(x) its share up
    to x rounded down, so a run's parts in adjacent spans add up to it exactly (Python ints: can pass 2^63)."""
    cut, out = np.flatnonzero((since < lo) | (until > hi)), irq.copy()
    out[cut] = [max(i * (min(u, hi) - s) // (u - s) - i * (max(s, lo) - s) // (u - s), 0) if u > s else 0
                for i, s, u in zip(irq[cut].tolist(), since[cut].tolist(), until[cut].tolist(), strict=True)]
    return out


def clip_blanks(table: BlankTable, lo: int, hi: int) -> np.ndarray:
    """A table's blanks cut to [lo, hi] in place (clip_span; the IRQ time of a cut wait in proportion, a wake-up
    before the range at its start, one at or after a blank's end there none); which are kept."""
    cut = np.flatnonzero((table.start < lo) | (table.end > hi))
    full = table.end[cut] - table.start[cut]
    start, end, keep = clip_span(table.start, table.end, lo, hi)
    table.start, table.end = start, end
    start, end = start[cut], end[cut]
    part = (end - start > 0) & (end - start < full)  # IRQ time is known for the whole wait only: its share here
    table.irq[cut[part]] = table.irq[cut[part]] * (end - start)[part] // full[part]
    for column in (table.wakeup, table.throttled_wakeup):
        w = column[cut]
        column[cut] = np.where((w == NO_TIME) | (w >= end), NO_TIME, np.maximum(w, start))
    return keep
