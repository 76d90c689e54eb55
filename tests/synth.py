"""Synthetic recordings in the real format, for analysis tests without KVM, BPF or root.

A test describes what every CPU ran, and when; ``SynthRecording.write`` turns that schedule into the
records the BPF programs would have emitted for it and writes them with the real ``Writer``
(meta, bundle, snapshot, sample and sched chunks flushed every 500 ms of recorded time, kallsyms, end),
so a test reads them back with ``recording.load`` exactly as ``vmprof report`` does::

    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})                   # VMM pid, vCPU id -> thread id
    b.run(web, 0, cpu=1, start_ns=0, end_ns=40 * MS)               # guest code
    b.vmm_work(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS, exit_reason=VMX_IO)
    b.halt(web, 0, start_ns=50 * MS, end_ns=80 * MS)               # off its pCPU, halted (idle)
    b.run(web, 0, cpu=1, start_ns=80 * MS, end_ns=100 * MS)
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=20 * MS)
    rec = load(b.write(tmp_path / "x.vmprof"))

Times are ns after the recording's start (written as ``BASE_NS + t``); intervals are half-open
[start, end).  A CPU runs the idle task (pid 0, ``swapper/N``) wherever nothing else was placed.

What it mirrors (bpf/sampler.bpf.c, bpf/sched.bpf.c, bpf/vcpu.h, bpf/sample.h):

* Samples: one per CPU every 1/frequency (at ``phase_ns + k * period``, cpu-clock style), for whatever
  that CPU runs at that instant.  ``pid`` is the tgid, ``tid`` the thread; ``SAMPLE_HOST_KERNEL`` when the
  host IP is kernel text (idle, kernel threads, KVM, and guest samples, whose host IP is in KVM's
  entry/exit path); ``stack_id`` -1.  A vCPU thread inside KVM_RUN has its vCPU loaded:
  ``SAMPLE_VCPU`` and ``vcpu_id``; in guest mode also ``SAMPLE_GUEST`` (+ ``SAMPLE_GUEST_KERNEL`` at CPL 0)
  with guest RIP and CR3, and as exit reason the external-interrupt exit the sampling IRQ itself caused
  (``handling_intr_from_guest``); while KVM handles an exit (``vmm_work(in_kernel=True)``) the exit being
  handled.  A vCPU thread in VMM user space (``vmm_work(in_kernel=False)``) has no vCPU loaded: flags 0,
  exit reason 0, vcpu_id 0, like any host thread.  ``silent_idle_cpus`` take no samples while idle (the
  PVM development machines: an idle CPU other than CPU 0 takes no cpu-clock interrupts).
* Sched events: one per context switch in which the thread leaving or arriving is a vCPU thread or the
  idle task; host task to host task switches are not recorded.  Every vCPU thread of a declared VM is
  known to the programs (the recorder puts discovered vCPU threads in ``vcpu_tids`` before sampling), so
  it sets ``SCHED_PREV_VCPU`` / ``SCHED_NEXT_VCPU``.  ``SCHED_PREV_RUNNABLE`` when the one leaving was
  preempted or still TASK_RUNNING: the idle task always, a vCPU thread that was preempted (or migrated),
  a host task only with ``preempted=True``.  ``SCHED_PREV_LOADED`` with ``prev_vcpu_id`` and
  ``prev_exit_reason`` when the vCPU thread left inside KVM_RUN (from guest code or KVM); the exit reason
  is HLT for a halt, the exit KVM was handling when it left from ``vmm_work``, the external-interrupt
  exit (host tick) when it was preempted in guest mode; 0 when not loaded.  ``SCHED_PREV_HALTED`` for a
  halt (mp_state HALTED; blocked in KVM, so not runnable).  ``next_comm`` is the arriving thread's comm
  (at most 15 bytes), ``swapper/N`` for the idle task; ``pad`` is zero.
* Snapshot: ``vms`` (name, VMM pid, kind, vCPU threads, vcpu_fds, bundle folder), ``process:PID`` for
  every sampled pid except 0 (comm, cmdline, exe, maps text: one executable mapping of a file that
  does not exist here for user-mode processes, none for kernel threads, build_ids), ``kallsyms`` (a small
  host kallsyms text, ``HOST_SYMBOLS``) written at the end; a ``bundle`` chunk per VM given guest
  processes or guest kernel symbols; the end chunk with duration, counts, lost records, end time and VMs.

Issue 15's records: ``halt(wakeup_ns=)`` adds the sched_wakeup of the halted thread, ``halt_end`` KVM's
end-of-halt event (halt polling), ``preempt(throttled=True)`` ``SCHED_PREV_THROTTLED`` (and with ``throttled_ns`` the
``SCHED_THROTTLE_END`` record when it runs again), and ``irq`` intervals
of a CPU set ``cpu_irq_ns`` of its events (the CPU's IRQ clock).

Not modelled: halt polling samples (``SAMPLE_HALTED``), VMX without helper_kmod (``SAMPLE_GUEST_UNKNOWN``),
host and guest stacks, LBR, lost records, ring-buffer reordering (samples are written in time order),
VMM threads that load a vCPU for an ioctl, threads first learnt by the sampler mid-recording, tasks that emit no
trace events (whose switch-ins the sampler recovers).  The switch-in of a vCPU thread not known yet is recovered
as the sampler does: at its first sample as a vCPU thread.

``vm(discovered_ns=)``: the recorder discovers the VM's vCPU threads at that time (a /proc scan every
DISCOVER_S; the window's snapshot, written when it closes, names them all the same).  Before it the sched
program knows such a thread only by its loaded vCPU: a switch in which it leaves or arrives in VMM user
space is recorded only if the other side is a known vCPU thread or the idle task (an arrival from a host task
is recovered at the thread's first sample as a vCPU thread, above).

How a vCPU thread leaves its CPU is given by what follows: ``halt``, ``preempt`` or ``block`` starting
where its on-CPU time ends.  A gap with none of them is a preemption; after its last on-CPU time with
none, the thread blocks (the VMM stops the vCPU).  Who holds the pCPU during a gap is whatever the test
places there (``host_task``, ``run`` of another vCPU), else the idle task.
"""

