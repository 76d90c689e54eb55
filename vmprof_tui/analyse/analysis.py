"""Analysis on the one host time axis: profiles, blank time, steal attribution.

record → resolve → **analyse**: every sample is resolved once (resolve/resolver.py),
then

* the host level counts real samples: host kernel, host processes, and one
  row per VM for the samples that interrupted its guests;
* the guest level of a VM builds, per vCPU, the "virtual guest sampling data"
  of thesis §2.3.5/§3.4: the real samples of its vCPU threads plus, for every
  interval the vCPU was not on a CPU (from the sched events), virtual samples
  at the sampling frequency, classified as idle (the vCPU was halted),
  steal by another vCPU of the same VM (``on vcpuN``), steal by anything
  else (``outside``), or steal while the VMM blocked on the vCPU's behalf.
  Samples of a vCPU thread outside guest mode are steal of type 2 (the VMM
  or KVM worked for the vCPU), broken down by exit-reason category.
* Steal between two guest samples of the same process and function is
  attributed to it (thesis §3.4.2): corrected time = apparent − attributed.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.blanks import Cause, steal_split
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import (
    GuestParts,
    GuestSummary,
    HostParts,
    HostSummary,
    Profile,
    Row,
    RowCounts,
    SpanSummary,
    guest_summary,
)
from vmprof_tui.analyse.timeline import Schedule, VcpuTimeline
from vmprof_tui.analyse.vcpu_samples import VcpuSamples
from vmprof_tui.collect import backends
from vmprof_tui.record.bpf_records import (
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HOST_KERNEL,
)
from vmprof_tui.record.recording import Recording
from vmprof_tui.resolve.prepare import Prepared, prepare
from vmprof_tui.resolve.resolver import Resolved, Resolver


def in_kernel(samples: np.ndarray) -> np.ndarray:
    """The samples taken in kernel mode: the guest's kernel for guest samples, the host's for the others."""
    return kernel_mode(samples["flags"])


def kernel_mode(flags: np.ndarray) -> np.ndarray:
    """in_kernel of the samples' flags."""
    return np.where((flags & SAMPLE_GUEST) != 0, (flags & SAMPLE_GUEST_KERNEL) != 0, (flags & SAMPLE_HOST_KERNEL) != 0)


@dataclass
class _GuestShares:
    """What a guest profile's shares are made of: its guest-mode samples (a mask) and its parts."""
    real_guest: np.ndarray
    parts: GuestParts


@dataclass
class _HostShares:
    """What the host profile's shares are made of: the samples selected (a CPU or all), host and VM masks."""
    selected: np.ndarray
    host: np.ndarray
    guest: np.ndarray
    idle_virtual: float
    parts: HostParts


@dataclass
class Attribution:
    process: str
    function: str  # "" when attributed per process
    module: str
    vcpu: int
    samples: int  # real guest samples
    run_ns: float  # its share of the vCPU's exact on-CPU time (sched events), split by samples
    steal_ns: float  # steal that sat between two of its samples
    steal_type1_ns: float  # the part of it the host reports to guests (run-queue wait)

    @property
    def apparent_ns(self) -> float:
        return self.run_ns + self.steal_ns




