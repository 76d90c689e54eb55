"""`vmprof steal`: steal and idle per VM and vCPU, type 1 (by cause: preempted, wake-up wait,
throttled, IRQ) vs type 2 (by exit reason), who stole, co-stop, halt polling, the host's own
run-queue wait beside vmprof's, and corrected execution times beside apparent ones.

The split of blank time by cause is analyse.blanks.steal_split (the guest
profile uses the same); this module adds the breakdowns by exit reason and by
who held the pCPU, in seconds of each vCPU's wall time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse import blanks as bt
from vmprof_tui.analyse import exits
from vmprof_tui.analyse.analysis import Analysis, Attribution
from vmprof_tui.analyse.blanks import (
    BLOCKED_CAUSE,
    IDLE_CAUSE,
    IRQ_CAUSE,
    THROTTLED_CAUSE,
    WAKEUP_CAUSE,
    Blank,
    Cause,
    steal_of_type,
)
from vmprof_tui.analyse.kinds import BlankKind
from vmprof_tui.analyse.timeline import VcpuTimeline
from vmprof_tui.record.bpf_records import SAMPLE_VCPU
from vmprof_tui.record.recording import Recording


def attributions(an: Analysis, vm: str, per_function: bool = True) -> list[Attribution]:
    """Per vCPU and (process, function) — or per process — its real samples, and the steal that sat
    between two of its consecutive samples (thesis §3.4.2)."""
    s = an.samples
    out: list[Attribution] = []
    for tl in sorted(an.vm_timelines(vm), key=lambda t: t.vcpu):
        mine = an.vcpus.thread_samples(tl)
        sel = mine[an.is_guest[mine]]
        if not len(sel):
            continue
        keys = (an.key if per_function else an.proc_key)[sel]
        steal = np.zeros((2, int(keys.max()) + 1))
        table, (lo, hi) = tl.table, tl.rows
        steals = lo + np.flatnonzero(table.kind[lo:hi] != bt.IDLE)
        if len(steals):
            times = s["time_ns"][sel].astype(np.int64)
            starts, ends = table.start[steals], table.end[steals]
            type1 = table.kind[steals] != bt.BLOCKED
            before = np.searchsorted(times, starts, side="right") - 1
            after = np.searchsorted(times, ends, side="left")
            ok = (before >= 0) & (after < len(times))
            before, after, type1 = before[ok], after[ok], type1[ok]
            dur = (ends - starts)[ok].astype(float)
            same = keys[before] == keys[after]
            np.add.at(steal[0], keys[before][same], dur[same])
            np.add.at(steal[1], keys[before][same & type1], dur[same & type1])
        # Run time comes from the exact on-CPU time of the vCPU thread, split by the samples, so a
        # sampling interrupt that never came does not shorten anybody's time.
        ns_per_sample = an.vcpus.sample_ns(tl)
        # the VMM/KVM at work (steal of type 2, on the CPU) between two of its samples is steal too
        vmm = mine[~an.is_guest[mine]]
        before = np.searchsorted(sel, vmm) - 1  # sample indices are in time order
        ok = (before >= 0) & (before + 1 < len(sel))
        before = before[ok]
        same = keys[before] == keys[before + 1]
        np.add.at(steal[0], keys[before][same], ns_per_sample)
        uniq, first, counts = arrays.first_and_counts(keys, len(steal[0]))
        at = sel[first]  # the names of each group's first sample, as row() gives them
        funcs = an.func[at].tolist() if per_function else [""] * len(at)
        modules = an.module[at].tolist() if per_function else [""] * len(at)
        out += [Attribution(p, f, m, tl.vcpu, c, c * ns_per_sample, s0, s1)
                for p, f, m, c, s0, s1 in zip(an.process[at].tolist(), funcs, modules, counts.tolist(),
                                              steal[0, uniq].tolist(), steal[1, uniq].tolist(), strict=True)]
    return sorted(out, key=lambda a: -a.apparent_ns)


def host_run_delay(rec: Recording, tl: VcpuTimeline) -> tuple[int, int, int] | None:
    """(from, to, ns): the run-queue wait the host's own scheduler counted for the vCPU thread between two
    readings of /proc schedstat (the session's first and last), or None when the recording has none."""
    for vm in rec.vms():
        if int(vm.get("pid", -1)) == tl.pid:
            r = (vm.get("run_delay_ns") or {}).get(str(tl.tid))
            if r and len(r) == 4 and r[2] > r[0]:
                return int(r[0]), int(r[2]), int(r[3]) - int(r[1])
    return None


def type1_by_cause_between(tl: VcpuTimeline, lo: int, hi: int) -> dict[str, float]:
    """vmprof's steal of type 1 by cause, in ns, over [lo, hi) only (to set beside the host's readings)."""
    out = {"wakeup": 0.0, "throttled": 0.0, "irq": 0.0, "preempted": 0.0}
    add_type1_by_cause(out, tl.blanks, lo, hi)
    return out


def add_type1_by_cause(out: dict[str, float], blanks: list[Blank], lo: int, hi: int) -> None:
    """type1_by_cause_between of some blanks added to `out`, blank by blank (of a vCPU's blanks in turn, a piece
    at a time: analyse/stream_steal.py)."""
    def inside(a: int, b: int) -> int:
        return max(0, min(b, hi) - max(a, lo))

    for b in blanks:
        iv = b.throttled_interval()
        if iv is not None:  # throttled (from the start, or from a wake-up), then waiting for its pCPU
            out["throttled"] += inside(*iv)
            out["wakeup" if b.kind == BlankKind.IDLE else "preempted"] += inside(iv[1], b.end_ns)
        elif b.kind == BlankKind.IDLE and b.wakeup_ns is not None:
            out["wakeup"] += inside(b.wakeup_ns, b.end_ns)
        elif b.kind == BlankKind.PREEMPTED and b.duration_ns:
            part = inside(b.start_ns, b.end_ns)
            irq = b.irq_ns * part / b.duration_ns  # IRQ time spread evenly over the wait
            out["irq"] += irq
            out["preempted"] += part - irq


def exits_to_vmm(rec: Recording, tid: int) -> dict[str, int]:
    """How often KVM_RUN returned to the VMM for this vCPU thread during the recording, by kvm_run exit reason
    (recorded by the sched program; empty for recordings made before it counted them)."""
    counts = ((rec.end or {}).get("vmm_exits") or {}).get(str(tid)) or {}
    out: dict[str, int] = {}
    for reason, n in counts.items():
        name = exits.KVM_RUN_EXITS.get(int(reason), f"exit {reason}")
        out[name] = out.get(name, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclass
class VcpuCounts:
    """What vcpu_steal reads of a vCPU thread's samples, in counts that add across pieces of a recording
    (analyse/stream_steal.py sums them): its samples, those in guest mode, those of KVM polling the halted vCPU,
    per exit reason those of KVM handling an exit (not polling), and those of the VMM in user space."""
    samples: int = 0
    guest: int = 0
    polling: int = 0
    exits: dict[int, int] = field(default_factory=dict)
    vmm_user: int = 0

    def add(self, other: VcpuCounts) -> None:
        self.samples += other.samples
        self.guest += other.guest
        self.polling += other.polling
        self.vmm_user += other.vmm_user
        for reason, n in other.exits.items():
            self.exits[reason] = self.exits.get(reason, 0) + n


def vcpu_counts(an: Analysis, idx: np.ndarray, polled: np.ndarray) -> VcpuCounts:
    """The counts of one vCPU thread's samples `idx` (ascending), of which `polled` caught KVM polling."""
    s = an.samples
    guest = an.is_guest[idx]
    vmm = idx[~guest]
    in_kvm = (s["flags"][vmm] & SAMPLE_VCPU) != 0  # vCPU loaded: KVM handling an exit; else the VMM in user space
    exiting = vmm[in_kvm & ~arrays.member(vmm, polled)]
    reasons, n = np.unique(s["exit_reason"][exiting], return_counts=True)
    return VcpuCounts(len(idx), int(np.count_nonzero(guest)), len(polled),
                      dict(zip(reasons.tolist(), n.tolist(), strict=True)), int(np.count_nonzero(~in_kvm)))


def vcpu_steal(an: Analysis, vm: str) -> list[dict]:
    """Per vCPU of `vm`: guest, idle and steal time, type 1 by cause and by who held the pCPU, type 2 by
    exit reason, co-stop, halt polling, and the host's own run-queue wait beside vmprof's."""
    out = []
    for tl in sorted(an.vm_timelines(vm), key=lambda t: t.vcpu):
        counts = vcpu_counts(an, an.vcpus.thread_samples(tl), an.vcpus.polling_samples(tl))
        out.append(vcpu_entry(an.rec, an.backend, tl, counts, an.vcpus.sample_ns(tl), an.blank_split(tl, in_ns=True),
                              an.vcpus.poll_ns(tl)))
    return out


def blank_parts(rec: Recording, tl: VcpuTimeline) -> tuple[dict[str, float], dict[str, float]]:
    """What vcpu_entry reads of a vCPU's blanks one by one: who held its pCPU while it was preempted (ns by holder,
    in the order found), and its steal of type 1 by cause over the host's run-queue readings (None: none)."""
    who: dict[str, float] = defaultdict(float)
    add_holders(who, tl.blanks)
    host = host_run_delay(rec, tl)
    return who, type1_by_cause_between(tl, host[0], host[1]) if host else {}


def add_holders(who: dict[str, float], blanks: list[Blank]) -> None:
    """Who held the pCPU while each of `blanks` waited preempted, added to `who` (ns by holder) blank by blank."""
    for b in blanks:
        if b.kind == BlankKind.PREEMPTED:
            for holder, ns in b.holders().items():
                who[holder] += ns


def vcpu_entry(rec: Recording, backend: str, tl: VcpuTimeline, counts: VcpuCounts, period: float,
               split: dict[Cause, float], poll_ns: float,
               parts: tuple[dict[str, float], dict[str, float]] | None = None) -> dict:
    """One vCPU's entry of vcpu_steal from its timeline, its samples' counts, the on-CPU time one of its samples
    stands for (`period`: so that guest time, type 2 and polling add up to the exact on-CPU time), its blank time
    by cause in ns, its halt polling in ns, and blank_parts of its timeline (None: found here)."""
    guest_ns = float(counts.guest) * period
    by_exit: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for reason, n in sorted(counts.exits.items()):
        by_exit[exits.exit_category(backend, int(reason))] += float(n) * period
        by_name[exits.exit_name(backend, int(reason))] += float(n) * period
    vmm_user = counts.vmm_user
    to_vmm = exits_to_vmm(rec, tl.tid)
    total_exits = sum(to_vmm.values())
    if vmm_user and total_exits:
        # what the VMM did in user space, shared among the exits it served by their counts
        for name, n in to_vmm.items():
            by_exit[f"vmm user space ({name})"] += float(vmm_user) * period * n / total_exits
    elif vmm_user:
        by_exit["vmm user space"] += float(vmm_user) * period
    idle = split.get(IDLE_CAUSE, 0.0)
    blocked = split.get(BLOCKED_CAUSE, 0.0)
    if blocked:
        by_exit["vmm blocked"] += blocked
    who, mine_then = parts or blank_parts(rec, tl)
    type1 = steal_of_type(split, 1)
    type2 = float(sum(by_exit.values()))
    wall = float(tl.wall_ns) or 1.0
    causes = {"wakeup": split.get(WAKEUP_CAUSE, 0.0), "throttled": split.get(THROTTLED_CAUSE, 0.0),
              "irq": split.get(IRQ_CAUSE, 0.0)}
    causes["preempted"] = type1 - sum(causes.values())  # by a sibling vCPU or anything outside the VM
    host = host_run_delay(rec, tl)
    return {
        "vcpu": tl.vcpu, "tid": tl.tid, "wall_s": wall / 1e9, "on_cpu_s": tl.on_cpu_ns / 1e9,
        "guest_s": guest_ns / 1e9, "idle_s": idle / 1e9, "steal_type1_s": type1 / 1e9,
        "steal_type2_s": type2 / 1e9,
        "ratios": _ratios(wall, guest_ns, idle, type1, type2, causes, tl.costop_ns, poll_ns),
        "type1_by_cause_s": {k: v / 1e9 for k, v in causes.items()},
        "type1_by_holder_s": {k: v / 1e9 for k, v in sorted(who.items(), key=lambda kv: -kv[1])},
        "type2_by_exit_s": {k: v / 1e9 for k, v in sorted(by_exit.items(), key=lambda kv: -kv[1])},
        "type2_in_kvm_by_exit_name_s": {k: v / 1e9 for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])},
        **({"exits_to_vmm": to_vmm} if to_vmm else {}),  # a recording's (not a live window's)
        # co-stop: waiting for a pCPU while a sibling vCPU ran (on any pCPU; part of type 1)
        "skew_s": tl.costop_ns / 1e9,
        # IRQ time of its pCPU while it ran: inside its guest time, taken from the guest all the same
        "irq_while_running_s": tl.irq_running_ns / 1e9,
        # KVM polling halts (sched events: exact; samples: KVM with the vCPU halted)
        "halt_poll_s": poll_ns / 1e9, "halts": tl.halts, "halts_ended_by_polling": tl.halt_polls_ok,
        # what KVM reports to the guest as steal: run-queue delay of the vCPU thread
        "host_reported_steal_s": type1 / 1e9,
        # the host's own count of that delay (schedstat) between the session's first and last reading of
        # it, and vmprof's type 1 by cause over the same span; None when the recording has no readings
        "host_run_delay": None if host is None else {
            "span_s": (host[1] - host[0]) / 1e9, "host_s": host[2] / 1e9,
            "vmprof_type1_by_cause_s": {k: v / 1e9 for k, v in mine_then.items()},
            "difference_s": (host[2] - sum(mine_then.values())) / 1e9},
    }


