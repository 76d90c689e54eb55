"""One pass over an agent window for the analysis node: every VM's tables and the host's, from one streamed read.

The window is read a piece at a time (analyse/stream.py): each piece is analysed once, in full (holders and
co-stop are in the steal tables), and what the store keeps is summed in what adds: samples, and nanoseconds.
Samples are priced at the end at each vCPU thread's rate over the whole window, as the per-VM task
(tasks.analyse_window_vm, the reference its test compares against) prices them from the whole window, so the
rows are the same, with the same figures up to float rounding.

A window that cannot be read a piece at a time (stream.scan says so, or stream.WholeNeeded) is analysed whole:
one load, one analysis, every table from it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import exits
from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.blanks import (
    BLOCKED_CAUSE,
    IDLE_CAUSE,
    IRQ_CAUSE,
    PREEMPTED,
    THROTTLED_CAUSE,
    WAKEUP_CAUSE,
    BlankTable,
    steal_of_type,
)
from vmprof_tui.analyse.shares import GuestParts, Row
from vmprof_tui.analyse.steal import exits_to_vmm
from vmprof_tui.analyse.stream import PIECE_ROWS, RowColumns, StreamedAnalysis, WholeNeeded, _Rows, _Vcpu
from vmprof_tui.analyse.timeline import VcpuTimeline
from vmprof_tui.analyse.vcpu_samples import thread_sample_ns
from vmprof_tui.collect import backends
from vmprof_tui.fleet.warm import WARM
from vmprof_tui.record.bpf_records import SAMPLE_VCPU
from vmprof_tui.record.stream import scan

# samples a piece of the one pass holds: two of the window's stored stretches (its chunks are compressed two at a
# time); against stream.PIECE_ROWS, a tenth less CPU a window (each piece's setup: VM list, processes, resolver
# groups) for about 150 MB more of a worker's peak (docs/fleet.md)
WINDOW_PIECE_ROWS = 2 * PIECE_ROWS


@dataclass
class _Steal:
    """What vcpu_steal (analyse/steal.py) makes of one vCPU, in what adds over the pieces: samples by exit reason,
    in the VMM's user space, and the nanoseconds of holders, co-stop and IRQ time while it ran."""
    by_reason: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # KVM handling an exit, not polling
    vmm_user: int = 0
    holders: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    costop_ns: float = 0.0
    irq_running_ns: float = 0.0

    def add(self, an: Analysis, tl: VcpuTimeline) -> None:
        s = an.samples
        idx = an.vcpus.thread_samples(tl)
        vmm = idx[~an.is_guest[idx]]
        in_kvm = (s["flags"][vmm] & SAMPLE_VCPU) != 0
        polling = np.isin(vmm, an.vcpus.polling_samples(tl), assume_unique=True)
        for reason, n in zip(*np.unique(s["exit_reason"][vmm[in_kvm & ~polling]], return_counts=True), strict=True):
            self.by_reason[int(reason)] += int(n)
        self.vmm_user += int(np.count_nonzero(~in_kvm))
        self.costop_ns += tl.costop_ns
        self.irq_running_ns += tl.irq_running_ns