from __future__ import annotations

import itertools
import json
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import __version__
from vmprof_tui.record.bpf_records import (
    SAMPLE_DTYPE,
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HOST_KERNEL,
    SAMPLE_VCPU,
    SCHED_DTYPE,
    SCHED_HALT_END,
    SCHED_NEXT_VCPU,
    SCHED_PREV_HALTED,
    SCHED_PREV_LOADED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_THROTTLED,
    SCHED_PREV_VCPU,
    SCHED_THROTTLE_END,
    SCHED_WAKEUP,
)
from vmprof_tui.record.writer import Writer

MS = 1_000_000
BASE_NS = 5_000 * 1_000_000_000  # host CLOCK_MONOTONIC at the recording's time 0 (5000 s after boot)
FLUSH_NS = 500 * MS  # the recorder writes pending records every 500 ms

# Intel VMX basic exit reasons (vmprof_tui/vmx_exits.py); SVM's equivalents in EXITS
VMX_EXTERNAL_INTERRUPT, VMX_HLT, VMX_IO, VMX_MSR_WRITE, VMX_EPT_VIOLATION = 1, 12, 30, 32, 48
EXITS = {"vmx": {"interrupt": VMX_EXTERNAL_INTERRUPT, "hlt": VMX_HLT}, "svm": {"interrupt": 0x60, "hlt": 0x78}}

# the host kernel text of the kallsyms snapshot; each symbol is 0x1000 bytes long
HOST_SYMBOLS = {"_text": 0xFFFFFFFF81000000, "default_idle": 0xFFFFFFFF81001000,
                "worker_thread": 0xFFFFFFFF81002000, "vmx_vcpu_enter_exit": 0xFFFFFFFF81003000,
                "vmx_handle_exit": 0xFFFFFFFF81004000, "do_syscall_64": 0xFFFFFFFF81005000}
USER_TEXT = (0x400000, 0x500000)  # the one executable mapping of every host user process
USER_IP = 0x401000
GUEST_USER_IP = 0x401234
GUEST_CR3 = 0x1000

GUEST, KVM, VMM_USER, HOST, IDLE_TASK = "guest", "kvm", "vmm-user", "host", "idle"
HALT, PREEMPT, BLOCK = "halt", "preempt", "block"


@dataclass(frozen=True)
class Vm:
    name: str
    pid: int  # the VMM process
    vcpus: dict[int, int]  # vCPU id -> thread id
    comm: str
    kind: str
    discovered_ns: int = 0  # before this, the sched program knows its vCPU threads only while loaded
    listed: bool = True  # in the recording's VM list (else only its samples name it: vm-PID)

    def tid(self, vcpu: int) -> int:
        return self.vcpus[vcpu]

    def thread_comm(self, vcpu: int) -> str:
        return f"CPU {vcpu}/KVM"  # QEMU's vCPU thread names


