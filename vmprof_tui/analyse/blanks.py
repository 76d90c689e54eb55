"""The blanks of vCPUs (the intervals in which a vCPU was not on a CPU): a table of arrays, and single ``Blank``s.

At 64 CPUs there are tens of thousands of blanks a second.  Analysis builds them as one ``BlankTable`` for every
vCPU at once and the shares (timeline.steal_split) read the table; a ``Blank`` object is made only when a screen,
an export or the steal report looks at blanks one by one (VcpuTimeline.blanks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

import numpy as np

from vmprof_tui.analyse.kinds import BlankKind

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
