"""One collection session: every consumer (`record`, `top`, the continuous agent) gets its data here.

**sample** → record: the session checks privileges, loads the hypervisor backend and the BPF
programs (and starts the LBR collector it was given with `--lbr`), finds VMs and registers their vCPU threads with the
sched program, snapshots every newly sampled host process, and hands out what each drain brought
as a ``Chunk``.  A consumer only decides what to do with chunks: `record` writes them to a file,
the live screen keeps a sliding window of them.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from vmprof_tui import __version__
from vmprof_tui.collect import discover
from vmprof_tui.collect.backends import Backend, load_backend
from vmprof_tui.collect.bpf import HOST_STACK_ENTRIES, Collector, check_privileges
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, STACK_COPY_BYTES, stack_rows
from vmprof_tui.resolve.elf import read_build_id, read_elf_symbols_uncached
from vmprof_tui.resolve.object_table import encode_object_table
from vmprof_tui.resolve.untrusted import BundleError

DISCOVER_S = 1.0  # new VMs and vCPU threads are rare; a /proc scan is not free
# A process first sampled between its fork and its exec (a shell's or perf's child) was snapshotted as the old
# program: its name is checked against the sampler's for this long after, and a changed one is snapshotted again.
EXEC_RECHECK_S = 3.0


class SessionError(RuntimeError):
    """Collection cannot start as asked (one line for the user)."""


class BranchCollectorError(RuntimeError):
    """A branch collector cannot collect here: one line saying why and what to do instead."""


class BranchCollector(Protocol):
    """An LBR collector as the session drives it; its caller makes it: on a host with a PMU lbr/collector.py's
    (hardware cycles, instructions and branch stacks), anywhere lbr/simulate.py's (a single-stepped command)."""

    nr: int  # entries per record (known once started)

    @property
    def fields(self) -> int:
        """Which parts of an entry the records hold (lbr.model.Fields)."""

    def check(self) -> None:
        """Raise BranchCollectorError when this host cannot collect, before anything is loaded."""

    def start(self) -> None:
        """Start collecting (BranchCollectorError when it cannot)."""

    def poll(self) -> np.ndarray:
        """The raw LBR records (lbr.records.record_dtype) since the last poll, and forget them."""

    def host_samples(self) -> np.ndarray:
        """SAMPLE_DTYPE rows of its own since the last poll: a single-stepped program's, which no timer sees at
        work (empty on a PMU host, where the BPF sampler sees the same code)."""

    def stats(self) -> dict[str, int]:
        """Its counters (samples, drops, errors), for the lost counters."""

    def disable(self) -> None:
        """Stop sampling, what was collected still readable: stats() are final after it."""

    def stop(self) -> None:
        """Release everything."""

    def meta(self) -> dict:
        """The recording's meta["lbr"]: what collected and how."""


@dataclass
class Chunk:
    """What one drain brought.  Every part may be empty."""
    samples: np.ndarray  # SAMPLE_DTYPE rows, after the session's --vm/--pid filters
    sched: np.ndarray  # SCHED_DTYPE rows (never filtered: blank time needs every switch)
    lbr: np.ndarray | None = None  # raw LBR records (lbr_records.record_dtype) when LBR is collected
    processes: dict[int, dict] = field(default_factory=dict)  # snapshots of processes sampled for the first time
    new_vms: list[discover.VmInfo] = field(default_factory=list)  # VMs seen for the first time
    gone_vms: list[discover.VmInfo] = field(default_factory=list)  # VMs that stopped since the last chunk
    elapsed_s: float = 0.0  # from the start of the session to the drain (what the records cover)
    stacks: np.ndarray | None = None  # STACK_DTYPE rows of the chunk's samples (-g)
    host_stacks: dict[int, np.ndarray] = field(default_factory=dict)  # new stack-map ids -> addresses (-g)
    host_counts: np.ndarray | None = None  # host tasks' samples counted in the kernel (collect.bpf.HOST_COUNTS_DTYPE)
    ustacks: np.ndarray | None = None  # user-stack copies of the chunk's samples (--call-graph cfi)


@lru_cache(maxsize=4096)
def build_id(path: str) -> str | None:
    return read_build_id(Path(path))


def snapshot_process(pid: int, comm: str | None = None, build_ids: bool = True) -> dict | None:
    """What names a host process's samples: /proc when it is still there, else only the `comm` the
    sampler saw (no maps: its user code stays unresolved).  build_ids=False skips reading the build id
    of every mapped file (the live screen does not keep them)."""
    snap = discover.process_snapshot(pid)
    if snap is None:
        return {"pid": pid, "comm": comm, "cmdline": [], "exe": None, "maps": "", "build_ids": {},
                "exited": True} if comm else None
    ids = {}
    for line in snap["maps"].splitlines() if build_ids else ():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
            bid = build_id(parts[5])
            if bid:
                ids[parts[5]] = bid
    snap["build_ids"] = ids
    return snap