@dataclass
class _Slice:
    """One thread on one CPU over [start, end), in one mode."""
    cpu: int
    start: int
    end: int
    pid: int
    tid: int
    comm: str
    mode: str  # guest | kvm | vmm-user | host | idle
    kernel: bool = False  # host kernel (host tasks) or guest kernel (guest mode)
    ip: int = 0
    guest_ip: int = 0
    guest_cr3: int = 0
    exit_reason: int = 0  # kvm: the exit KVM handles
    vcpu: int | None = None
    preempted: bool = False  # host tasks: still runnable when they leave the CPU


@dataclass
class _Off:
    """A vCPU thread off its CPU over [start, end): how it left."""
    start: int
    end: int
    kind: str  # halt | preempt | block
    throttled: bool = False


@dataclass
class _GuestInfo:
    processes: list[dict] = field(default_factory=list)
    kernel_symbols: dict[str, int] = field(default_factory=dict)


class SynthRecording:
    def __init__(self, frequency: int = 1000, cpus: int = 2, backend: str = "vmx", phase_ns: int = 0,
                 silent_idle_cpus: tuple[int, ...] = (), duration_ns: int | None = None) -> None:
        """duration_ns: the recording's length; by default the end of the last thing placed on a CPU."""
        if backend not in EXITS:
            raise ValueError(f"backend {backend!r}: the builder knows {sorted(EXITS)}")
        self.frequency, self.cpus, self.backend = frequency, cpus, backend
        self.phase_ns, self.silent_idle_cpus, self._duration = phase_ns, set(silent_idle_cpus), duration_ns
        self.vms: list[Vm] = []
        self._slices: list[_Slice] = []
        self._offs: dict[int, list[_Off]] = {}  # vCPU tid -> off-CPU intervals declared
        self._guests: dict[str, _GuestInfo] = {}
        self._irqs: dict[int, list[tuple[int, int]]] = {}  # CPU -> its IRQ handling intervals
        self._extra: list[tuple] = []  # wake-up and halt-end events (SCHED_DTYPE rows)

    # -- what the host runs ----------------------------------------------------------------------
    def vm(self, name: str, pid: int, vcpus: dict[int, int], comm: str = "qemu-system-x86",
           kind: str = "qemu", discovered_ns: int = 0, listed: bool = True) -> Vm:
        vm = Vm(name, pid, dict(vcpus), comm, kind, discovered_ns, listed)
        self.vms.append(vm)
        return vm

    def run(self, vm: Vm, vcpu: int, cpu: int, start_ns: int, end_ns: int, guest_ip: int = GUEST_USER_IP,
            guest_cr3: int = GUEST_CR3, kernel: bool = False) -> None:
        """The vCPU runs guest code (guest user mode, or guest kernel mode with kernel=True)."""
        self._add(_Slice(cpu, start_ns, end_ns, vm.pid, vm.tid(vcpu), vm.thread_comm(vcpu), GUEST, kernel,
                         HOST_SYMBOLS["vmx_vcpu_enter_exit"], guest_ip, guest_cr3, vcpu=vcpu))

    def vmm_work(self, vm: Vm, vcpu: int, cpu: int, start_ns: int, end_ns: int, exit_reason: int,
                 in_kernel: bool = True) -> None:
        """The vCPU thread is on the CPU but not in guest mode: KVM handles `exit_reason` (in_kernel), or
        the VMM emulates it in user space after KVM_RUN returned (vCPU not loaded)."""
        if in_kernel:
            self._add(_Slice(cpu, start_ns, end_ns, vm.pid, vm.tid(vcpu), vm.thread_comm(vcpu), KVM, True,
                             HOST_SYMBOLS["vmx_handle_exit"], exit_reason=exit_reason, vcpu=vcpu))
        else:
            self._add(_Slice(cpu, start_ns, end_ns, vm.pid, vm.tid(vcpu), vm.thread_comm(vcpu), VMM_USER,
                             False, USER_IP, exit_reason=exit_reason, vcpu=vcpu))

    def halt(self, vm: Vm, vcpu: int, start_ns: int, end_ns: int, wakeup_ns: int | None = None,
             waker: tuple[int, str] = (0, "swapper/1")) -> None:
        """The vCPU halted (HLT exit, mp_state HALTED) and left its CPU at start_ns until end_ns; woken
        (sched_wakeup by `waker`, pid and comm) at wakeup_ns if given."""
        self._off(vm, vcpu, _Off(start_ns, end_ns, HALT))
        if wakeup_ns is not None:
            self._event(wakeup_ns, vm, vcpu, waker[0], waker[0], 0, SCHED_WAKEUP | SCHED_PREV_VCPU, waker[1])

    def halt_end(self, vm: Vm, vcpu: int, time_ns: int, halt_ns: int, polled: bool) -> None:
        """KVM's kvm_vcpu_wakeup at time_ns: a halt of halt_ns ended, while polling (polled) or after blocking."""
        flags = SCHED_HALT_END | SCHED_PREV_VCPU | (SCHED_PREV_RUNNABLE if polled else 0)
        self._event(time_ns, vm, vcpu, 0, 0, min(halt_ns, 0xFFFFFFFF), flags, "")

    def throttled_wakeup(self, vm: Vm, vcpu: int, wakeup_ns: int, run_ns: int, throttled_ns: int) -> None:
        """The sleeping (halted or blocked) vCPU thread was woken at wakeup_ns into a throttled CPU cgroup and
        took its CPU again at run_ns (the end of its halt or block); the kernel kept the group throttled
        throttled_ns of that."""
        self._event(wakeup_ns, vm, vcpu, 0, 0, 0, SCHED_WAKEUP | SCHED_PREV_VCPU | SCHED_PREV_THROTTLED, "swapper/1")
        self._event(run_ns, vm, vcpu, 0, 0, throttled_ns, SCHED_THROTTLE_END | SCHED_PREV_VCPU, "")

    def _event(self, t: int, vm: Vm, vcpu: int, pid: int, tid: int, reason: int, flags: int, comm: str) -> None:
        self._extra.append((BASE_NS + t, vm.pid, vm.tid(vcpu), pid, tid, reason, 0, vcpu, flags, (0,) * 3, 0,
                            comm.encode()[:15]))

    def irq(self, cpu: int, start_ns: int, end_ns: int) -> None:
        """The CPU handled interrupts over [start_ns, end_ns) (inside whatever ran there)."""
        self._irqs.setdefault(cpu, []).append((start_ns, end_ns))

    def preempt(self, vm: Vm, vcpu: int, start_ns: int, end_ns: int, throttled: bool = False,
                throttled_ns: int | None = None) -> None:
        """The vCPU thread was preempted: runnable, off its CPU, from start_ns to end_ns (throttled: because its
        CPU cgroup used up its cpu.max quota; throttled_ns: how long the kernel kept the group throttled)."""
        self._off(vm, vcpu, _Off(start_ns, end_ns, PREEMPT, throttled))
        if throttled_ns is not None:
            self._event(end_ns, vm, vcpu, 0, 0, throttled_ns, SCHED_THROTTLE_END | SCHED_PREV_VCPU, "")

    def block(self, vm: Vm, vcpu: int, start_ns: int, end_ns: int) -> None:
        """The vCPU thread blocked (not runnable, not halted): the VMM waits on I/O or a lock."""
        self._off(vm, vcpu, _Off(start_ns, end_ns, BLOCK))

    def host_task(self, pid: int, comm: str, cpu: int, start_ns: int, end_ns: int, kernel: bool = False,
                  tid: int | None = None, preempted: bool = False, ip: int | None = None) -> None:
        """A host thread on a CPU; kernel=True for a kernel thread (host IP in kernel text)."""
        if pid == 0:
            raise ValueError("the idle task runs wherever nothing else was placed")
        if ip is None:
            ip = HOST_SYMBOLS["worker_thread"] if kernel else USER_IP
        self._add(_Slice(cpu, start_ns, end_ns, pid, pid if tid is None else tid, comm, HOST, kernel, ip,
                         preempted=preempted))

    # -- what names the guest ---------------------------------------------------------------------
    def guest_process(self, vm: Vm, pid: int, name: str, cr3: int) -> None:
        """A guest process of the VM's guest bundle (docs/bundle.md): its samples are named `name`."""
        self._guests.setdefault(vm.name, _GuestInfo()).processes.append(
            {"pid": pid, "tids": [pid], "name": name, "cmdline": [f"/bin/{name}"], "exe": f"/bin/{name}",
             "cr3": [cr3], "maps": []})

    def guest_kernel_symbols(self, vm: Vm, symbols: dict[str, int]) -> None:
        """Guest kernel text symbols (the bundle's kallsyms): guest kernel samples get these names."""
        self._guests.setdefault(vm.name, _GuestInfo()).kernel_symbols.update(symbols)

    # -- the records --------------------------------------------------------------------------------
    @property
    def duration_ns(self) -> int:
        if self._duration is not None:
            return self._duration
        ends = [s.end for s in self._slices] + [o.end for offs in self._offs.values() for o in offs]
        return max(ends, default=0)

    @property
    def period_ns(self) -> float:
        return 1e9 / self.frequency

    def _add(self, s: _Slice) -> None:
        if not 0 <= s.cpu < self.cpus:
            raise ValueError(f"CPU {s.cpu}: the recording has {self.cpus} CPUs")
        if s.end <= s.start:
            raise ValueError(f"empty interval [{s.start}, {s.end})")
        for o in self._slices:
            if o.start < s.end and s.start < o.end and (o.cpu == s.cpu or o.tid == s.tid):
                raise ValueError(f"[{s.start}, {s.end}) of tid {s.tid} on CPU {s.cpu} overlaps "
                                 f"[{o.start}, {o.end}) of tid {o.tid} on CPU {o.cpu}")
        self._slices.append(s)

    def _off(self, vm: Vm, vcpu: int, off: _Off) -> None:
        if off.end <= off.start:
            raise ValueError(f"empty interval [{off.start}, {off.end})")
        self._offs.setdefault(vm.tid(vcpu), []).append(off)

    def _vcpu_tids(self) -> dict[int, tuple[Vm, int]]:
        return {tid: (vm, vcpu) for vm in self.vms for vcpu, tid in vm.vcpus.items()}

    def _cpu_slices(self, cpu: int) -> list[_Slice]:
        """Everything on one CPU in time order, the idle task in the gaps."""
        mine = sorted((s for s in self._slices if s.cpu == cpu), key=lambda s: s.start)
        out: list[_Slice] = []
        t = 0
        for s in [*mine, None]:
            end = self.duration_ns if s is None else s.start
            if end > t:
                out.append(_Slice(cpu, t, end, 0, 0, f"swapper/{cpu}", IDLE_TASK, True,
                                  HOST_SYMBOLS["default_idle"]))
            if s is not None:
                out.append(s)
                t = s.end
        return out

    def _check(self) -> None:
        """Off-CPU intervals lie where their thread is off every CPU, and start where it left one."""
        for tid, offs in self._offs.items():
            own = sorted((s for s in self._slices if s.tid == tid), key=lambda s: s.start)
            for o in offs:
                if any(s.start < o.end and o.start < s.end for s in own):
                    raise ValueError(f"tid {tid} is on a CPU during its {o.kind} [{o.start}, {o.end})")
                if o.start > 0 and not any(s.end == o.start for s in own):
                    raise ValueError(f"tid {tid}: {o.kind} at {o.start} does not start where it left a CPU")
                if o.end < self.duration_ns and not any(s.start == o.end for s in own):
                    raise ValueError(f"tid {tid}: {o.kind} ends at {o.end}, where it takes no CPU")
                if o.kind == HALT and o.start > 0 and [s for s in own if s.end == o.start][0].mode == VMM_USER:
                    raise ValueError(f"tid {tid}: a halt starts inside KVM_RUN, not in VMM user space")

    def _known(self, s: _Slice, t: int) -> bool:
        """Whether the sched program knows the thread of `s` as a vCPU thread as it leaves or arrives at t: its
        vCPU is loaded (not in VMM user space), or the recorder has discovered it by then."""
        vm = self._vcpu_tids().get(s.tid, (None, 0))[0]
        return vm is not None and (s.mode != VMM_USER or t >= vm.discovered_ns)

    def _leaving(self, s: _Slice) -> tuple[int, int]:
        """(flags, prev_exit_reason) of the switch in which the thread of `s` leaves its CPU at s.end."""
        if s.mode == IDLE_TASK:
            return SCHED_PREV_RUNNABLE, 0  # the idle task is always TASK_RUNNING
        if s.mode == HOST:
            return (SCHED_PREV_RUNNABLE if s.preempted else 0), 0
        exits = EXITS[self.backend]
        later = [x for x in self._slices if x.tid == s.tid and x.start >= s.end]
        off = [o for o in self._offs.get(s.tid, []) if o.start == s.end]
        kind = off[0].kind if off else PREEMPT if later else BLOCK
        flags = SCHED_PREV_VCPU
        if kind != BLOCK:
            flags |= SCHED_PREV_RUNNABLE if kind == PREEMPT else SCHED_PREV_HALTED
        if off and off[0].throttled:
            flags |= SCHED_PREV_THROTTLED
        if s.mode == VMM_USER:  # left KVM_RUN: no vCPU loaded
            return flags, 0
        flags |= SCHED_PREV_LOADED
        reason = exits["hlt"] if kind == HALT else s.exit_reason if s.mode == KVM else exits["interrupt"]
        return flags, reason

    def sched(self) -> np.ndarray:
        """The sched events bpf/sched.bpf.c would emit for the schedule, in time order."""
        self._check()
        vcpu_tids = self._vcpu_tids()
        times = self._sample_times()
        rows = []
        for cpu in range(self.cpus):
            slices = self._cpu_slices(cpu)
            last_recorded = -1
            for i, (prev, nxt) in enumerate(zip(slices, slices[1:], strict=False)):
                if prev.tid == nxt.tid:
                    continue  # the same thread goes on (guest code, then KVM, then the VMM...)
                flags, reason = self._leaving(prev)  # SCHED_PREV_VCPU for vCPU threads only
                if not self._known(prev, prev.end):
                    flags &= ~SCHED_PREV_VCPU
                if nxt.tid in vcpu_tids and self._known(nxt, nxt.start):
                    flags |= SCHED_NEXT_VCPU
                if not flags & (SCHED_PREV_VCPU | SCHED_NEXT_VCPU) and prev.tid != 0 and nxt.tid != 0:
                    if nxt.tid in vcpu_tids and (t := self._first_known_sample(slices, i + 1, last_recorded, times)):
                        rows.append((BASE_NS + t, prev.pid, prev.tid, nxt.pid, nxt.tid, 0, cpu, 0,
                                     (flags & SCHED_PREV_RUNNABLE) | SCHED_NEXT_VCPU, (0,) * 3, 0,
                                     nxt.comm.encode()[:15]))
                        last_recorded = t
                    continue  # host task to host task, or to a vCPU thread not known yet: not recorded
                loaded = flags & SCHED_PREV_LOADED
                rows.append((BASE_NS + prev.end, prev.pid, prev.tid, nxt.pid, nxt.tid, reason, cpu,
                             prev.vcpu if loaded else 0, flags, (0,) * 3, 0, nxt.comm.encode()[:15]))
                last_recorded = prev.end
        table = np.array(rows + self._extra, dtype=SCHED_DTYPE)
        for cpu, irqs in self._irqs.items():  # the CPU's IRQ clock at each of its events
            mine = table["cpu"] == cpu
            t = table["time_ns"][mine].astype(np.int64) - BASE_NS
            table["cpu_irq_ns"][mine] = sum(np.clip(t, a, z) - a for a, z in irqs) & 0xFFFFFFFF
        return table[np.argsort(table["time_ns"], kind="stable")]

    def _sample_times(self) -> list[int]:
        n = 0
        while round(self.phase_ns + n * self.period_ns) < self.duration_ns:
            n += 1
        return [round(self.phase_ns + k * self.period_ns) for k in range(n)]

    def _first_known_sample(self, slices: list[_Slice], first: int, last_recorded: int,
                            times: list[int]) -> int | None:
        """The switch-in the sampler records for a vCPU thread whose switch-in was not (bpf/sched.bpf.c
        seen_running): at its first sample as a vCPU thread before it leaves (its vCPU loaded, or discovered),
        timed in the middle of the stretch after the CPU's last recorded switch and the tick before."""
        tid = slices[first].tid
        for s in itertools.takewhile(lambda s: s.tid == tid, slices[first:]):
            for t in times[bisect_left(times, s.start):bisect_left(times, s.end)]:
                if self._known(s, t):
                    after = max(t - round(self.period_ns), last_recorded + 1)
                    return after + (t - after) // 2
        return None

    def samples(self) -> np.ndarray:
        """The samples bpf/sampler.bpf.c would emit: one per CPU per period, in time order."""
        exits = EXITS[self.backend]
        rows = []
        times = self._sample_times()
        for cpu in range(self.cpus):
            slices = self._cpu_slices(cpu)
            starts = [s.start for s in slices]
            for t in times:
                s = slices[bisect_right(starts, t) - 1]
                if s.mode == IDLE_TASK and cpu in self.silent_idle_cpus:
                    continue
                guest_ip = guest_cr3 = reason = vcpu_id = 0
                flags = SAMPLE_HOST_KERNEL if s.kernel or s.mode in (IDLE_TASK, KVM, GUEST) else 0
                if s.mode == GUEST:
                    flags |= SAMPLE_VCPU | SAMPLE_GUEST | (SAMPLE_GUEST_KERNEL if s.kernel else 0)
                    guest_ip, guest_cr3, reason, vcpu_id = s.guest_ip, s.guest_cr3, exits["interrupt"], s.vcpu
                elif s.mode == KVM:
                    flags |= SAMPLE_VCPU
                    reason, vcpu_id = s.exit_reason, s.vcpu
                rows.append((BASE_NS + t, s.ip, guest_ip, guest_cr3, s.pid, s.tid, reason, -1, cpu, vcpu_id,
                             flags, 0))
        table = np.array(rows, dtype=SAMPLE_DTYPE)
        return table[np.lexsort((table["cpu"], table["time_ns"]))]

    # -- the file -----------------------------------------------------------------------------------
    def meta(self) -> dict:
        return {"vmprof": __version__, "host": "synth", "kernel": "synthetic", "machine": "x86_64",
                "cpus": self.cpus, "backend": self.backend, "event": "cpu-clock", "frequency": self.frequency,
                "clock": "CLOCK_MONOTONIC (bpf_ktime_get_ns)", "start_monotonic_ns": BASE_NS,
                "start_unix_s": 1_800_000_000.0, "offsets": {}, "kvm_sched_in": 0,
                "vmx_helper": self.backend == "vmx", "notes": [], "filters": {"vm": [], "pid": None}, "lbr": None}

    def kallsyms(self) -> str:
        return "".join(f"{addr:016x} T {name}\n" for name, addr in HOST_SYMBOLS.items())

    def _vm_json(self, vm: Vm, bundles: dict[str, Path]) -> dict:
        return {"name": vm.name, "pid": vm.pid, "kind": vm.kind,
                "vcpu_threads": {str(tid): vcpu for vcpu, tid in vm.vcpus.items()}, "vcpu_fds": len(vm.vcpus),
                "bundle": str(bundles[vm.name]) if vm.name in bundles else None}

    def _process_snapshot(self, pid: int) -> dict:
        vm = next((v for v in self.vms if v.pid == pid), None)
        mine = [s for s in self._slices if s.pid == pid]
        comm = vm.comm if vm else next((s.comm for s in mine if s.tid == pid), mine[0].comm)
        user = vm is not None or any(s.mode == HOST and not s.kernel for s in mine)
        exe = f"/opt/synth/bin/{comm}"
        maps = (f"{USER_TEXT[0]:08x}-{USER_TEXT[1]:08x} r-xp 00000000 fe:00 4242"
                f"                       {exe}\n") if user else ""
        return {"pid": pid, "comm": comm, "cmdline": [exe] if user else [], "exe": exe if user else None,
                "maps": maps, "build_ids": {}}

    def _write_bundle(self, folder: Path, vm: Vm, info: _GuestInfo) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        kernel = None
        if info.kernel_symbols:
            (folder / "kallsyms").write_text(
                "".join(f"{a:016x} T {n}\n" for n, a in sorted(info.kernel_symbols.items(), key=lambda x: x[1])))
            kernel = {"release": "synthetic", "build_id": None, "kallsyms": "kallsyms", "modules": []}
        index = {"format": "vmprof-guest-bundle", "version": 1, "vm": vm.name, "created_by": "tests/synth.py",
                 "cr3_method": "vmm", "kernel": kernel, "processes": info.processes}
        (folder / "bundle.json").write_text(json.dumps(index, indent=1))

    def write(self, path: Path, late: tuple[int, int] | None = None, tail: np.ndarray | None = None) -> Path:
        """The recording file, written as the recorder writes it (vmprof_tui/recorder.py).
        late: (cpu, flushes): that CPU's samples and sched events of each flush are written that many flushes later
        (its ring buffer drained late), those left after the last flush in flushes of their own.  tail: samples
        written in a table chunk of their own after every other (before the end chunk)."""
        path = Path(path)
        samples, sched = self.samples(), self.sched()
        bundles = {vm.name: path.parent / f"{path.stem}-bundles" / vm.name
                   for vm in self.vms if vm.name in self._guests}
        w = Writer(path, self.meta())
        for vm in self.vms:
            if vm.name in bundles:
                self._write_bundle(bundles[vm.name], vm, self._guests[vm.name])
                w.add_bundle(vm.name, bundles[vm.name])
        w.add_snapshot({"vms": [self._vm_json(vm, bundles) for vm in self.vms if vm.listed]})
        seen: set[int] = set()

        def put(s_part: np.ndarray, e_part: np.ndarray) -> None:
            w.add(s_part, e_part)
            new = set(np.unique(s_part["pid"]).tolist()) - seen - {0}
            if new:
                seen.update(new)
                w.add_snapshot({f"process:{pid}": self._process_snapshot(pid) for pid in sorted(new)})
            w.flush()

        held: list[tuple[np.ndarray, np.ndarray]] = []  # late's, by flush
        for lo in range(0, max(self.duration_ns, 1), FLUSH_NS):
            s_part = samples[(samples["time_ns"] >= BASE_NS + lo) & (samples["time_ns"] < BASE_NS + lo + FLUSH_NS)]
            e_part = sched[(sched["time_ns"] >= BASE_NS + lo) & (sched["time_ns"] < BASE_NS + lo + FLUSH_NS)]
            if late is not None:
                s_late, e_late = s_part["cpu"] == late[0], e_part["cpu"] == late[0]
                held.append((s_part[s_late], e_part[e_late]))
                s_part, e_part = s_part[~s_late], e_part[~e_late]
                if len(held) > late[1]:
                    s_then, e_then = held.pop(0)
                    s_part, e_part = np.concatenate([s_part, s_then]), np.concatenate([e_part, e_then])
            put(s_part, e_part)
        for s_part, e_part in [*held, *([(tail, sched[:0])] if tail is not None else [])]:
            put(s_part, e_part)
        w.add_snapshot({"kallsyms": self.kallsyms()})
        w.close({"duration_s": self.duration_ns / 1e9, "samples": len(samples),
                 "guest_samples": int(np.count_nonzero(samples["flags"] & SAMPLE_GUEST)),
                 "lost": {"samples": [0] * self.cpus, "sched": [0] * self.cpus},
                 "end_monotonic_ns": BASE_NS + self.duration_ns,
                 "vms": [self._vm_json(vm, bundles) for vm in self.vms if vm.listed]})
        return path


