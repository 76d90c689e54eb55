"""`vmprof record`: collect on every CPU and write a recording until stopped.

Draining, writing and discovery run on one loop: drain every 100 ms, flush
(fsync) a chunk every 500 ms, look for new VMs and processes every second.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from vmprof_tui import __version__, discover
from vmprof_tui.backends import Backend, load_backend
from vmprof_tui.bundle import read_build_id
from vmprof_tui.collect import Collector, check_privileges
from vmprof_tui.lbr.capability import detect
from vmprof_tui.lbr.collect import LbrCollector, LbrConfig, LbrUnsupported
from vmprof_tui.recording import Writer
from vmprof_tui.records import SAMPLE_GUEST

DRAIN_S, FLUSH_S, DISCOVER_S = 0.1, 0.5, 1.0


class RecordError(RuntimeError):
    pass


@dataclass
class Progress:
    elapsed_s: float = 0.0
    samples: int = 0
    guest: int = 0
    lost: int = 0
    vms: list[str] = field(default_factory=list)

    def count_lost(self, lost: dict[str, list[int]]) -> None:
        self.lost = sum(lost["samples"]) + sum(lost["sched"])

    def summary(self) -> str:
        return f"samples {self.samples}, guest {self.guest}, lost {self.lost}, duration {self.elapsed_s:.1f}"


@lru_cache(maxsize=4096)
def build_id(path: str) -> str | None:
    return read_build_id(Path(path))


def snapshot_processes(collector: Collector, pids: set[int], build_ids: bool = True) -> dict[int, dict]:
    """Snapshots of newly sampled processes, by pid (see snapshot_process)."""
    names = collector.process_names(pids)
    return {pid: snap for pid in pids if (snap := snapshot_process(pid, names.get(pid), build_ids))}


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


def _kallsyms() -> str:
    try:
        return Path("/proc/kallsyms").read_text()
    except OSError:
        return ""


class Recorder:
    def __init__(self, out: Path, frequency: int = 1000, vm_names: list[str] | None = None,
                 pid: int | None = None, backend: Backend | None = None, lbr: LbrConfig | None = None) -> None:
        self.out = out
        self.frequency = frequency
        self.vm_names = vm_names or []
        self.pid = pid
        check_privileges()  # before anything else, so the user hears the real reason
        self.backend = backend or load_backend()
        self.vms: dict[int, discover.VmInfo] = {}
        self.pids_seen: set[int] = set()
        self.progress = Progress()
        self.started = threading.Event()  # set once the BPF programs sample
        self.collector = Collector(self.backend, frequency=frequency)
        self.lbr = LbrCollector(lbr) if lbr is not None else None
        if lbr is not None and not lbr.standin:
            caps = detect(lbr.effective.branch_filter)
            if not caps.ok:
                raise RecordError(f"--lbr: {caps.message}")

    def _discover(self) -> bool:
        """Add newly started VMs; True if any was added."""
        added = False
        for vm in discover.discover_vms():
            if vm.pid in self.vms:
                known = self.vms[vm.pid]
                new_threads = {t: v for t, v in vm.vcpu_threads.items() if t not in known.vcpu_threads}
                if new_threads:
                    known.vcpu_threads.update(new_threads)
                    self.collector.add_vcpu_threads({t: vm.pid for t in new_threads})
                continue
            self.vms[vm.pid] = vm
            self.collector.add_vcpu_threads({t: vm.pid for t in vm.vcpu_threads})
            if vm.bundle and Path(vm.bundle, "bundle.json").exists():
                self.writer.add_bundle(vm.name, Path(vm.bundle))
            added = True
        self.progress.vms = sorted(vm.name for vm in self.vms.values())
        return added

    def _check_vm_names(self, vms: list[discover.VmInfo]) -> None:
        names = {vm.name for vm in vms}
        missing = [n for n in self.vm_names if n not in names]
        if missing:
            running = ", ".join(sorted(names)) or "none"
            raise RecordError(f"no VM named {', '.join(missing)} on this host (running VMs: {running})")

    def _keep(self, samples: np.ndarray) -> np.ndarray:
        if self.pid is not None:
            samples = samples[samples["pid"] == self.pid]
        if self.vm_names:
            pids = [pid for pid, vm in self.vms.items() if vm.name in self.vm_names]
            samples = samples[np.isin(samples["pid"], pids)]
        return samples

    def meta(self) -> dict:
        be = self.backend
        return {"vmprof": __version__, "host": socket.gethostname(), "kernel": platform.release(),
                "machine": platform.machine(), "cpus": os.cpu_count(), "backend": be.name,
                "event": self.collector.event, "frequency": self.frequency,
                "clock": "CLOCK_MONOTONIC (bpf_ktime_get_ns)", "start_monotonic_ns": time.monotonic_ns(),
                "start_unix_s": time.time(), "offsets": be.offsets, "kvm_sched_in": be.kvm_sched_in,
                "vmx_helper": be.vmx_helper is not None, "notes": be.notes,
                "filters": {"vm": self.vm_names, "pid": self.pid},
                "lbr": None if self.lbr is None else {"pattern": self.lbr.config.pattern.name,
                                                      "standin": self.lbr.config.standin}}

    def run(self, duration_s: float | None, should_stop: Callable[[], bool],
            on_progress: Callable[[Progress], None] | None = None) -> Progress:
        if self.vm_names:
            self._check_vm_names(discover.discover_vms())
        self.writer = Writer(self.out, self.meta())
        try:
            self.collector.start()
            if self.lbr is not None:
                try:
                    self.lbr.start()
                except LbrUnsupported as e:
                    raise RecordError(f"--lbr: {e}") from None
            self.started.set()
        except Exception:
            self.writer.file.close()
            self.out.unlink(missing_ok=True)
            raise
        try:
            self._discover()
            self.writer.add_snapshot({"vms": [vm.to_json() for vm in self.vms.values()]})
            start = time.monotonic()
            last_flush = last_discover = last_progress = start
            while True:
                time.sleep(DRAIN_S)
                now = time.monotonic()
                self._drain(now - start)
                done = should_stop() or (duration_s is not None and now - start >= duration_s)
                if now - last_discover >= DISCOVER_S or done:
                    if self._discover():
                        self.writer.add_snapshot({"vms": [vm.to_json() for vm in self.vms.values()]})
                    last_discover = now
                if now - last_flush >= FLUSH_S or done:
                    self.writer.flush()
                    last_flush = now
                if on_progress and (now - last_progress >= 1.0 or done):
                    self.progress.count_lost(self.collector.lost())
                    on_progress(self.progress)
                    last_progress = now
                if done:
                    break
        finally:
            self._finish()
        return self.progress

    def _drain(self, elapsed: float) -> None:
        if self.lbr is not None:
            records = self.lbr.poll(0)
            if len(records):
                self.writer.add_lbr(records, self.lbr.nr, int(self.lbr.config.effective.fields))
        drained = self.collector.drain()
        samples = self._keep(drained.samples)
        self.writer.add(samples, drained.sched)
        p = self.progress
        p.elapsed_s = elapsed
        p.samples += len(samples)
        p.guest += int(np.count_nonzero(samples["flags"] & SAMPLE_GUEST))
        new_pids = set(np.unique(samples["pid"]).tolist()) - self.pids_seen - {0}
        if new_pids:
            procs = snapshot_processes(self.collector, new_pids)
            self.pids_seen |= new_pids
            if procs:
                self.writer.add_snapshot({f"process:{pid}": snap for pid, snap in procs.items()})

    def _finish(self) -> None:
        lost = {"samples": [], "sched": []}
        if self.collector.started:
            self._drain(self.progress.elapsed_s)  # what arrived since the last drain
            lost = self.collector.lost()
            self.progress.count_lost(lost)
        self.collector.close()
        if self.lbr is not None:
            self.lbr.disable()  # the counters read next are then final and agree with each other
            lost["lbr"] = self.lbr.stats()
            self.lbr.stop()
        self.writer.add_snapshot({"kallsyms": _kallsyms()})
        self.writer.close({"duration_s": self.progress.elapsed_s, "samples": self.progress.samples,
                           "guest_samples": self.progress.guest, "lost": lost,
                           "end_monotonic_ns": time.monotonic_ns(),
                           "vms": [vm.to_json() for vm in self.vms.values()]})