class WindowPass(StreamedAnalysis):
    """The host profile, every VM's guest profiles and each vCPU's steal sums of one window, in one pass."""

    def __init__(self, path: Path, piece_rows: int = WINDOW_PIECE_ROWS) -> None:
        scanned = scan(path)
        if scanned is None:
            raise WholeNeeded("the window cannot be read a piece at a time")
        self.steal: dict[tuple[str, int, int], _Steal] = {}  # as self.vcpus: by VM, vCPU and thread
        self.backend = scanned.rec.meta.get("backend", backends.NONE)
        super().__init__(scanned, level="all", kernel=False, shares_only=False,
                         piece_rows=piece_rows, resolver=WARM.resolver(scanned.rec))

    def _add(self, an: Analysis, lo: int) -> None:
        super()._add(an, lo)
        timelines = list(an.timelines.values())
        for tl in timelines:
            self.steal.setdefault((tl.vm, tl.vcpu, tl.tid), _Steal()).add(an, tl)
        if timelines and timelines[0].table is not None:
            for i, holder, ns in _holders(timelines[0].table, timelines):
                tl = timelines[i]
                self.steal[(tl.vm, tl.vcpu, tl.tid)].holders[holder] += ns

    def sample_s(self, vm: str, vcpu: int, tid: int) -> float:
        """What one sample of the vCPU's thread stands for over the window (VcpuSamples.sample_ns), in seconds."""
        return _unit(self.vcpus[(vm, vcpu, tid)], self.period_ns) / 1e9

    def _of_vcpu(self, vm: str, vcpu: int) -> list[_Vcpu]:
        """The threads that were this vCPU (two when two VMs of one name ran in the window), as Analysis.guest_profile
        and guest_ratios join them."""
        return [v for (v_vm, v_id, _tid), v in sorted(self.vcpus.items(), key=lambda kv: kv[1].tid)
                if (v_vm, v_id) == (vm, vcpu)]

    def profile_parts(self, vm: str, vcpu: int, tid: int) -> tuple[RowColumns | None, list[Row], float]:
        """What the reference task writes for the vCPU thread: guest_profile(vm, vcpu).rows (its function rows as
        columns, then its virtual rows), and the seconds one of the thread's samples stands for."""
        mine = self._of_vcpu(vm, vcpu)
        parts = GuestParts()
        for v in mine:
            parts.add(v.parts(self.period_ns))
        virtual = [Row(n, *kind.label(vcpu=c), None, None, vm, kind) for (kind, c), n in parts.virtual().items()]
        rows = mine[0].rows if len(mine) == 1 else _Rows.joined([v.rows for v in mine])
        return self.row_columns(rows), virtual, self.sample_s(vm, vcpu, tid)

    def vcpu_seconds(self, vm: str) -> list[dict]:
        """tasks.vcpu_seconds of the whole window, from the sums."""
        out = []
        for vcpu, tid in self.vcpu_threads(vm):
            v, st = self.vcpus[(vm, vcpu, tid)], self.steal.get((vm, vcpu, tid), _Steal())
            unit = _unit(v, self.period_ns)
            by_exit: dict[str, float] = defaultdict(float)
            for reason in sorted(st.by_reason):
                by_exit[exits.exit_category(self.backend, reason)] += float(st.by_reason[reason]) * unit
            to_vmm = exits_to_vmm(self.rec, v.tid)
            total_exits = sum(to_vmm.values())
            if st.vmm_user and total_exits:
                for name, n in to_vmm.items():
                    by_exit[f"vmm user space ({name})"] += float(st.vmm_user) * unit * n / total_exits
            elif st.vmm_user:
                by_exit["vmm user space"] += float(st.vmm_user) * unit
            split = v.blank_ns
            if blocked := split.get(BLOCKED_CAUSE, 0.0):
                by_exit["vmm blocked"] += blocked
            type1 = steal_of_type(split, 1)
            causes = {"wakeup": split.get(WAKEUP_CAUSE, 0.0), "throttled": split.get(THROTTLED_CAUSE, 0.0),
                      "irq": split.get(IRQ_CAUSE, 0.0)}
            causes["preempted"] = type1 - sum(causes.values())
            poll_ns = float(v.polling) * unit if v.exact_poll_ns is None else float(v.exact_poll_ns)
            joined = GuestParts()  # the vCPU's shares (guest_ratios: of all its threads)
            for other in self._of_vcpu(vm, vcpu):
                joined.add(other.parts(self.period_ns))
            shares = joined.ratios()
            guest_s = float(v.kernel + v.user) * unit / 1e9
            in_guest = shares["os"] + shares["user"]
            guest_kernel_s = guest_s * shares["os"] / in_guest if in_guest else 0.0
            out.append({"vcpu": vcpu, "guest_user": max(guest_s - guest_kernel_s, 0.0), "guest_kernel": guest_kernel_s,
                        "idle": split.get(IDLE_CAUSE, 0.0) / 1e9, "steal_type1": type1 / 1e9,
                        "steal_type2": float(sum(by_exit.values())) / 1e9,
                        "type1_by_holder": _by_size(st.holders), "type2_by_exit": _by_size(by_exit),
                        "type1_by_cause": {k: n / 1e9 for k, n in causes.items()},
                        "skew": st.costop_ns / 1e9, "halt_poll": poll_ns / 1e9,
                        "irq_while_running": st.irq_running_ns / 1e9})
        return out


def _holders(table: BlankTable, timelines: list[VcpuTimeline]) -> Iterator[tuple[int, str, float]]:
    """(timeline, holder, ns) of the preempted blanks of the table, as Blank.holders gives them blank by blank (the
    vCPUs of its VM, other VMs, host tasks, and the first holder for the rest of the blank), summed by timeline and
    holder in the order each pair first comes (the order the steal tables list holders of equal time in)."""
    owner = np.full(len(table), -1, np.int64)
    for i, tl in enumerate(timelines):
        owner[tl.rows[0]:tl.rows[1]] = i
    preempted = (table.kind == PREEMPTED) & (owner >= 0)
    held = np.zeros(len(table), np.int64)
    same, vcpu, vm = table.held_same_vm, table.held_vcpu, table.held_vm
    if len(same):  # "vcpuN" made once per vCPU id, not per row
        ids, of_row = np.unique(vcpu, return_inverse=True)
        keys = np.where(same, np.array([f"vcpu{v}" for v in ids.tolist()], object)[of_row.reshape(-1)], vm)
    else:
        keys = vm
    parts = []
    for rows, names, ns in ((table.held_blank, keys, table.held_ns), (table.host_blank, table.host_holder,
                                                                        table.host_ns)):
        mine = preempted[rows]
        rows, names, ns = rows[mine], names[mine], ns[mine]
        np.add.at(held, rows, ns)
        parts.append((owner[rows], names, ns))
    rest = np.where(preempted, table.duration - held, 0)
    at = np.flatnonzero(rest > 0)
    parts.append((owner[at], table.first_holder[at], rest[at]))
    who, names, ns = (np.concatenate([p[k] for p in parts]) for k in range(3))
    if not len(who):
        return
    code_of: dict[str, int] = {}  # names by code (a dict: sorting the strings cost more), any code a name
    name_code = np.fromiter((code_of.setdefault(str(n), len(code_of)) for n in names.tolist()), np.int64, len(names))
    distinct = np.array(list(code_of), object)
    pairs, first, inverse = arrays.unique(who << 32 | name_code, return_index=True, return_inverse=True)
    # int nanoseconds summed in float64: exact (below 2**53), as the sums blank by blank were
    total = np.bincount(inverse, weights=ns.astype(np.float64), minlength=len(pairs))
    order = np.argsort(first, kind="stable")
    yield from zip((pairs[order] >> 32).tolist(), distinct[pairs[order] & 0xFFFFFFFF].tolist(), total[order].tolist(),
                   strict=True)


def _unit(v: _Vcpu, period_ns: float) -> float:
    return thread_sample_ns(v.samples, v.on_cpu_ns, v.polling, v.exact_poll_ns, period_ns)


def _by_size(ns: dict[str, float]) -> dict[str, float]:
    """In seconds, the largest first (as vcpu_steal gives them)."""
    return {k: n / 1e9 for k, n in sorted(ns.items(), key=lambda kv: -kv[1])}