def _ratios(wall: float, guest: float, idle: float, type1: float, type2: float, causes: dict[str, float],
            costop: float, poll: float) -> dict[str, float]:
    """A vCPU's shares of its wall time, in %, from its times (all in one unit)."""
    return {"guest": 100 * guest / wall, "idle": 100 * idle / wall,
            "steal": 100 * (type1 + type2) / wall, "steal_type1": 100 * type1 / wall, "steal_type2": 100 * type2 / wall,
            **{f"steal_{k}": 100 * n / wall for k, n in causes.items()},
            "skew": 100 * costop / wall, "halt_poll": 100 * poll / wall}  # "skew": the output key of co-stop


_ADDED = ("wall_s", "on_cpu_s", "guest_s", "idle_s", "steal_type1_s", "steal_type2_s", "skew_s", "irq_while_running_s",
          "halt_poll_s", "halts", "halts_ended_by_polling", "host_reported_steal_s")
_ADDED_BY = ("type1_by_cause_s", "type1_by_holder_s", "type2_by_exit_s", "type2_in_kvm_by_exit_name_s")


def add_vcpu_steal(spans: list[list[dict]]) -> list[dict]:
    """vcpu_steal of back-to-back spans (the live screen's chunks) as one: times and breakdowns add, shares are of
    the summed wall time; the host's run-queue readings are of a recording, not of a window (None)."""
    out: dict[int, dict] = {}
    for span in spans:
        for v in span:
            total = out.get(v["vcpu"])
            if total is None:
                out[v["vcpu"]] = {**v, **{k: dict(v[k]) for k in _ADDED_BY}, "host_run_delay": None}
                continue
            total["tid"] = v["tid"]
            for k in _ADDED:
                total[k] += v[k]
            for k in _ADDED_BY:
                for name, n in v[k].items():
                    total[k][name] = total[k].get(name, 0.0) + n
    for v in out.values():
        for k in _ADDED_BY[1:]:  # by holder and by exit: the largest first, as vcpu_steal gives them
            v[k] = dict(sorted(v[k].items(), key=lambda kv: -kv[1]))
        v["ratios"] = _ratios(*(v[k] for k in ("wall_s", "guest_s", "idle_s", "steal_type1_s", "steal_type2_s",
                                                "type1_by_cause_s", "skew_s", "halt_poll_s")))
    return [out[k] for k in sorted(out)]


def steal_report(an: Analysis, vm: str) -> dict:
    return report_of(vm, vcpu_steal(an, vm), attributions(an, vm, per_function=False), attributions(an, vm),
                     an.notes)


def report_of(vm: str, vcpus: list[dict], processes: list[Attribution], functions: list[Attribution],
              notes: list[str]) -> dict:
    """`vmprof steal`'s report of a VM from its vCPUs' entries and its attributions per process and function."""
    def corrected(a: Attribution) -> dict:
        apparent = a.apparent_ns
        return {"process": a.process, "function": a.function, "module": a.module, "vcpu": a.vcpu,
                "samples": a.samples, "apparent_s": apparent / 1e9, "attributed_steal_s": a.steal_ns / 1e9,
                "corrected_s": (apparent - a.steal_ns) / 1e9,
                # what a guest could do with the steal the host reports to it: subtract the run-queue wait
                "host_steal_corrected_s": (apparent - a.steal_type1_ns) / 1e9}

    return {"vm": vm, "vcpus": vcpus, "processes": [corrected(a) for a in processes],
            "functions": [corrected(a) for a in functions], "notes": notes}
