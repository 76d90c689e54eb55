"""VM discovery: the VMM process of each VM, its name and its vCPU threads.

A VMM is a process holding an ``anon_inode:kvm-vm`` file descriptor.  Names
come from the VMM's command line (QEMU/libvirt ``-name``, Firecracker
``--id``, our demo VMM's spec), else from its comm.  vCPU ids of threads come
from their names where the VMM names them (QEMU ``CPU 0/KVM``, Firecracker
``fc_vcpu 0``, cloud-hypervisor and the demo ``vcpu0``); the sampler also
learns them from ``kvm_vcpu.vcpu_id``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vmprof_tui.libc import schedstat

PROC = Path("/proc")
_VCPU_THREAD = re.compile(r"^(?:vcpu ?|CPU |fc_vcpu ?)(\d+)(?:/KVM)?$")


@dataclass
class VmInfo:
    name: str
    pid: int
    kind: str  # demo | qemu | firecracker | cloud-hypervisor | crosvm | unknown
    vcpu_threads: dict[int, int | None] = field(default_factory=dict)  # tid -> vcpu id (None: unknown)
    vcpu_fds: int = 0
    bundle: str | None = None  # demo VMs: the folder of their guest bundle
    # tid -> [time, run-queue wait, time, run-queue wait]: the first and the last reading of the wait the
    # host's scheduler counted for the vCPU thread (/proc/PID/task/TID/schedstat), with their CLOCK_MONOTONIC
    # times (the clock of the records), read when the session first saw it and at each discovery since
    run_delay_ns: dict[int, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["vcpu_threads"] = {str(k): v for k, v in self.vcpu_threads.items()}
        d["run_delay_ns"] = {str(k): v for k, v in self.run_delay_ns.items()}
        return d

    def read_run_delay(self) -> None:
        for tid in self.vcpu_threads:
            now = time.monotonic_ns()
            run, wait = schedstat(self.pid, tid)
            if run:  # (0, 0): the thread is gone; its last reading stays
                self.run_delay_ns.setdefault(tid, [now, wait, now, wait])[2:] = [now, wait]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _kvm_fds(pid: int) -> tuple[bool, int]:
    has_vm, vcpus = False, 0
    fd_dir = f"{PROC}/{pid}/fd/"  # plain strings: this runs for every fd on the host every few seconds
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False, 0
    for fd in fds:
        try:
            target = os.readlink(fd_dir + fd)
        except OSError:
            continue
        if target == "anon_inode:kvm-vm":
            has_vm = True
        elif target.startswith("anon_inode:kvm-vcpu"):
            vcpus += 1
    return has_vm, vcpus


def _name_from_cmdline(args: list[str], comm: str) -> tuple[str, str, str | None]:
    """(name, kind, bundle) from a VMM command line."""
    joined = " ".join(args[:3])
    if "vmprof_tui.demo.vmm" in joined and args:
        try:
            spec = json.loads(args[-1])
            return str(spec["name"]), "demo", spec.get("bundle")
        except (ValueError, KeyError, TypeError):
            return comm, "demo", None
    for i, arg in enumerate(args[:-1]):
        if arg == "-name":  # QEMU: -name guest=NAME,debug-threads=on  or  -name NAME
            value = args[i + 1]
            for part in value.split(","):
                if part.startswith("guest="):
                    return part[6:], "qemu", None
            return value.split(",")[0], "qemu", None
        if arg == "--id" and "firecracker" in (args[0] + comm):
            return args[i + 1], "firecracker", None
    base = os.path.basename(args[0]) if args else comm
    for kind in ("qemu", "firecracker", "cloud-hypervisor", "crosvm"):
        if kind in base or kind[:15] in comm:
            return comm, kind, None
    return comm, "unknown", None


def discover_vms() -> list[VmInfo]:
    vms = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        has_vm, vcpu_fds = _kvm_fds(pid)
        if not has_vm:
            continue
        comm = _read(entry / "comm").strip()
        name, kind, bundle = _name_from_cmdline(_cmdline(pid), comm)
        threads: dict[int, int | None] = {}
        try:
            tids = [int(t) for t in os.listdir(entry / "task")]
        except OSError:
            tids = []
        for tid in tids:
            if tid == pid:  # the main thread is the VMM itself, whatever it is called
                continue
            match = _VCPU_THREAD.match(_read(entry / "task" / str(tid) / "comm").strip())
            if match:
                threads[tid] = int(match.group(1))
        vms.append(VmInfo(name=name, pid=pid, kind=kind, vcpu_threads=threads, vcpu_fds=vcpu_fds,
                          bundle=bundle))
    return sorted(vms, key=lambda v: (v.name, v.pid))


def process_snapshot(pid: int) -> dict | None:
    """comm, cmdline, exe and maps of a host process, for naming its samples later."""
    base = PROC / str(pid)
    maps = _read(base / "maps")
    if not maps:
        return None
    try:
        exe = os.readlink(base / "exe")
    except OSError:
        exe = None
    return {"pid": pid, "comm": _read(base / "comm").strip(), "cmdline": _cmdline(pid), "exe": exe, "maps": maps}