def read_kallsyms() -> str:
    try:
        return Path("/proc/kallsyms").read_text()
    except OSError:
        return ""


def read_object_table(path: str, build_id: str) -> bytes | None:
    """The symbol table of a host object file as `vmprof agent` stores it (resolve/object_table.py); None when
    the file cannot be read or is no longer the build a process mapped (it was replaced since)."""
    try:
        sym = read_elf_symbols_uncached(Path(path))
    except (BundleError, OSError):
        return None
    return encode_object_table(sym) if sym.build_id == build_id else None


class CollectionSession:
    """The BPF programs on every CPU, the VMs on this host, and the processes sampled so far."""

    def __init__(self, frequency: int = 1000, *, vm_names: Iterable[str] = (), pid: int | None = None,
                 lbr: BranchCollector | None = None, build_ids: bool = True, backend: Backend | None = None,
                 stacks: bool = False, stack_map_entries: int = HOST_STACK_ENTRIES, host_counts: bool = False,
                 event: str = "", call_graph: str = "fp", stack_copy_bytes: int = STACK_COPY_BYTES) -> None:
        check_privileges()  # before anything else, so the user hears the real reason
        self.backend = backend or load_backend()
        self.frequency = frequency
        self.vm_names = list(vm_names)
        self.pid = pid
        self.build_ids = build_ids
        self.collector = Collector(self.backend, frequency=frequency, event=event, stacks=stacks,
                                   stack_map_entries=stack_map_entries, host_counts=host_counts,
                                   call_graph=call_graph, stack_copy_bytes=stack_copy_bytes)
        self.lbr = lbr
        self.vmm_exits: dict[str, dict[str, int]] = {}  # returns of KVM_RUN to the VMM by thread, at the end
        if lbr is not None:
            try:
                lbr.check()
            except BranchCollectorError as e:
                raise SessionError(f"--lbr: {e}") from None
        self.vms: dict[int, discover.VmInfo] = {}  # running now, by VMM pid
        self.vms_seen: dict[int, discover.VmInfo] = {}  # every VM of the session
        self.pids_seen: set[int] = set()
        self._recent: dict[int, tuple[str | None, float]] = {}  # pid -> (its name when snapshotted, when)
        self.attached = threading.Event()  # set once the BPF programs sample: consumers and tests wait on it
        self.on_attached: Callable[[], None] | None = None  # called once, right after attached is set
        self.started_at = 0.0
        self.start_unix_s = 0.0
        self._last_discover = 0.0
        self._pending_new: list[discover.VmInfo] = []
        self._pending_gone: list[discover.VmInfo] = []

    def check_vm_names(self) -> None:
        """--vm names that no running VM has are an error before anything is collected."""
        names = {vm.name for vm in discover.discover_vms()}
        missing = [n for n in self.vm_names if n not in names]
        if missing:
            running = ", ".join(sorted(names)) or "none"
            raise SessionError(f"no VM named {', '.join(missing)} on this host (running VMs: {running})")

    def start(self) -> None:
        if self.vm_names:
            self.check_vm_names()
        self.collector.start()
        if self.lbr is not None:
            try:
                self.lbr.start()
            except BranchCollectorError as e:
                self.collector.close()
                raise SessionError(f"--lbr: {e}") from None
        self.started_at = time.monotonic()
        self.start_unix_s = time.time()
        self._discover()
        self.attached.set()
        if self.on_attached is not None:
            self.on_attached()

    @property
    def started(self) -> bool:
        return self.collector.started

    def meta(self) -> dict:
        """The recording's meta chunk: where, what and how this session samples."""
        be = self.backend
        return {"vmprof": __version__, "host": socket.gethostname(), "kernel": platform.release(),
                "machine": platform.machine(), "cpus": os.cpu_count(), "backend": be.name,
                "event": self.collector.event, "frequency": self.frequency,
                "clock": "CLOCK_MONOTONIC (bpf_ktime_get_ns)", "start_monotonic_ns": time.monotonic_ns(),
                "start_unix_s": time.time(), "offsets": be.offsets, "kvm_sched_in": be.kvm_sched_in,
                "vmx_helper": be.vmx_helper is not None, "notes": be.notes, "stacks": self.collector.stacks,
                "call_graph": self.collector.call_graph if self.collector.stacks else None,
                "stack_copy_bytes": self.collector.stack_copy_bytes if self.collector.copies else None,
                "filters": {"vm": self.vm_names, "pid": self.pid},
                "lbr": None if self.lbr is None else self.lbr.meta()}

    def _discover(self) -> None:
        self._last_discover = time.monotonic()
        current = {vm.pid: vm for vm in discover.discover_vms()}
        for pid, vm in current.items():
            known = self.vms_seen.get(pid)
            new_threads = vm.vcpu_threads if known is None else {
                t: v for t, v in vm.vcpu_threads.items() if t not in known.vcpu_threads}
            if new_threads:
                self.collector.add_vcpu_threads({t: pid for t in new_threads})
            if known is None:
                self.vms_seen[pid] = vm
                self._pending_new.append(vm)
            else:
                known.vcpu_threads.update(new_threads)
        self._pending_gone += [vm for pid, vm in self.vms.items() if pid not in current]
        self.vms = {pid: self.vms_seen[pid] for pid in current}
        for vm in self.vms.values():
            vm.read_run_delay()

    def _keep(self, samples: np.ndarray) -> np.ndarray:
        if self.pid is not None:
            samples = samples[samples["pid"] == self.pid]
        if self.vm_names:
            pids = [pid for pid, vm in self.vms_seen.items() if vm.name in self.vm_names]
            samples = samples[np.isin(samples["pid"], pids)]
        return samples

    def poll(self, discover_every_s: float = DISCOVER_S) -> Chunk:
        """Everything recorded since the last poll (the caller polls on its own timer)."""
        lbr = self.lbr.poll() if self.lbr is not None else None
        own = self.lbr.host_samples() if self.lbr is not None else None
        # the records drained cover the session up to here (discovery and snapshots below take a while)
        elapsed_s = time.monotonic() - self.started_at
        drained = self.collector.drain()
        if own is not None and len(own):
            drained.samples = np.concatenate([drained.samples, own])
        if time.monotonic() - self._last_discover >= discover_every_s:
            self._discover()
        samples = self._keep(drained.samples) if len(drained.samples) else np.empty(0, SAMPLE_DTYPE)
        counts = drained.host_counts if drained.host_counts is None else self._keep(drained.host_counts)
        pids = np.unique(samples["pid"] if counts is None else np.concatenate([samples["pid"], counts["pid"]]))
        new_pids = set(pids.tolist()) - self.pids_seen - {0}
        processes = {}
        now = time.monotonic()
        self._recent = {pid: seen for pid, seen in self._recent.items() if now - seen[1] < EXEC_RECHECK_S}
        names = self.collector.process_names(new_pids | self._recent.keys()) if new_pids or self._recent else {}
        renamed = {pid for pid, (name, _t) in self._recent.items() if names.get(pid, name) != name}
        for pid in new_pids | renamed:
            if snap := snapshot_process(pid, names.get(pid), self.build_ids):
                processes[pid] = snap
                self._recent[pid] = (names.get(pid), now)
        self.pids_seen |= new_pids
        stacks = drained.stacks
        if stacks is not None and len(stacks) and (self.pid is not None or self.vm_names):
            rows = stack_rows(samples, stacks)
            stacks = stacks[np.unique(rows[rows >= 0])]  # the kept samples' stacks only
        ustacks = drained.ustacks
        if ustacks is not None and len(ustacks) and (self.pid is not None or self.vm_names):
            rows = stack_rows(samples, ustacks)
            ustacks = ustacks[np.unique(rows[rows >= 0])]
        chunk = Chunk(samples, drained.sched, lbr, processes, self._pending_new, self._pending_gone, elapsed_s,
                      stacks, drained.host_stacks, counts, ustacks)
        self._pending_new, self._pending_gone = [], []
        return chunk

    def forget_processes(self, pids: Iterable[int]) -> None:
        """These pids get a fresh snapshot when sampled again (a window that dropped them, a reused pid)."""
        self.pids_seen.difference_update(pids)

    def lost(self) -> dict[str, list[int]]:
        """Records dropped because a ring buffer was full, per CPU (and the LBR collector's counters)."""
        lost: dict = self.collector.lost() if self.started else {"samples": [], "sched": []}
        if self.lbr is not None:
            lost["lbr"] = self.lbr.stats()
        return lost

    def finish(self) -> tuple[Chunk, dict]:
        """Stop sampling: the last chunk and the final lost counters (they agree with each other)."""
        if self.lbr is not None:
            self.lbr.disable()  # the counters read next are then final
        chunk = self.poll(discover_every_s=0.0)
        lost = self.lost()
        self.vmm_exits = self.collector.vmm_exits()
        self.close()
        return chunk, lost

    def close(self) -> None:
        self.collector.close()
        if self.lbr is not None:
            self.lbr.stop()