# -- a recording of every kind of vCPU state, over many chunks (tests of streaming, of start-up) ----------------
BUSY_SLOT = 7 * MS  # not a multiple of the period: runs and blanks end between samples


def busy_recording(path: Path, seconds: float, late_cpu: bool = False, unlisted_vm: bool = False,
                   late: tuple[int, int] | None = None) -> Path:
    """2 VMs of 2 vCPUs on 3 CPUs; in each slot a CPU runs one of its vCPUs (guest code, then KVM), a host task or
    nothing; a vCPU off its CPU is halted (woken before it runs again) or preempted.
    late_cpu: a 4th CPU idle (its idle task sampled) for the first 40% of the recording, then a host task, idle
    again, and the task to the end: no switch on it until 40%.  unlisted_vm: a 3rd VM that the VM list does not
    name runs its one vCPU on the 4th CPU over [61%, 66%).  late: as SynthRecording.write's."""
    rng = np.random.default_rng(7)
    b = SynthRecording(frequency=1000, cpus=4 if late_cpu or unlisted_vm else 3)
    web = b.vm("web", pid=100, vcpus={0: 101, 1: 102})
    db = b.vm("db", pid=200, vcpus={0: 201, 1: 202})
    vcpus = [(web, 0, 1), (web, 1, 2), (db, 0, 1), (db, 1, 2)]  # (VM, vCPU, its CPU)
    slots = int(seconds * 1e9) // BUSY_SLOT
    runs = np.zeros((len(vcpus), slots), bool)
    for slot in range(slots):
        t0, t1 = slot * BUSY_SLOT, (slot + 1) * BUSY_SLOT
        b.host_task(500 + slot % 3, "app", cpu=0, start_ns=t0, end_ns=t1, kernel=bool(slot % 2))
        for cpu in (1, 2):
            mine = [i for i, v in enumerate(vcpus) if v[2] == cpu]
            choice = int(rng.integers(0, 4))
            if choice == 2:
                b.host_task(600 + cpu, "worker", cpu=cpu, start_ns=t0, end_ns=t1)
            elif choice < 2:
                vm, vcpu, _cpu = vcpus[mine[choice]]
                runs[mine[choice], slot] = True
                split = t0 + int(rng.integers(1, BUSY_SLOT // MS)) * MS
                b.run(vm, vcpu, cpu=cpu, start_ns=t0, end_ns=split, kernel=bool(rng.integers(0, 2)))
                b.vmm_work(vm, vcpu, cpu=cpu, start_ns=split, end_ns=t1, exit_reason=VMX_IO)
    for i, (vm, vcpu, _cpu) in enumerate(vcpus):  # each stretch off the CPU: a halt or a preemption
        edges = np.flatnonzero(np.diff(np.concatenate([[1], runs[i].astype(int), [1]])))
        for a, z in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            lo, hi = a * BUSY_SLOT, z * BUSY_SLOT
            if rng.random() < 0.6:
                b.halt(vm, vcpu, start_ns=lo, end_ns=hi, wakeup_ns=hi - MS // 2 if z < slots else None)
                if z < slots:
                    b.halt_end(vm, vcpu, hi - MS // 2, hi - MS // 2 - lo, polled=False)
            else:
                b.preempt(vm, vcpu, start_ns=lo, end_ns=hi)
    at = [slots * BUSY_SLOT * p // 100 for p in (40, 60, 61, 66, 70)]
    if late_cpu:
        b.host_task(700, "late", cpu=3, start_ns=at[0], end_ns=at[1], kernel=True)
        b.host_task(700, "late", cpu=3, start_ns=at[4], end_ns=slots * BUSY_SLOT)
    if unlisted_vm:
        batch = b.vm("batch", pid=300, vcpus={0: 301}, listed=False)
        b.run(batch, 0, cpu=3, start_ns=at[2], end_ns=at[3])
        b.block(batch, 0, start_ns=at[3], end_ns=slots * BUSY_SLOT)
    return b.write(path, late)
