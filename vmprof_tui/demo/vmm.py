"""The demo VMM: one KVM virtual machine per process, real guest programs.

Run as `python -m vmprof_tui.demo.vmm SPEC_JSON` by the demo runner.  The
process renames itself after the VM and its vCPU threads `vcpuN`, so host tools
(and vmprof's VM discovery) tell VMs apart.

Each vCPU thread time-slices its guest processes like a guest scheduler: a
per-thread POSIX timer interrupts KVM_RUN (EINTR) every slice; the thread then
saves the registers of the running process and loads the next one, including
its own CR3.  A process that asks to sleep leaves the vCPU; when no process is
runnable the vCPU is put in KVM_MP_STATE_HALTED and KVM_RUN blocks in the
kernel exactly as for a guest HLT, until the timer wakes it.

Protocol on stdout, one JSON object per line: {"event": "ready", ...} once the
VM runs, {"event": "fault", ...} if a guest process faults, and
{"event": "exit", ...} with the ground truth when the VM stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from vmprof_tui.demo import guestos, kvm, nic
from vmprof_tui.demo.cgroup import CgroupError, CpuQuota
from vmprof_tui.demo.loader import (
    DOORBELL_GPA,
    PAGE,
    AddressSpace,
    BadProgram,
    PhysAllocator,
    load_program,
)
from vmprof_tui.demo.syscalls import SyscallServer
from vmprof_tui.libc import LIBC, schedstat
from vmprof_tui.resolve import bundle_format

# Doorbell ports (programs/guest_rt.h).
PORT_EXIT, PORT_SLEEP_MS, PORT_PROGRESS, PORT_SLEEP_US = 0x10, 0x11, 0x12, 0x13

KVM_EXIT_MMIO = 6

TICK_SIGNAL = signal.SIGUSR1
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
SIGEV_THREAD_ID = 4
CLOCK_MONOTONIC = 1
TIMER_ABSTIME = 1

_libc = LIBC


class KvmFpu(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint8 * 416)]


class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("tid", ctypes.c_int), ("pad", ctypes.c_int * 11)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


def set_thread_name(name: str) -> None:
    _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class ThreadTimer:
    """A POSIX timer that signals one thread (SIGEV_THREAD_ID), to interrupt its KVM_RUN."""

    def __init__(self, tid: int) -> None:
        self.id = ctypes.c_void_p()
        ev = _Sigevent(signo=TICK_SIGNAL, notify=SIGEV_THREAD_ID, tid=tid)
        if _libc.timer_create(CLOCK_MONOTONIC, ctypes.byref(ev), ctypes.byref(self.id)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create failed")

    def arm(self, first_ns: int, interval_ns: int, absolute: bool = False) -> None:
        """First expiry after first_ns (or at CLOCK_MONOTONIC first_ns when absolute), then every interval_ns."""
        spec = _Itimerspec(interval=_Timespec(interval_ns // 10**9, interval_ns % 10**9),
                           value=_Timespec(first_ns // 10**9, first_ns % 10**9))
        _libc.timer_settime(self.id, TIMER_ABSTIME if absolute else 0, ctypes.byref(spec), None)

    def delete(self) -> None:
        _libc.timer_delete(self.id)


@dataclass
class GuestProcess:
    pid: int
    name: str
    program: Path
    args: list[int]
    space: AddressSpace
    regs: kvm.KvmRegs
    fpu: KvmFpu | None = None
    state: str = "runnable"  # runnable | sleeping | exited | faulted
    wake_ns: int = 0
    run_ns: int = 0  # wall time in KVM_RUN running this process
    cpu_ns: int = 0  # thread CPU time in KVM_RUN running this process
    slices: int = 0
    work: int = 0
    exit_code: int | None = None
    vcpu: int = 0
    kernel: guestos.KernelProcess | None = None  # a real program run by the demo guest kernel
    server: SyscallServer | None = None  # and its system calls
    argv: list[str] = field(default_factory=list)
    start_ns: int = 0  # a real program: monotonic time of its first instruction and of its exit
    end_ns: int = 0
    start_delay_ns: int = 0  # and its vCPU thread's run-queue wait then (the steal over its life)
    end_delay_ns: int = 0

    def truth(self) -> dict:
        out = {"pid": self.pid, "name": self.name, "vcpu": self.vcpu, "cr3": self.space.cr3,
               "run_ns": self.run_ns, "cpu_ns": self.cpu_ns, "work": self.work,
               "slices": self.slices, "state": self.state, "exit_code": self.exit_code}
        if self.server is not None:
            out["syscalls"] = {n: {"count": c, "ns": ns, "bytes": b}
                               for n, (c, ns, b) in sorted(self.server.calls.items())}
            out["wall_ns"] = self.end_ns - self.start_ns if self.end_ns else None
            out["run_delay_ns"] = self.end_delay_ns - self.start_delay_ns if self.end_ns else None
            out["unserved"] = {str(nr): c for nr, c in self.server.unserved.items()}
            out["output_dropped"] = self.server.dropped_output
        return out


@dataclass
class VcpuStats:
    tid: int = 0
    start_ns: int = 0
    end_ns: int = 0
    kvm_run_ns: int = 0  # in KVM_RUN with a guest process running
    halt_ns: int = 0  # in KVM_RUN halted (no runnable process): asleep, waiting for the pCPU, or on it
    pure_halt_ns: int = 0  # of halt_ns, asleep: not on the CPU and not runnable (the kernel's own counts)
    wakeup_wait_ns: int = 0  # of halt_ns, runnable after the wake-up timer fired, waiting for the pCPU
    wake_at_ns: int = 0  # when the armed wake-up timer fires (0: none armed)
    served: int = 0  # system calls served for a kernel-hosted process
    exits: dict[str, int] = field(default_factory=dict)


class VcpuThread(threading.Thread):
    def __init__(self, vm: DemoVm, index: int, processes: list[GuestProcess], pin: int | None) -> None:
        super().__init__(name=f"vcpu{index}", daemon=True)
        self.vm = vm
        self.index = index
        self.processes = processes
        self.pin = pin
        self.vcpu = vm.kvm_vm.create_vcpu(index)
        self.stats = VcpuStats()
        self.sched = (0, 0)
        self.kvm_stats: dict[str, int] = {}  # KVM's own halt counters of this vCPU, at its end
        self.ready = threading.Event()
        self.current: GuestProcess | None = None
        self.halted = False
        self.done = False
        self._sregs = self._initial_sregs()
        self._set_halted(False)  # with an in-kernel LAPIC, vCPUs other than 0 start waiting for SIPI
        self._rr = 0
        self.parked: GuestProcess | None = None  # a kernel-hosted process off the vCPU, its state left in it
        kernel = [p.kernel for p in processes if p.kernel is not None]
        if kernel:
            self.vcpu.set_supported_cpuid(vm.kvm_vm.kvm_fd)
            self.vcpu.set_msrs(guestos.syscall_msrs(kernel[0].image))

    def _initial_sregs(self) -> kvm.KvmSregs:
        sregs = self.vcpu.get_sregs()

        def seg(selector: int, code: bool) -> kvm.KvmSegment:
            return kvm.KvmSegment(base=0, limit=0xFFFFFFFF, selector=selector,
                                  type=11 if code else 3, present=1, dpl=3,
                                  db=0 if code else 1, s=1, l=1 if code else 0, g=1)

        sregs.cs = seg(0x33, True)
        for name in ("ds", "es", "fs", "gs", "ss"):
            setattr(sregs, name, seg(0x2B, False))
        sregs.cr0 = 0x80050033  # PG WP NE ET MP PE
        sregs.cr4 = 0x620  # PAE OSFXSR OSXMMEXCPT
        sregs.efer = 0xD00  # LME LMA NXE
        return sregs

    # -- process switching -------------------------------------------------
    def _load(self, proc: GuestProcess) -> None:
        if proc is self.parked:  # it sleeps inside its kernel: its registers are still the vCPU's
            self.current, self.parked = proc, None
            return
        if proc.kernel is not None:
            self.vcpu.set_sregs(guestos.kernel_sregs(self.vcpu.get_sregs(), proc.kernel.image, proc.space.cr3))
            self.vcpu.set_regs(proc.kernel.regs)
            self.current = proc
            return
        self._sregs.cr3 = proc.space.cr3
        self.vcpu.set_sregs(self._sregs)
        self.vcpu.set_regs(proc.regs)
        if proc.fpu is not None:
            kvm.ioctl(self.vcpu.fd, kvm.KVM_SET_FPU, proc.fpu)
        self.current = proc

    def _save(self) -> None:
        proc = self.current
        if proc is not None and proc.kernel is not None:  # the only process of its vCPU (DemoVm checks)
            self.parked, self.current = proc, None
            return
        if proc is not None:
            proc.regs = self.vcpu.get_regs()
            proc.fpu = KvmFpu()
            kvm.ioctl(self.vcpu.fd, kvm.KVM_GET_FPU, proc.fpu)
        self.current = None

    def _complete_pending_exit(self) -> None:
        """Finish the pending MMIO exit without running the guest (see KVM API: immediate_exit)."""
        self.vcpu.run_page.immediate_exit = 1
        self.vcpu.run()
        self.vcpu.run_page.immediate_exit = 0 if not self.vm.stopping else 1

    def _pick_next(self, now: int) -> GuestProcess | None:
        for proc in self.processes:
            if proc.state == "sleeping" and proc.wake_ns <= now:
                proc.state = "runnable"
        runnable = [p for p in self.processes if p.state == "runnable"]
        if not runnable:
            return None
        self._rr = (self._rr + 1) % len(runnable)
        return runnable[self._rr]

    def _set_halted(self, halted: bool) -> None:
        state = ctypes.c_uint32(kvm.MP_STATE_HALTED if halted else kvm.MP_STATE_RUNNABLE)
        kvm.ioctl(self.vcpu.fd, kvm.KVM_SET_MP_STATE, ctypes.addressof(state))
        self.halted = halted

    def _switch(self, now: int) -> bool:
        """Choose what the vCPU runs next.  False when every process has ended."""
        nxt = self._pick_next(now)
        if nxt is not self.current:
            self._save()
            if nxt is not None:
                self._load(nxt)
        if nxt is None:
            sleepers = [p.wake_ns for p in self.processes if p.state == "sleeping"]
            if not sleepers:
                return False
            # absolute: the wake-up time is exact however long this thread waits before arming the timer
            self.stats.wake_at_ns = max(min(sleepers), now + 1000)
            self.timer.arm(self.stats.wake_at_ns, self.vm.slice_ns if len(self.processes) > 1 else 0, absolute=True)
            if not self.halted:
                self._set_halted(True)
        elif self.halted:
            self._set_halted(False)
        return True

    # -- main loop ----------------------------------------------------------
    def run(self) -> None:
        tid = threading.get_native_id()
        set_thread_name(f"vcpu{self.index}")
        # pinned, or free to run anywhere (not on whatever CPU set the runner happened to have)
        os.sched_setaffinity(0, {self.pin} if self.pin is not None else range(os.cpu_count() or 1))
        self.stats.tid = tid
        if self.vm.quota is not None:
            self.vm.quota.add_thread(tid)
        # The tick signal is blocked except inside KVM_RUN (as QEMU does): one that fires while this thread
        # is in Python stays pending and ends the next KVM_RUN at once, instead of being handled in Python and
        # lost -- a wake-up timer shorter than the VMM's own work would otherwise leave the vCPU halted for good.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {TICK_SIGNAL})
        self.vcpu.set_signal_mask(set(blocked) - {TICK_SIGNAL})
        self.timer = ThreadTimer(tid)
        self._schedstat = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - reported to the runner, never a traceback
            self.vm.report_fault(self, None, f"vCPU {self.index} failed: {e}")
        finally:
            self.stats.end_ns = time.monotonic_ns()
            if self.vm.quota is not None:  # the group's throttled time then ends with the vCPU's life
                self.vm.quota.release_thread(tid)
            self.timer.delete()
            os.close(self._schedstat)
            self.sched = schedstat("self", tid)
            self.kvm_stats = {k: v for k, v in self.vcpu.stats().items() if k.startswith("halt_")}

    def _loop(self) -> None:
        self.stats.start_ns = time.monotonic_ns()
        self.ready.set()
        self.vm.go.wait()
        if len(self.processes) > 1:  # time-slicing needs ticks; a lone process runs undisturbed
            self.timer.arm(self.vm.slice_ns, self.vm.slice_ns)
        if not self._switch(time.monotonic_ns()):
            return
        exits = self.stats.exits
        while not self.vm.stopping:
            proc = self.current
            q0 = self._run_delay_ns() if proc is None else 0
            if proc is not None and proc.kernel is not None and proc.slices == 0:
                proc.start_delay_ns = self._run_delay_ns()
            t0, c0 = time.monotonic_ns(), time.thread_time_ns()
            if proc is not None and proc.slices == 0:
                proc.start_ns = t0
            completed = self.vcpu.run()
            t1, c1 = time.monotonic_ns(), time.thread_time_ns()
            if proc is None:
                # A halted KVM_RUN is on the CPU (entering, KVM's halt handling and polling, returning), asleep,
                # and runnable but waiting for the pCPU: the wall time minus the thread's CPU time and its
                # run-queue wait (schedstat) is exactly the time asleep; the wait after the timer fired is
                # the wake-up wait.
                waited = self._run_delay_ns() - q0
                wake = self.stats.wake_at_ns
                woken = t1 - wake if t0 <= wake <= t1 else 0  # else stopped, or woken by something else
                self.stats.halt_ns += t1 - t0
                self.stats.pure_halt_ns += max(0, t1 - t0 - (c1 - c0) - waited)
                self.stats.wakeup_wait_ns += min(waited, woken)
            else:
                proc.run_ns += t1 - t0
                proc.cpu_ns += c1 - c0
                proc.slices += 1
                self.stats.kvm_run_ns += t1 - t0
            if not completed:  # timer tick or stop request
                signal.sigtimedwait({TICK_SIGNAL}, 0)  # take it, or it ends every later KVM_RUN at once
                exits["INTR"] = exits.get("INTR", 0) + 1
                if not self._switch(t1):
                    return
                continue
            reason = self.vcpu.run_page.exit_reason
            name = kvm.EXIT_NAMES.get(reason, str(reason))
            exits[name] = exits.get(name, 0) + 1
            if proc is not None and proc.kernel is not None:
                if reason != KVM_EXIT_MMIO or not self._kernel_doorbell(proc, t1):
                    self._end(proc, f"unexpected exit {name}", t1)
            elif reason != KVM_EXIT_MMIO or proc is None or not self._doorbell(proc, t1):
                self.vm.report_fault(self, proc, f"unexpected exit {name}")
                return
            if self.done:
                return

    def _run_delay_ns(self) -> int:
        """This thread's run-queue wait so far (schedstat's second field; one pread of a file kept open)."""
        return int(os.pread(self._schedstat, 128, 0).split()[1])

    def _kernel_doorbell(self, proc: GuestProcess, now: int) -> bool:
        """A store of the guest kernel: a system call to serve, or an exception that ends the process."""
        mmio = self.vcpu.run_page.exit.mmio
        port = (mmio.phys_addr - DOORBELL_GPA) // 8
        if not mmio.is_write or port not in (guestos.PORT_SYSCALL, guestos.PORT_FAULT) or proc.kernel is None:
            return False
        assert proc.server is not None
        try:
            reply, what = guestos.serve_mailbox(self.vm.kvm_vm.memory, proc.kernel, proc.server, port)
        except Exception as e:  # noqa: BLE001 - a call the server could not handle ends its process, not the VM
            self._end(proc, f"the VMM failed serving a system call: {type(e).__name__}: {e}", now)
            return True
        if what:
            self._end(proc, what, now, rip=reply.nr)
            return True
        proc.server.account(reply.nr, time.monotonic_ns() - now, reply.ret)
        self.stats.served += 1
        if reply.exit_status is not None:
            proc.state, proc.exit_code = "exited", reply.exit_status
            proc.end_ns, proc.end_delay_ns = now, self._run_delay_ns()
        elif reply.sleep_ns is not None:
            proc.state, proc.wake_ns = "sleeping", now + reply.sleep_ns
        else:
            return True
        self._complete_pending_exit()
        self.done = not self._switch(now)
        return True

    def _end(self, proc: GuestProcess, what: str, now: int, rip: int | None = None) -> None:
        """End a kernel-hosted process that cannot go on, with one line; the VM and its other vCPUs run on."""
        self.vm.report_fault(self, proc, what, stop_vm=False, rip=rip)
        if proc.server is not None:
            proc.server.close_all()
        self.done = not self._switch(now)

    def _doorbell(self, proc: GuestProcess, now: int) -> bool:
        """Handle a doorbell store.  False if the exit was not a doorbell write."""
        mmio = self.vcpu.run_page.exit.mmio
        gpa, value = mmio.phys_addr, int.from_bytes(bytes(mmio.data)[:4], "little")
        if not mmio.is_write or not DOORBELL_GPA <= gpa < DOORBELL_GPA + PAGE:
            return False
        port = (gpa - DOORBELL_GPA) // 8
        if port in nic.PORTS:
            return self.vm.nic is not None and self.vm.nic.doorbell(proc.space.cr3, port, value)
        if port == PORT_PROGRESS:
            proc.work += value
            return True
        if port in (PORT_SLEEP_MS, PORT_SLEEP_US):
            proc.state, proc.wake_ns = "sleeping", now + value * (1_000_000 if port == PORT_SLEEP_MS else 1_000)
        elif port == PORT_EXIT:
            proc.state, proc.exit_code = "exited", value
        else:
            return False
        self._complete_pending_exit()
        self.done = not self._switch(now)
        return True


class DemoVm:
    def __init__(self, spec: dict) -> None:
        self.name: str = spec["name"]
        self.slice_ns = int(spec.get("slice_ms", 4) * 1_000_000)
        self.spec = spec
        self.stopping = False
        self.go = threading.Event()
        self.lock = threading.Lock()
        self.faults: list[dict] = []
        self.kvm_vm = kvm.Vm(int(spec.get("mem_mb", 64)) << 20)
        self.nic = nic.Nic(self.kvm_vm.memory) if spec.get("nic") else None
        kvm.ioctl(self.kvm_vm.fd, kvm.KVM_CREATE_IRQCHIP)  # in-kernel halt needs an in-kernel LAPIC
        alloc = PhysAllocator(self.kvm_vm.memory)
        self.processes: list[GuestProcess] = []
        self.vcpus: list[VcpuThread] = []
        pid = 1
        image = guestos.KernelImage.load(Path(spec["kernel"])) if spec.get("kernel") else None
        for index, vcpu_spec in enumerate(spec["vcpus"]):
            procs = []
            for p in vcpu_spec["processes"]:
                path = Path(p["path"])
                if "argv" in p:  # a real program: the guest kernel runs it, alone on its vCPU
                    if image is None or len(vcpu_spec["processes"]) != 1:
                        raise BadProgram("a real program needs the guest kernel and a vCPU of its own")
                    procs.append(self._real_process(pid, index, p, path, alloc, image))
                    pid += 1
                    continue
                space = load_program(path, self.kvm_vm.memory, alloc)
                args = [int(a) for a in p.get("args", [])] + [0, 0, 0, 0]
                regs = kvm.KvmRegs(rip=space.entry, rsp=space.stack_top, rflags=0x2,
                                   rdi=args[0], rsi=args[1], rdx=args[2], rcx=args[3])
                procs.append(GuestProcess(pid=pid, name=p.get("name", path.name), program=path,
                                          args=args[:4], space=space, regs=regs, vcpu=index))
                pid += 1
            self.processes += procs
            self.vcpus.append(VcpuThread(self, index, procs, vcpu_spec.get("pin")))
        # the throttling scenario: vCPU threads in a CPU cgroup with a cpu.max quota [quota_us, period_us]
        self.quota = CpuQuota(f"vmprof-demo-{os.getpid()}", *spec["cpu_max"]) if spec.get("cpu_max") else None

    def _real_process(self, pid: int, vcpu: int, p: dict, path: Path, alloc: PhysAllocator,
                      image: guestos.KernelImage) -> GuestProcess:
        argv = [str(a) for a in p["argv"]]
        space, kp = guestos.load_process(path, [a.encode() for a in argv], [b"PATH=/bin", b"HOME=/"],
                                         self.kvm_vm.memory, alloc, image)
        root = None
        if p.get("dir"):
            root = os.open(p["dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        name = p.get("name", path.name)

        def output(fd: int, data: bytes) -> None:
            emit({"event": "output", "vm": self.name, "pid": pid, "fd": fd, "text": data.decode(errors="replace")})

        def notice(what: str) -> None:
            emit({"event": "notice", "vm": self.name, "pid": pid, "process": name, "what": what})

        server = SyscallServer(kp.memory, root, pid, self.name, output, notice)
        return GuestProcess(pid=pid, name=name, program=path, args=[], space=space, regs=kp.regs, vcpu=vcpu,
                            kernel=kp, server=server, argv=argv)

    def report_fault(self, vcpu: VcpuThread, proc: GuestProcess | None, what: str, stop_vm: bool = True,
                     rip: int | None = None) -> None:
        if proc is not None:
            proc.state = "faulted"
            if rip is None:
                with contextlib.suppress(OSError):
                    rip = vcpu.vcpu.get_regs().rip
        fault = {"event": "fault", "vm": self.name, "vcpu": vcpu.index,
                 "pid": proc.pid if proc else None, "process": proc.name if proc else None,
                 "rip": rip, "what": what, "ended": "vm" if stop_vm else "process"}
        with self.lock:
            self.faults.append(fault)
        emit(fault)
        if stop_vm:
            self.stop()

    def stop(self) -> None:
        self.stopping = True
        if self.nic is not None:
            self.nic.stop()
        for v in self.vcpus:
            v.vcpu.run_page.immediate_exit = 1
            if v.ident is not None and v.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    signal.pthread_kill(v.ident, TICK_SIGNAL)

    def describe(self) -> dict:
        return {"event": "ready", "vm": self.name, "pid": os.getpid(),
                "bundle": self.spec.get("bundle"),
                "vcpus": [{"vcpu": v.index, "tid": v.stats.tid, "pin": v.pin} for v in self.vcpus],
                "processes": [{"pid": p.pid, "name": p.name, "vcpu": p.vcpu, "cr3": p.space.cr3,
                               "elf": str(p.program), "args": p.args} for p in self.processes]}

    def truth(self, wall_ns: int) -> dict:
        vcpus = []
        for v in self.vcpus:
            cpu_ns, delay_ns = v.sched
            vcpus.append({"vcpu": v.index, "tid": v.stats.tid, "pin": v.pin,
                          "wall_ns": v.stats.end_ns - v.stats.start_ns,
                          "kvm_run_ns": v.stats.kvm_run_ns, "halt_ns": v.stats.halt_ns,
                          "pure_halt_ns": v.stats.pure_halt_ns, "wakeup_wait_ns": v.stats.wakeup_wait_ns,
                          "thread_cpu_ns": cpu_ns, "run_delay_ns": delay_ns,
                          "exits": v.stats.exits, "kvm": v.kvm_stats, "served_syscalls": v.stats.served})
        throttled = {}
        if self.quota is not None:
            throttled = {"throttled_ns": self.quota.throttled_ns(), "cpu_max": self.spec["cpu_max"]}
            self.quota.remove()
        return {"event": "exit", "vm": self.name, "pid": os.getpid(), "wall_ns": wall_ns, **throttled,
                "vcpus": vcpus, "processes": [p.truth() for p in self.processes],
                "nic": self.nic.truth() if self.nic is not None else None, "faults": self.faults}


def write_bundle(vm: DemoVm, directory: Path) -> None:
    """Write the guest bundle (docs/bundle.md) that names this VM's guest samples."""
    objects = directory / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    copied: dict[Path, str] = {}

    def copy(path: Path) -> str:  # a file into objects/, once
        if path not in copied:
            data = path.read_bytes()
            (objects / (name := hashlib.sha256(data).hexdigest()[:32])).write_bytes(data)
            copied[path] = f"objects/{name}"
        return copied[path]

    processes = []
    for p in vm.processes:
        maps = [{"start": m.start, "end": m.end, "perms": m.perms, "offset": m.offset,
                 "path": m.path if m.path.startswith("[") else f"/bin/{p.name}",
                 "object": None if m.path.startswith("[") else copy(p.program)}
                for m in p.space.maps]
        processes.append({"pid": p.pid, "tids": [p.pid], "name": p.name,
                          "cmdline": p.argv or [f"/bin/{p.name}", *map(str, p.args)],
                          "exe": f"/bin/{p.name}", "maps": maps,
                          "cr3": [p.space.cr3, p.space.cr3 + PAGE] if p.kernel is not None else [p.space.cr3]})
    kernel = None
    image = next((p.kernel.image for p in vm.processes if p.kernel is not None), None)
    if image is not None:  # the guest kernel's symbols, as a Linux guest's kallsyms, and its ELF file (its CFI)
        (directory / bundle_format.KALLSYMS).write_text(image.kallsyms)
        kernel = {"release": "vmprof demo guest kernel", "build_id": None, "kallsyms": bundle_format.KALLSYMS,
                  "object": copy(image.path), "modules": []}
    bundle = {"format": bundle_format.FORMAT, "version": bundle_format.VERSION, "vm": vm.name,
              "created_by": "vmprof demo VMM", "cr3_method": "vmm", "kernel": kernel, "processes": processes}
    tmp = directory / f"{bundle_format.INDEX}.tmp"
    tmp.write_text(json.dumps(bundle, indent=1))
    tmp.rename(directory / bundle_format.INDEX)


_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m vmprof_tui.demo.vmm SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    set_thread_name(spec["name"])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # never outlive the runner
    signal.signal(TICK_SIGNAL, lambda *_: None)
    try:
        vm = DemoVm(spec)
    except (OSError, BadProgram, MemoryError, CgroupError) as e:
        print(f"vmprof demo: VM {spec['name']}: {e}", file=sys.stderr)
        return 1
    if spec.get("bundle"):
        write_bundle(vm, Path(spec["bundle"]))
    signal.signal(signal.SIGTERM, lambda *_: vm.stop())
    signal.signal(signal.SIGINT, lambda *_: vm.stop())
    start = time.monotonic_ns()
    for v in vm.vcpus:
        v.start()
    for v in vm.vcpus:
        v.ready.wait()
    emit(vm.describe())
    vm.go.set()
    duration = spec.get("duration_s")
    deadline = None if not duration else time.monotonic() + float(duration)
    while any(v.is_alive() for v in vm.vcpus):
        if deadline is not None and time.monotonic() >= deadline and not vm.stopping:
            vm.stop()
        for v in vm.vcpus:
            v.join(timeout=0.05)
    emit(vm.truth(time.monotonic_ns() - start))
    return 1 if vm.faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