class _PerSample:
    """A per-sample name column of an Analysis (func, module, process, proc_pid), made from its Resolved when first
    read and kept (a streamed piece reads none of them)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, an: Analysis | None, owner: type | None = None) -> np.ndarray:
        if an is None:  # read on the class (help(), introspection): the descriptor itself
            return self  # type: ignore[return-value]
        column = an.__dict__[self.name] = getattr(an._resolved, self.name)
        return column


class Analysis:
    """Everything derived from one recording (and the guest bundles that name its guests)."""

    func, module, process, proc_pid = _PerSample(), _PerSample(), _PerSample(), _PerSample()

    # the per-sample keys of profile rows are made with the analysis unless shares_only (else when first read: a
    # streamed piece, analyse/stream.py, sums its rows by name code, row_counts_of, and reads none)
    eager_keys = True

    def __init__(self, prepared: Prepared, shares_only: bool = False) -> None:
        """prepared: the recording's samples made ready by the resolve stage (resolve/prepare.py).
        shares_only: the timelines carry what the shares need and no more (the live screen's chunk summaries):
        no holder of each blank, no co-stop."""
        self.shares_only = shares_only
        rec = self.rec = prepared.rec
        self.frequency = int(rec.meta.get("frequency", 1000))
        self.period_ns = 1e9 / self.frequency
        self.backend = rec.meta.get("backend", backends.NONE)
        self.samples, self.sched, self.wake_events = prepared.samples, prepared.sched, prepared.wake_events
        self.range_ns: tuple[int, int] | None = prepared.range_ns
        self._span = prepared.span
        self._profiles: dict[tuple, Profile] = {}
        self._shares: dict[tuple[str, int | None], _GuestShares] = {}
        self._host_share_cache: dict[int | None, _HostShares] = {}
        self._summaries: dict[tuple, HostSummary | GuestSummary] = {}
        self._splits: dict[bool, dict[int, dict[Cause, float]]] = {}  # blank_split: in ns? -> vCPU thread -> ...
        self.notes: list[str] = prepared.notes
        self.vm_by_pid = prepared.vms.by_pid
        self.vm_index = prepared.vms.index
        self.vcpu_of_tid = prepared.vms.vcpu_of_tid  # tid -> (vmm pid, vcpu id)
        self.is_guest = prepared.is_guest  # the samples that interrupted a guest
        self.resolver = prepared.resolver
        self.vcpus = VcpuSamples(self.samples, self.is_guest, self.vcpu_of_tid, self.period_ns)
        self.derived: dict[str, object] = {}  # what other analyse modules derive from it once (the call graph)
        self._names(prepared.names)

    @functools.cached_property
    def timelines(self) -> dict[int, VcpuTimeline]:
        """Per vCPU thread id: its timeline (built when first asked for: the host level needs none)."""
        return self._schedule.timelines(self.vcpus.positions, self.samples["time_ns"])

    @functools.cached_property
    def _schedule(self) -> Schedule:
        return Schedule(self.sched, self.wake_events, self.vcpu_of_tid, self.vm_by_pid, self.span(), self.range_ns,
                        self.shares_only)

    # -- names ----------------------------------------------------------------------------
    def _names(self, g: Resolved) -> None:
        """The per-sample names as the analysis groups them: VM codes, and (unless only shares are asked for) the
        dense keys of profile rows."""
        s = self.samples
        pid = s["pid"].astype(np.int64)
        vmm_pids = np.array(sorted(self.vm_by_pid), np.int64)
        at = np.searchsorted(vmm_pids, pid).clip(0, max(len(vmm_pids) - 1, 0))
        is_vmm = vmm_pids[at] == pid if len(vmm_pids) else np.zeros(len(s), bool)
        names = [self.vm_by_pid[p] for p in vmm_pids.tolist()]
        self.vm_code = np.where(is_vmm, np.array([self.vm_index[n] for n in names] + [0], np.int32)[at], 0)
        self.vm_name_of_code = np.full(max(self.vm_index.values(), default=0) + 1, "", object)  # 0: no VM
        for name, code in self.vm_index.items():
            self.vm_name_of_code[code] = name
        guest = self.is_guest
        self._resolved = g  # its per-sample names are made when first read (func, module, process, proc_pid)
        self.unresolved = g.unresolved()
        # What a VM's host-level row counts: the time its vCPU threads held a CPU (guest code, and KVM and
        # the VMM working on the vCPU's behalf).  Other VMM threads are ordinary host rows.
        self.in_vm = guest.copy()
        vmm = np.flatnonzero(is_vmm & ~guest)  # a vCPU thread is a VMM's
        self.in_vm[vmm] = arrays.member(pid[vmm] << 32 | s["tid"][vmm], self.vcpus.keys())
        # a live chunk's summary groups its samples by name code and needs no keys (made if something asks)
        self._codes = g
        if self.eager_keys and not self.shares_only:
            self._encode_keys()

    @property
    def key(self) -> np.ndarray:
        self._encode_keys()
        return self._key

    @property
    def proc_key(self) -> np.ndarray:
        self._encode_keys()
        return self._proc_key

    def _encode_keys(self) -> None:
        """One integer per sample for its (vm, process, pid) and for its (vm, process, pid, function, module):
        grouping without Python loops (made once: the name codes are then let go)."""
        if self._codes is None:
            return
        g, self._codes = self._codes, None  # their memory is freed: int64 per sample each
        def dense(code: np.ndarray) -> np.ndarray:
            """Rank of each key among the distinct keys (np.unique's inverse; by a table where keys are few)."""
            key = self.vm_code.astype(np.int64) * (int(code.max()) + 1 if len(code) else 1) + code
            ranks = arrays.dense_ranks(key)
            return ranks if ranks is not None else arrays.unique(key, return_inverse=True)[1].astype(np.int32)
        # int32: these and the other per-sample arrays are most of a large report's memory
        self._proc_key = dense(g.proc_code)
        self._key = dense(g.name_code)
        self.key_count = int(self._key.max()) + 1 if len(self._key) else 0
        self.name_code_of_key = np.zeros(self.key_count, np.int64)  # the resolver's code of each key's name
        self.name_code_of_key[self._key] = g.name_code
        self.proc_code_of_proc_key = np.zeros(int(self._proc_key.max(initial=-1)) + 1, np.int64)  # and process's
        self.proc_code_of_proc_key[self._proc_key] = g.proc_code

    # -- timelines -------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        if self.range_ns is not None:
            return (self.range_ns[1] - self.range_ns[0]) / 1e9
        return self.rec.duration_s

    def span(self) -> tuple[int, int]:
        if self.range_ns is not None:
            return self.range_ns
        return self._span

    # -- profiles --------------------------------------------------------------------
    def row(self, i: int, samples: float) -> Row:
        """The names of sample i as a Row of `samples`."""
        pid = int(self.proc_pid[i])
        return Row(samples, str(self.func[i]), str(self.module[i]), str(self.process[i]) or None,
                   pid if pid >= 0 else None, self.vm_name_of_code[self.vm_code[i]] or None,
                   RowKind.UNKNOWN if self.unresolved[i] else RowKind.FUNCTION)

    def aggregate(self, sel: np.ndarray) -> list[Row]:
        """One Row per distinct (vm, process, pid, function, module) among the selected samples (as row()
        makes them, from the names of each group's first sample)."""
        idx = np.nonzero(sel)[0]
        keys, first, counts = arrays.first_and_counts(self.key[idx], self.key_count)
        # each row's kernel-mode samples: what a filtered profile's OS:USER split is made of
        in_kernel_mode = idx[kernel_mode(self.samples["flags"][idx])]
        kernel_keys, kernel_counts = arrays.counts_of(self.key[in_kernel_mode], self.key_count)
        kernel = np.zeros(len(keys))
        kernel[np.searchsorted(keys, kernel_keys)] = kernel_counts
        at = idx[first]
        pids = self.proc_pid[at]
        kinds = np.where(self.unresolved[at], 1, 0)
        vms = self.vm_name_of_code[self.vm_code[at]]
        kind_of = (RowKind.FUNCTION, RowKind.UNKNOWN)
        return [Row(c, str(f), str(m), str(p) or None, pid if pid >= 0 else None, vm or None, kind_of[k], kc)
                for c, f, m, p, pid, vm, k, kc in zip(counts.astype(float).tolist(), self.func[at].tolist(),
                                                       self.module[at].tolist(), self.process[at].tolist(),
                                                       pids.tolist(), vms.tolist(), kinds.tolist(),
                                                       kernel.astype(float).tolist(), strict=True)]

    def cpu_idle_ns(self) -> dict[int, int]:
        """Idle time per CPU from switches to and from the idle task (exact, unlike idle samples); none in a
        recording of one process (record -p): its ratios are of that process's own samples."""
        return self._cpu_idle[0]

    @functools.cached_property
    def _cpu_idle(self) -> tuple[dict[int, int], set[int]]:
        """cpu_idle_ns, and the CPUs of it idle from the start (Schedule.cpu_idle_ns)."""
        filters = self.rec.meta.get("filters")
        if isinstance(filters, dict) and filters.get("pid") is not None:
            return {}, set()
        at_start: set[int] = set()
        return self._schedule.cpu_idle_ns(at_start), at_start

    def host_profile(self, cpu: int | None = None) -> Profile:
        key = ("host", cpu)
        if key in self._profiles:  # the live screen asks for the same profile several times a refresh
            return self._profiles[key]
        shares = self._host_shares(cpu)
        rows = self.aggregate(shares.host)
        for row in rows:  # host rows carry no VM, only the VMM process name
            row.vm = None
        rows += self._host_other_rows(shares)
        notes = list(self.notes)
        if cpu is not None:
            notes.append(f"CPU {cpu} only")
        profile = self._profiles[key] = Profile(
            "host", None, None, shares.parts.total, self.duration_s, self.rec.lost_samples, shares.parts.ratios(), rows,
            int(np.count_nonzero(shares.selected & self.unresolved)), notes)
        return profile

    def guest_profile(self, vm: str, vcpu: int | None = None) -> Profile:
        key = ("guest", vm, vcpu)
        if key in self._profiles:
            return self._profiles[key]
        shares = self._guest_shares(vm, vcpu)
        rows = self.aggregate(shares.real_guest)
        for row in rows:
            row.vm = vm
        for (kind, v), n in shares.parts.virtual().items():
            rows.append(Row(n, *kind.label(vcpu=v), None, None, vm, kind))
        notes = list(self.notes)
        if not len(self.sched):
            notes.append("no scheduler events in this recording: idle and steal are unknown")
        profile = self._profiles[key] = Profile(
            "guest", vm, vcpu, shares.parts.total, self.duration_s, self.rec.lost_samples, shares.parts.ratios(), rows,
            int(np.count_nonzero(shares.real_guest & self.unresolved)), notes)
        return profile

    def host_summary(self) -> HostSummary:
        """The host at a glance (the live overview) without its rows: shares and the top process and function."""
        if ("host",) not in self._summaries:  # the overview's title, its host row and the history all ask
            shares = self._host_shares(None)
            rows = self.row_counts_of([np.flatnonzero(shares.host)])[0]
            self._summaries[("host",)] = HostSummary(shares.parts.ratios(), shares.parts.total, self.rec.lost_samples,
                                                     *rows.top(by_name=False))
        return self._summaries[("host",)]

    def _host_shares(self, cpu: int | None) -> _HostShares:
        if cpu not in self._host_share_cache:
            s = self.samples
            sel = np.ones(len(s), bool) if cpu is None else s["cpu"] == cpu
            guest = sel & self.in_vm
            host = sel & ~guest
            idle_ns = self.cpu_idle_ns()
            # idle from the sched events replaces the idle samples of a CPU that switched to or from idle; a CPU
            # with no such switch (idle throughout, or never idle) keeps its idle samples
            idle_task = s["pid"] == 0
            if idle_ns:
                replaced = np.zeros(1 << 16, bool)  # by CPU (u16)
                replaced[list(idle_ns)] = True
                at = np.flatnonzero(idle_task)
                host[at[replaced[s["cpu"][at]]]] = False
            idle_virtual = sum(v for c, v in idle_ns.items() if cpu is None or c == cpu) / self.period_ns
            idle = host & idle_task
            busy = host & ~idle
            kernel = np.count_nonzero(busy & ((s["flags"] & SAMPLE_HOST_KERNEL) != 0))
            user = np.count_nonzero(busy) - kernel
            parts = HostParts(float(kernel), float(user), idle_virtual + np.count_nonzero(idle),
                              float(np.count_nonzero(guest)))
            self._host_share_cache[cpu] = _HostShares(sel, host, guest, idle_virtual, parts)
        return self._host_share_cache[cpu]

    def _host_other_rows(self, shares: _HostShares) -> list[Row]:
        """The host profile's rows that are no function: CPU idle from the sched events, and one per VM."""
        s, guest = self.samples, shares.guest
        rows = []
        if shares.idle_virtual:
            rows.append(Row(shares.idle_virtual, *RowKind.CPU_IDLE.label(), kind=RowKind.CPU_IDLE))
        processes = self.rec.processes()  # thousands on a busy host, of which the VMMs are a few
        for pid, n in zip(*(a.tolist() for a in np.unique(s["pid"][guest], return_counts=True)), strict=True):
            name = self.vm_by_pid.get(pid, f"vm-{pid}")
            rows.append(Row(n, *RowKind.VM.label(vm=name, vm_index=self.vm_index.get(name, 0)),
                            processes.get(pid, {}).get("comm") or None, pid, name, RowKind.VM))
        return rows

    def row_counts_of(self, groups: list[np.ndarray]) -> list[RowCounts]:
        """The samples of each array of indices by profile row (process, pid, function, module) under the resolver's
        name codes (the same in every analysis that shares the resolver: counts of spans add), all at once (a span's
        vCPUs: one grouping, not one per vCPU)."""
        idx = np.concatenate(groups) if len(groups) > 1 else groups[0]
        owner = np.repeat(np.arange(len(groups), dtype=np.int64), [len(g) for g in groups])
        if self._codes is not None:  # no keys made: by (group, VM, name code), one sort (name codes count names)
            vms = int(self.vm_code.max(initial=0)) + 1
            packed = (owner * vms + self.vm_code[idx]) << 32 | self._codes.name_code[idx]
            keys, counts = arrays.unique(packed, return_counts=True)
            owner, codes = (keys >> 32) // vms, keys & 0xFFFFFFFF
        else:  # by the dense keys: counted, not sorted, on a large recording
            size = max(self.key_count, 1)
            keys, counts = arrays.counts_of(owner * size + self.key[idx], size * len(groups))
            owner, codes = keys // size, self.name_code_of_key[keys % size]
        # each group's rows by code (a window's sums merge by code): so already where a group is of one VM
        same = owner[1:] == owner[:-1]
        order = np.lexsort((codes, owner)) if np.any(same & (codes[1:] <= codes[:-1])) else slice(None)
        owner, codes, counts = owner[order], codes[order], counts[order].astype(float)
        bounds = np.searchsorted(owner, np.arange(len(groups) + 1)).tolist()
        names = self.resolver.row_names  # the resolver's names of its codes
        return [RowCounts(codes[a:b], counts[a:b], names) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        """(vCPU id, thread id) of each vCPU of a VM in the window, by vCPU id."""
        return sorted((tl.vcpu, tl.tid) for tl in self.vm_timelines(vm))

    def span_summary(self) -> SpanSummary:
        """This analysis' span in parts and rows that add across spans (the live screen keeps one per drained
        chunk): the host's and each vCPU's."""
        host = self._host_shares(None)
        timelines = list(self.timelines.values())
        parts = [self.vcpu_parts(tl) for tl in timelines]
        rows = self.row_counts_of([real for real, _parts in parts] + [np.flatnonzero(host.host)])
        vcpus = {(tl.vm, tl.vcpu): (tl.tid, mine, names)
                 for tl, (_real, mine), names in zip(timelines, parts, rows[:-1], strict=True)}
        host_rows = rows[-1]
        return SpanSummary(self.span(), self.vm_names(), host.parts, host_rows, self._host_other_rows(host), vcpus)

    def host_sums(self, kernel: bool = True,
                  cpu: int | None = None) -> tuple[HostParts, RowCounts, RowCounts | None, list[Row]]:
        """The host profile (of every CPU, or of `cpu`) in parts and rows that add across spans: SpanSummary's
        host, host_rows (and of them, with `kernel`, the samples in kernel mode: Row.kernel) and host_others
        (analyse/stream.py sums them over a recording's pieces)."""
        host = self._host_shares(cpu)
        idx = np.flatnonzero(host.host)
        groups = [idx, idx[kernel_mode(self.samples["flags"][idx])]] if kernel else [idx]
        rows = self.row_counts_of(groups)
        return host.parts, rows[0], rows[1] if kernel else None, self._host_other_rows(host)

    def idle_sums(self, kernel: bool = True,
                  cpu: int | None = None) -> tuple[set[int], set[int], dict[int, tuple[int, list[RowCounts]]]]:
        """What makes a streamed host profile's idle the whole recording's (analyse/stream.py): the CPUs whose idle
        samples the sched events replaced here, of them those idle from the start (their first switch to or from
        idle leaves idle), and per other CPU its idle samples kept: a count, their rows (and with `kernel`, those
        in kernel mode).  cpu: of that CPU's samples only (the CPUs replaced are every CPU's)."""
        idle_ns, at_start = self._cpu_idle
        idx = np.flatnonzero(self._host_shares(cpu).host & (self.samples["pid"] == 0))
        by_cpu = dict(arrays.group_by(self.samples["cpu"], idx))
        groups = list(by_cpu.values())
        if kernel:
            groups += [g[kernel_mode(self.samples["flags"][g])] for g in groups]
        rows = self.row_counts_of(groups) if groups else []
        n = len(by_cpu)
        kept = {cpu: (len(g), rows[i::n]) for i, (cpu, g) in enumerate(by_cpu.items())}
        return set(idle_ns), at_start, kept

    def vm_names(self) -> list[str]:
        return sorted(set(self.vm_by_pid.values()), key=lambda n: self.vm_index.get(n, 0))

    def vm_timelines(self, vm: str, vcpu: int | None = None) -> list[VcpuTimeline]:
        return [tl for tl in self.timelines.values() if tl.vm == vm and (vcpu is None or tl.vcpu == vcpu)]

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]:
        """A guest's OS:USER:IDLE:steal shares without its rows (the live screen's history of every VM)."""
        return self._guest_shares(vm, vcpu).parts.ratios()

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary:
        """What the live overview shows of a VM, without its rows (a VM's guest profile at 64 CPUs has tens of
        thousands): its shares, its steal of each type, and the process and the function (a row of its guest
        profile: process, pid, function, module) with the most resolved samples; ties go to the earlier row."""
        if ("guest", vm, vcpu) not in self._summaries:
            shares = self._guest_shares(vm, vcpu)
            self._summaries[("guest", vm, vcpu)] = guest_summary(shares.parts,
                                                                 self.row_counts_of([np.flatnonzero(shares.real_guest)])[0])
        return self._summaries[("guest", vm, vcpu)]

    def _guest_shares(self, vm: str, vcpu: int | None) -> _GuestShares:
        if (vm, vcpu) not in self._shares:
            if vm not in self.vm_by_pid.values():
                raise KeyError(vm)
            parts = GuestParts()
            real_guest = np.zeros(len(self.samples), bool)
            for tl in self.vm_timelines(vm, vcpu):
                real, mine = self.vcpu_parts(tl)
                real_guest[real] = True
                parts.add(mine)
            self._shares[(vm, vcpu)] = _GuestShares(real_guest, parts)
        return self._shares[(vm, vcpu)]

    def vcpu_parts(self, tl: VcpuTimeline) -> tuple[np.ndarray, GuestParts]:
        """One vCPU's guest-mode samples (indices) and its parts: its thread's samples outside guest mode are the
        VMM/KVM working for the vCPU (type 2 steal), except KVM polling the halted vCPU (neither guest work nor
        idle); its blanks are virtual samples by cause, at the thread's rate, and so is its halt polling."""
        idx = self.vcpus.thread_samples(tl)
        real = idx[self.is_guest[idx]]
        kernel = np.count_nonzero(self.samples["flags"][real] & SAMPLE_GUEST_KERNEL)
        unit = self.vcpus.sample_ns(tl)
        polling = len(self.vcpus.polling_samples(tl))
        parts = GuestParts(float(kernel), float(len(real) - kernel), self.blank_split(tl),
                           float(len(idx) - len(real) - polling), self.vcpus.poll_ns(tl) / unit)
        return real, parts

    def blank_split(self, tl: VcpuTimeline, in_ns: bool = False) -> dict[Cause, float]:
        """timeline.steal_split of one vCPU's blanks, in virtual samples at its thread's rate (sample_ns) or in ns;
        made for every vCPU at once."""
        if in_ns not in self._splits:
            timelines = list(self.timelines.values())  # in the order of the table's timeline column
            units = np.ones(len(timelines)) if in_ns else np.array([self.vcpus.sample_ns(t) for t in timelines], float)
            self._splits[in_ns] = dict(zip((t.tid for t in timelines), steal_split(tl.table, units), strict=True))
        return defaultdict(float, self._splits[in_ns][tl.tid])




def vm_rows(an: Analysis, row: Row, cpu: int | None) -> list[Row]:
    """A host-level VM row split into the rows of its vCPU threads' samples (guest functions, and the VMM or
    KVM working for the vCPU); [row] when they do not add up to it."""
    if row.kind is not RowKind.VM or row.pid is None:
        return [row]
    sel = an.in_vm & (an.samples["pid"] == row.pid)
    if cpu is not None:
        sel &= an.samples["cpu"] == cpu
    if int(np.count_nonzero(sel)) != int(round(row.samples)):
        return [row]
    return an.aggregate(sel)


def analyse(rec: Recording, guest_bundles: dict[str, Path] | None = None, resolver: Resolver | None = None,
            time_range: tuple[float, float] | None = None, resolved: Resolved | None = None,
            keep: Callable[[np.ndarray], np.ndarray] | None = None, span_ns: tuple[int, int] | None = None,
            shares_only: bool = False) -> Analysis:
    """The pipeline from a loaded recording: the resolve stage (resolve/prepare.py), then the analysis."""
    return Analysis(prepare(rec, guest_bundles, resolver, time_range, resolved, keep, span_ns), shares_only)
