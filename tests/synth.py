"""Synthetic recordings in the real format, for exact tests of the analysis without KVM or BPF.

A test lays out a schedule — which thread runs on which CPU when, whether a vCPU is in the guest,
in the VMM, halted or preempted — and the builder emits exactly the records the BPF programs
would: `bpf/sampler.bpf.c` takes one sample per CPU every 1/frequency of the time something runs
there (flags SAMPLE_VCPU | SAMPLE_GUEST for guest code, SAMPLE_VCPU alone while KVM handles an
exit, none for host code), and `bpf/sched.bpf.c` one event per switch in which a vCPU thread or the
idle task leaves or takes a CPU (SCHED_PREV_LOADED and the vCPU's mp_state and exit reason when a
vCPU leaves inside KVM_RUN, SCHED_PREV_RUNNABLE when it was preempted rather than blocked). An idle
CPU is not sampled (the PVM machines' behaviour; idle time comes from the sched events). The file is
written with the real `Writer`, so tests read it back with `recording.load` like any recording.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.record.recording import Writer, snapshot
from vmprof_tui.record.records import (
    SAMPLE_DTYPE,
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HOST_KERNEL,
    SAMPLE_VCPU,
    SCHED_DTYPE,
    SCHED_NEXT_VCPU,
    SCHED_PREV_HALTED,
    SCHED_PREV_LOADED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_VCPU,
)

MS = 1_000_000
IDLE = (0, 0, "swapper/0")  # the idle task: pid, tid, comm


@dataclass
class Vm:
    name: str
    pid: int
    vcpus: dict[int, int]  # vCPU id -> thread id
    bundle: Path | None = None

    def thread(self, vcpu: int) -> tuple[int, int, str]:
        return self.pid, self.vcpus[vcpu], f"vcpu{vcpu}"


@dataclass
class SynthRecording:
    frequency: int = 1000
    cpus: int = 2
    vms: list[Vm] = field(default_factory=list)
    processes: dict[int, str] = field(default_factory=dict)  # host pid -> comm
    samples: list[tuple] = field(default_factory=list)
    sched: list[tuple] = field(default_factory=list)
    # per CPU: who runs there now (pid, tid, comm), so a switch names both sides
    on_cpu: dict[int, tuple[int, int, str]] = field(default_factory=dict)

    @property
    def period_ns(self) -> int:
        return 1_000_000_000 // self.frequency

    def vm(self, name: str, pid: int, vcpus: dict[int, int], bundle: Path | None = None) -> Vm:
        v = Vm(name, pid, vcpus, bundle)
        self.vms.append(v)
        return v

    def _is_vcpu(self, tid: int) -> bool:
        return any(tid in v.vcpus.values() for v in self.vms)

    def _ticks(self, start_ns: int, end_ns: int) -> range:
        """The sampling instants in [start, end): every period on the CPU's own grid."""
        p = self.period_ns
        return range((start_ns + p - 1) // p * p, end_ns, p)

    def switch(self, cpu: int, t: int, nxt: tuple[int, int, str], *, exit_reason: int = 0, halted: bool = False,
               runnable: bool = True, loaded: bool = True) -> None:
        """The thread on `cpu` leaves for `nxt` (recorded when either side is a vCPU thread or the idle task)."""
        prev = self.on_cpu.get(cpu, IDLE)
        self.on_cpu[cpu] = nxt
        flags = 0
        prev_vcpu = self._is_vcpu(prev[1])
        if prev_vcpu:
            flags |= SCHED_PREV_VCPU
            if loaded:
                flags |= SCHED_PREV_LOADED | (SCHED_PREV_HALTED if halted else 0)
        if self._is_vcpu(nxt[1]):
            flags |= SCHED_NEXT_VCPU
        if not flags and prev[1] != 0 and nxt[1] != 0:
            return  # neither a vCPU nor idle: the sched program records nothing
        if runnable:
            flags |= SCHED_PREV_RUNNABLE
        vcpu_id = next((i for v in self.vms for i, t in v.vcpus.items() if t == prev[1]), 0)
        self.sched.append((t, prev[0], prev[1], nxt[0], nxt[1], exit_reason if prev_vcpu and loaded else 0, cpu,
                           vcpu_id if prev_vcpu and loaded else 0, flags, nxt[2].encode()))

    def _sample(self, t: int, cpu: int, pid: int, tid: int, flags: int, host_ip: int = 0, guest_ip: int = 0,
                guest_cr3: int = 0, exit_reason: int = 0, vcpu: int = 0) -> None:
        self.samples.append((t, host_ip, guest_ip, guest_cr3, pid, tid, exit_reason, -1, cpu, vcpu, flags, 0))

    def run(self, vm: Vm, vcpu: int, cpu: int, start_ns: int, end_ns: int, *, guest_ip: int = 0x401000,
            guest_cr3: int = 0x100000, kernel: bool = False) -> None:
        """vCPU `vcpu` of `vm` runs guest code on `cpu` over [start, end): switched in at start, sampled."""
        me = vm.thread(vcpu)
        if self.on_cpu.get(cpu) != me:
            self.switch(cpu, start_ns, me)
        flags = SAMPLE_VCPU | SAMPLE_GUEST | (SAMPLE_GUEST_KERNEL if kernel else 0)
        for t in self._ticks(start_ns, end_ns):
            self._sample(t, cpu, vm.pid, me[1], flags, guest_ip=guest_ip, guest_cr3=guest_cr3, vcpu=vcpu)

    def vmm_work(self, vm: Vm, vcpu: int, cpu: int, start_ns: int, end_ns: int, exit_reason: int,
                 in_kvm: bool = True) -> None:
        """The vCPU thread works for its vCPU outside the guest: KVM handling an exit (in_kvm) or the VMM."""
        me = vm.thread(vcpu)
        if self.on_cpu.get(cpu) != me:
            self.switch(cpu, start_ns, me)
        flags = SAMPLE_HOST_KERNEL | (SAMPLE_VCPU if in_kvm else 0)
        for t in self._ticks(start_ns, end_ns):
            self._sample(t, cpu, vm.pid, me[1], flags, host_ip=0xFFFFFFFF81000000, exit_reason=exit_reason,
                         vcpu=vcpu)

    def halt(self, vm: Vm, vcpu: int, cpu: int, t: int, exit_reason: int = 0) -> None:
        """The vCPU halts at t: its thread blocks in KVM_RUN (not runnable), the CPU goes idle."""
        self.switch(cpu, t, IDLE, exit_reason=exit_reason, halted=True, runnable=False)

    def host_task(self, pid: int, comm: str, cpu: int, start_ns: int, end_ns: int, *, tid: int | None = None,
                  kernel: bool = False, preempts: bool = True) -> None:
        """A host thread runs on `cpu` over [start, end); whoever ran there is preempted (still runnable)."""
        self.processes[pid] = comm
        me = (pid, tid or pid, comm)
        if self.on_cpu.get(cpu) != me:
            self.switch(cpu, start_ns, me, runnable=preempts)
        for t in self._ticks(start_ns, end_ns):
            self._sample(t, cpu, pid, me[1], SAMPLE_HOST_KERNEL if kernel else 0,
                         host_ip=0xFFFFFFFF81000000 if kernel else 0x400000)

    def idle(self, cpu: int, t: int, *, runnable: bool = False) -> None:
        """The CPU goes idle at t (the thread on it blocks, or is preempted with runnable=True)."""
        self.switch(cpu, t, IDLE, runnable=runnable)

    def preempt(self, cpu: int, t: int, by: tuple[int, int, str]) -> None:
        self.switch(cpu, t, by)

    def write(self, path: Path, end: bool = True) -> Path:
        samples = np.array(sorted(self.samples), SAMPLE_DTYPE) if self.samples else np.empty(0, SAMPLE_DTYPE)
        sched_rows = [(t, pp, pt, np_, nt, er, cpu, vid, fl, (0,) * 7, comm)
                      for t, pp, pt, np_, nt, er, cpu, vid, fl, comm in sorted(self.sched)]
        sched = np.array(sched_rows, SCHED_DTYPE) if sched_rows else np.empty(0, SCHED_DTYPE)
        times = [int(a["time_ns"].max()) for a in (samples, sched) if len(a)]
        meta = {"vmprof": "synth", "backend": "pvm", "event": "cpu-clock", "frequency": self.frequency,
                "cpus": self.cpus, "start_monotonic_ns": 0, "start_unix_s": 1_800_000_000.0}
        w = Writer(path, meta)
        w.add(samples, sched)
        for v in self.vms:
            if v.bundle is not None:
                w.add_bundle(v.name, v.bundle)
        vms = [{"name": v.name, "pid": v.pid, "kind": "demo", "bundle": None, "vcpu_fds": len(v.vcpus),
                "vcpu_threads": {str(t): i for i, t in v.vcpus.items()}} for v in self.vms]
        procs = {pid: {"pid": pid, "comm": comm, "cmdline": [comm], "exe": None, "maps": "", "build_ids": {}}
                 for pid, comm in self.processes.items()}
        w.add_snapshot(snapshot(vms=vms, processes=procs, kallsyms=""))
        if end:
            w.close({"duration_s": (max(times, default=0)) / 1e9, "samples": len(samples),
                     "lost": {"samples": [0], "sched": [0]}, "vms": vms})
        else:
            w.flush()
            w.file.close()
        return path
