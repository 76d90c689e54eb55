"""Analysis on the one host time axis: profiles, blank time, steal attribution.

record → resolve → **analyse**: every sample is resolved once (symbols.py),
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

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import backends
from vmprof_tui.bundle import normalise_cr3_array
from vmprof_tui.recording import Recording
from vmprof_tui.records import (
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_GUEST_UNKNOWN,
    SAMPLE_HOST_KERNEL,
    SCHED_NEXT_VCPU,
    SCHED_PREV_HALTED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_VCPU,
)
from vmprof_tui.symbols import (
    AddressSpace,
    GuestSymbols,
    ObjectCache,
    SymbolTable,
    guest_symbols,
    kallsyms_table,
    parse_proc_maps,
)

KERNEL_MODULE = "[kernel.kallsyms]"
GUEST_KERNEL_MODULE = "[guest.kallsyms]"
UNKNOWN = "[unknown]"

IDLE, PREEMPTED, BLOCKED = "idle", "preempted", "blocked"


@dataclass
class Row:
    samples: float
    function: str
    module: str
    process: str | None = None
    pid: int | None = None
    vm: str | None = None

    def to_json(self, total: float) -> dict:
        return {"samples": int(round(self.samples)), "ratio": round(100.0 * self.samples / total, 3) if total else 0.0,
                "function": self.function, "module": self.module, "process": self.process, "pid": self.pid,
                "vm": self.vm}


@dataclass
class Profile:
    level: str  # host | guest
    vm: str | None
    vcpu: int | None
    total_samples: float
    duration_s: float
    lost_samples: int
    ratios: dict[str, float]
    rows: list[Row]
    unresolved_samples: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        total = self.total_samples
        return {"level": self.level, "vm": self.vm, "vcpu": self.vcpu, "total_samples": int(round(total)),
                "duration_s": round(self.duration_s, 6), "lost_samples": self.lost_samples,
                "unresolved_samples": self.unresolved_samples,
                "unresolved_ratio": round(100.0 * self.unresolved_samples / total, 3) if total else 0.0,
                "ratios": {k: round(v, 3) for k, v in self.ratios.items()},
                "rows": [r.to_json(total) for r in self.rows], "notes": self.notes}


@dataclass
class Blank:
    """An interval in which a vCPU was not on a CPU."""
    start_ns: int
    end_ns: int
    kind: str  # idle | preempted | blocked
    holder: str  # who took the pCPU (preempted): "vcpuN" of the same VM, a VM name, or a host task
    holder_same_vm_vcpu: int | None
    exit_reason: int


@dataclass
class VcpuTimeline:
    vm: str
    pid: int
    tid: int
    vcpu: int
    start_ns: int
    end_ns: int
    on_cpu_ns: int = 0
    blanks: list[Blank] = field(default_factory=list)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Attribution:
    process: str
    function: str
    module: str
    vcpu: int
    samples: int  # real guest samples
    steal_ns: float  # steal attributed to it

    def apparent_ns(self, period_ns: float) -> float:
        return self.samples * period_ns + self.steal_ns


@dataclass
class SymbolCache:
    """Symbol sources kept across analyses (the live screen analyses a new window every second)."""
    objects: ObjectCache = field(default_factory=ObjectCache)
    guests: dict[str, GuestSymbols] = field(default_factory=dict)
    kallsyms: SymbolTable | None = None


class Analysis:
    """Everything derived from one recording (and the guest bundles that name its guests)."""

    def __init__(self, rec: Recording, guest_bundles: dict[str, Path] | None = None,
                 cache: SymbolCache | None = None, time_range: tuple[float, float] | None = None) -> None:
        """time_range: (from, to) in seconds after the first record; the analysis covers only that span."""
        self.rec = rec
        self.frequency = int(rec.meta.get("frequency", 1000))
        self.period_ns = 1e9 / self.frequency
        self.backend = rec.meta.get("backend", backends.NONE)
        self.samples = np.sort(rec.samples, order="time_ns", kind="stable")
        self.sched = np.sort(rec.sched, order="time_ns", kind="stable")
        self.range_ns: tuple[int, int] | None = None
        if time_range is not None:
            w0, _ = self.window()
            lo, hi = w0 + int(time_range[0] * 1e9), w0 + int(time_range[1] * 1e9)
            self.range_ns = (lo, hi)
            t = self.samples["time_ns"]
            self.samples = self.samples[(t >= lo) & (t <= hi)]
        self.notes: list[str] = list(rec.problems)
        self.vm_by_pid: dict[int, str] = {}
        self.vm_index: dict[str, int] = {}
        self.vcpu_of_tid: dict[int, tuple[int, int]] = {}  # tid -> (vmm pid, vcpu id)
        self._learn_vms()
        self.cache = cache or SymbolCache()
        self.objects = self.cache.objects
        self.guests = self.cache.guests
        self._load_guests(guest_bundles or {})
        self._resolve()
        self.timelines = self._build_timelines()

    # -- VMs, vCPU threads ---------------------------------------------------------
    def _learn_vms(self) -> None:
        vms = (self.rec.end or {}).get("vms") or self.rec.snapshot.get("vms") or []
        for i, vm in enumerate(sorted(vms, key=lambda v: (v["name"], v["pid"]))):
            self.vm_by_pid[int(vm["pid"])] = vm["name"]
            self.vm_index.setdefault(vm["name"], i + 1)
            for tid, vcpu in vm.get("vcpu_threads", {}).items():
                if vcpu is not None:
                    self.vcpu_of_tid[int(tid)] = (int(vm["pid"]), int(vcpu))
        s = self.samples
        vcpu_samples = s[(s["flags"] & 0x0002) != 0]
        if len(vcpu_samples):
            pairs = np.unique(np.stack([vcpu_samples["tid"].astype(np.int64), vcpu_samples["pid"].astype(np.int64),
                                        vcpu_samples["vcpu_id"].astype(np.int64)], axis=1), axis=0)
            for tid, pid, vcpu in pairs.tolist():
                self.vcpu_of_tid[tid] = (pid, vcpu)
                if pid not in self.vm_by_pid:
                    name = f"vm-{pid}"
                    self.vm_by_pid[pid] = name
                    self.vm_index.setdefault(name, len(self.vm_index) + 1)

    def _load_guests(self, explicit: dict[str, Path]) -> None:
        for name in self.vm_by_pid.values():
            if name in self.guests and self.guests[name].bundle is not None:
                continue
            if name in explicit:
                g = guest_symbols(name, explicit[name])
            elif name in self.rec.bundles:
                g = guest_symbols(name, self.rec.bundles[name])
            else:
                g = GuestSymbols(name, {}, SymbolTable.empty(),
                                 note=f"no guest bundle for VM {name}: its guest samples show raw addresses "
                                      f"(give one with --guest-bundle {name}=PATH)")
            if g.note:
                self.notes.append(g.note)
            self.guests[name] = g

    # -- resolution --------------------------------------------------------------------
    def _resolve(self) -> None:
        s = self.samples
        n = len(s)
        self.func = np.full(n, UNKNOWN, dtype=object)
        self.module = np.full(n, UNKNOWN, dtype=object)
        self.process = np.full(n, "", dtype=object)
        self.proc_pid = np.full(n, -1, dtype=np.int64)
        self.vm_of = np.array([self.vm_by_pid.get(int(p)) for p in s["pid"]], dtype=object) if n else \
            np.empty(0, dtype=object)
        flags = s["flags"]
        guest = (flags & SAMPLE_GUEST) != 0
        self.is_guest = guest
        host = ~guest
        kernel = host & ((flags & SAMPLE_HOST_KERNEL) != 0)
        if self.cache.kallsyms is None or "kallsyms" in self.rec.snapshot:
            self.cache.kallsyms = kallsyms_table(self.rec.snapshot.get("kallsyms", ""))
        kallsyms = self.cache.kallsyms
        if kernel.any():
            idx = kallsyms.lookup(s["host_ip"][kernel])
            names = np.array(kallsyms.names + [UNKNOWN], dtype=object)
            self.func[kernel] = names[idx]
            self.module[kernel] = KERNEL_MODULE
        comm = {}
        for key, snap in self.rec.snapshot.items():
            if key.startswith("process:"):
                comm[int(snap["pid"])] = snap
        pids = s["pid"]
        for pid in np.unique(pids[host]).tolist():
            sel = host & (pids == pid)
            snap = comm.get(pid)
            name = "swapper" if pid == 0 else (snap["comm"] if snap else str(pid))
            self.process[sel] = name
            self.proc_pid[sel] = pid
            user = sel & ~kernel
            if user.any() and snap:
                space = AddressSpace(name, pid, parse_proc_maps(snap["maps"]))
                f, m = space.resolve(s["host_ip"][user], self.objects)
                self.func[user] = f
                self.module[user] = m
        for pid in np.unique(pids[guest]).tolist():
            vm = self.vm_by_pid.get(pid, f"vm-{pid}")
            g = self.guests.get(vm)
            sel = guest & (pids == pid)
            unknown = sel & ((flags & SAMPLE_GUEST_UNKNOWN) != 0)
            self.func[unknown] = UNKNOWN
            self.module[unknown] = "(guest RIP unknown)"
            known = sel & ~unknown
            gkernel = known & ((flags & SAMPLE_GUEST_KERNEL) != 0)
            if gkernel.any():
                self.module[gkernel] = GUEST_KERNEL_MODULE
                if g is not None and len(g.kernel.starts):
                    idx = g.kernel.lookup(s["guest_ip"][gkernel])
                    self.func[gkernel] = np.array(g.kernel.names + [UNKNOWN], dtype=object)[idx]
            guser = known & ~gkernel
            cr3s = normalise_cr3_array(s["guest_cr3"])
            for cr3 in np.unique(cr3s[known]).tolist():
                csel = known & (cr3s == cr3)
                space = g.processes.get(cr3) if g is not None else None
                if space is None:
                    self.process[csel] = f"[cr3 {cr3:#x}]"
                    self.module[csel & guser] = UNKNOWN
                    continue
                self.process[csel] = space.name
                self.proc_pid[csel] = space.pid if space.pid is not None else -1
                usel = csel & guser
                if usel.any():
                    f, m = space.resolve(s["guest_ip"][usel], self.objects)
                    self.func[usel] = f
                    self.module[usel] = m
        self.unresolved = self.func == UNKNOWN
        self._encode_keys()

    def _encode_keys(self) -> None:
        """One integer per sample for its (vm, process, pid, function, module): grouping without Python loops."""
        key = np.zeros(len(self.samples), np.int64)
        for column in (self.vm_of.astype(str), self.process, self.proc_pid, self.func, self.module):
            _, codes = np.unique(column, return_inverse=True)
            key = key * (int(codes.max()) + 1 if len(codes) else 1) + codes
        _, self.key = np.unique(key, return_inverse=True)

    # -- timelines -------------------------------------------------------------------
    def window(self) -> tuple[int, int]:
        if getattr(self, "range_ns", None) is not None:
            return self.range_ns
        times = [a["time_ns"] for a in (self.samples, self.sched) if len(a)]
        if not times:
            return 0, 0
        return int(min(t[0] for t in times)), int(max(t[-1] for t in times))

    def _build_timelines(self) -> dict[int, VcpuTimeline]:
        """Per vCPU thread: on-CPU time and blank intervals from the sched events."""
        _w0, w1 = self.window()
        timelines: dict[int, VcpuTimeline] = {}
        ev = self.sched
        s = self.samples
        for tid, (pid, vcpu) in sorted(self.vcpu_of_tid.items()):
            vm = self.vm_by_pid.get(pid, f"vm-{pid}")
            outs = ev[(ev["prev_tid"] == tid) & ((ev["flags"] & SCHED_PREV_VCPU) != 0)]
            ins = ev[(ev["next_tid"] == tid) & ((ev["flags"] & SCHED_NEXT_VCPU) != 0)]
            own = s["time_ns"][s["tid"] == tid]
            firsts = [int(a[0]) for a in (outs["time_ns"], ins["time_ns"], own) if len(a)]
            lasts = [int(a[-1]) for a in (outs["time_ns"], ins["time_ns"], own) if len(a)]
            if not firsts:
                continue
            # The vCPU's life starts at its first record: a thread first seen leaving a CPU ran since its
            # first sample (which comes within one sampling period of the start of the recording if it
            # was already running then).
            start = min(firsts)
            tl = VcpuTimeline(vm, pid, tid, vcpu, start, max(lasts))
            merged = sorted([(int(e["time_ns"]), 0, e) for e in outs] + [(int(e["time_ns"]), 1, e) for e in ins],
                            key=lambda x: (x[0], x[1]))
            on_since: int | None = start
            blank: tuple[int, dict] | None = None
            for t, is_in, e in merged:
                if is_in:
                    if blank is not None:
                        tl.blanks.append(self._blank(blank[0], t, blank[1], pid))
                        blank = None
                    on_since = t
                else:
                    if on_since is not None:
                        tl.on_cpu_ns += t - on_since
                    on_since = None
                    blank = (t, e)
            # an open interval runs to the end of the window
            if blank is not None and blank[1]["flags"] & (SCHED_PREV_RUNNABLE | SCHED_PREV_HALTED):
                tl.blanks.append(self._blank(blank[0], w1, blank[1], pid))
                tl.end_ns = w1
            elif on_since is not None:
                tl.on_cpu_ns += tl.end_ns - on_since
            if self.range_ns is not None and not self._clip(tl):
                continue
            timelines[tid] = tl
        return timelines

    def _clip(self, tl: VcpuTimeline) -> bool:
        """Restrict a timeline to the analysed time range; False if nothing is left."""
        lo, hi = self.range_ns
        tl.start_ns, tl.end_ns = max(tl.start_ns, lo), min(tl.end_ns, hi)
        if tl.end_ns <= tl.start_ns:
            return False
        blanks = []
        for b in tl.blanks:
            b.start_ns, b.end_ns = max(b.start_ns, lo), min(b.end_ns, hi)
            if b.end_ns > b.start_ns:
                blanks.append(b)
        tl.blanks = blanks
        tl.on_cpu_ns = tl.wall_ns - sum(b.end_ns - b.start_ns for b in blanks)
        return True

    def _blank(self, start: int, end: int, e: np.void, pid: int) -> Blank:
        flags = int(e["flags"])
        if flags & SCHED_PREV_HALTED:
            kind = IDLE
        elif flags & SCHED_PREV_RUNNABLE:
            kind = PREEMPTED
        else:
            kind = BLOCKED
        holder_tid, holder_pid = int(e["next_tid"]), int(e["next_pid"])
        same = None
        if holder_tid in self.vcpu_of_tid and self.vcpu_of_tid[holder_tid][0] == pid:
            same = self.vcpu_of_tid[holder_tid][1]
            holder = f"vcpu{same}"
        elif holder_pid in self.vm_by_pid:
            holder = self.vm_by_pid[holder_pid]
        elif holder_pid == 0:
            holder = "idle"
        else:
            holder = e["next_comm"].decode(errors="replace") or str(holder_pid)
        return Blank(start, end, kind, holder, same, int(e["prev_exit_reason"]))

    # -- profiles --------------------------------------------------------------------
    def _row(self, i: int, samples: float) -> Row:
        pid = int(self.proc_pid[i])
        return Row(samples, str(self.func[i]), str(self.module[i]), str(self.process[i]) or None,
                   pid if pid >= 0 else None, self.vm_of[i])

    def _aggregate(self, sel: np.ndarray) -> list[Row]:
        idx = np.nonzero(sel)[0]
        _, first, counts = np.unique(self.key[idx], return_index=True, return_counts=True)
        return [self._row(int(idx[f]), float(c)) for f, c in zip(first.tolist(), counts.tolist(), strict=True)]

    def cpu_idle_ns(self) -> dict[int, int]:
        """Idle time per CPU from switches to and from the idle task (exact, unlike idle samples)."""
        ev = self.sched
        idle: dict[int, int] = {}
        for cpu in np.unique(ev["cpu"]).tolist():
            e = ev[ev["cpu"] == cpu]
            to_idle = np.nonzero(e["next_tid"] == 0)[0]
            from_idle = np.nonzero(e["prev_tid"] == 0)[0]
            if not len(to_idle):
                continue
            ends = np.searchsorted(from_idle, to_idle)  # first switch away from idle after each entry
            ok = ends < len(from_idle)
            start = e["time_ns"][to_idle[ok]].astype(np.int64)
            end = e["time_ns"][from_idle[ends[ok]]].astype(np.int64)
            if self.range_ns is not None:
                start, end = start.clip(*self.range_ns), end.clip(*self.range_ns)
            idle[int(cpu)] = int((end - start).sum())
        return idle

    def host_profile(self, cpu: int | None = None) -> Profile:
        s = self.samples
        sel = np.ones(len(s), bool) if cpu is None else s["cpu"] == cpu
        guest = sel & self.is_guest
        host = sel & ~self.is_guest
        idle_ns = self.cpu_idle_ns()
        measured_idle = bool(idle_ns)
        if measured_idle:  # idle from the sched events replaces idle samples
            host &= s["pid"] != 0
        rows = self._aggregate(host)
        for row in rows:  # host rows carry no VM, only the VMM process name
            row.vm = None
        idle_virtual = sum(v for c, v in idle_ns.items() if cpu is None or c == cpu) / self.period_ns
        if idle_virtual:
            rows.append(Row(idle_virtual, "[idle]", "(cpu idle)"))
        for pid in np.unique(s["pid"][guest]).tolist():
            name = self.vm_by_pid.get(pid, f"vm-{pid}")
            n = int(np.count_nonzero(guest & (s["pid"] == pid)))
            rows.append(Row(n, f"[{name}]", f"(VM{self.vm_index.get(name, 0)})", None, pid, name))
        total = float(np.count_nonzero(host | guest)) + idle_virtual
        idle = idle_virtual if measured_idle else np.count_nonzero(host & (s["pid"] == 0))
        kernel = np.count_nonzero(host & (s["pid"] != 0) & ((s["flags"] & SAMPLE_HOST_KERNEL) != 0))
        user = np.count_nonzero(host & ((s["flags"] & SAMPLE_HOST_KERNEL) == 0))
        ratios = {k: 100.0 * v / total if total else 0.0 for k, v in
                  (("os", kernel), ("user", user), ("idle", idle), ("vm", np.count_nonzero(guest)))}
        notes = list(self.notes)
        if cpu is not None:
            notes.append(f"CPU {cpu} only")
        return Profile("host", None, None, total, self.rec.duration_s, self.rec.lost_samples, ratios, rows,
                       int(np.count_nonzero(sel & self.unresolved)), notes)

    def vm_names(self) -> list[str]:
        return sorted(set(self.vm_by_pid.values()), key=lambda n: self.vm_index.get(n, 0))

    def vm_timelines(self, vm: str, vcpu: int | None = None) -> list[VcpuTimeline]:
        return [tl for tl in self.timelines.values() if tl.vm == vm and (vcpu is None or tl.vcpu == vcpu)]

    def guest_profile(self, vm: str, vcpu: int | None = None) -> Profile:
        if vm not in self.vm_by_pid.values():
            raise KeyError(vm)
        tls = self.vm_timelines(vm, vcpu)
        s = self.samples
        tids = [tl.tid for tl in tls]
        sel = np.isin(s["tid"], tids)
        real_guest = sel & self.is_guest
        rows = self._aggregate(real_guest)
        for row in rows:
            row.vm = vm
        period = self.period_ns
        # vCPU thread samples outside guest mode: the VMM/KVM working for the vCPU (type 2 steal)
        vmm = sel & ~self.is_guest
        vmm_samples = float(np.count_nonzero(vmm))
        virtual: dict[tuple[str, str], float] = defaultdict(float)
        for tl in tls:
            for b in tl.blanks:
                n = (b.end_ns - b.start_ns) / period
                if b.kind == IDLE:
                    virtual[("[idle]", "(halt_exit)")] += n
                elif b.kind == PREEMPTED and b.holder_same_vm_vcpu is not None:
                    virtual[("[steal]", f"(on vcpu{b.holder_same_vm_vcpu})")] += n
                elif b.kind == PREEMPTED:
                    virtual[("[steal]", "(outside)")] += n
                else:
                    virtual[("[steal]", "(vmm blocked)")] += n
        if vmm_samples:
            virtual[("[steal]", "(vmm)")] += vmm_samples
        for (f, m), n in virtual.items():
            rows.append(Row(n, f, m, None, None, vm))
        total = float(np.count_nonzero(real_guest)) + sum(virtual.values())
        gk = np.count_nonzero(real_guest & ((s["flags"] & SAMPLE_GUEST_KERNEL) != 0))
        gu = np.count_nonzero(real_guest) - gk
        idle = virtual.get(("[idle]", "(halt_exit)"), 0.0)
        steal = sum(v for (f, _m), v in virtual.items() if f == "[steal]")
        ratios = {k: 100.0 * v / total if total else 0.0 for k, v in
                  (("os", gk), ("user", gu), ("idle", idle), ("steal", steal))}
        notes = list(self.notes)
        if not len(self.sched):
            notes.append("no scheduler events in this recording: idle and steal are unknown")
        return Profile("guest", vm, vcpu, total, self.rec.duration_s, self.rec.lost_samples, ratios, rows,
                       int(np.count_nonzero(real_guest & self.unresolved)), notes)

    # -- steal attribution and corrected times -------------------------------------
    def attributions(self, vm: str) -> list[Attribution]:
        """Per vCPU and (process, function): real samples, and the steal that sat between two of its samples."""
        s = self.samples
        out: list[Attribution] = []
        for tl in sorted(self.vm_timelines(vm), key=lambda t: t.vcpu):
            sel = np.nonzero((s["tid"] == tl.tid) & self.is_guest)[0]
            if not len(sel):
                continue
            keys = self.key[sel]
            steal = np.zeros(int(keys.max()) + 1)
            steals = [b for b in tl.blanks if b.kind != IDLE]
            if steals:
                times = s["time_ns"][sel]
                starts = np.array([b.start_ns for b in steals], np.uint64)
                ends = np.array([b.end_ns for b in steals], np.uint64)
                before = np.searchsorted(times, starts, side="right") - 1
                after = np.searchsorted(times, ends, side="left")
                ok = (before >= 0) & (after < len(times))
                before, after, dur = before[ok], after[ok], (ends - starts)[ok].astype(float)
                same = keys[before] == keys[after]
                np.add.at(steal, keys[before][same], dur[same])
            uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
            for k, f, c in zip(uniq.tolist(), first.tolist(), counts.tolist(), strict=True):
                row = self._row(int(sel[f]), c)
                out.append(Attribution(row.process or "", row.function, row.module, tl.vcpu, c, float(steal[k])))
        return sorted(out, key=lambda a: -a.apparent_ns(self.period_ns))
