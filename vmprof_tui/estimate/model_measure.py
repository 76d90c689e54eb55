"""Measuring one point of the multi-VM model: workloads at given levels in a fresh demo VM.

Each point starts a demo VM (vmprof_tui/demo) with one vCPU and the virtual NIC, running one
`load` guest process per workload whose level is above 0 (none: an idle process), lets it settle,
and measures the CPU time of the VMM's threads over a window:

* ``sched`` (the default): vmprof's own accounting, the sched_switch events of the collection
  session's BPF program (the same events `record` and the timelines use).  One session serves
  every point; each VM's threads (vCPUs, the NIC's I/O thread, the VMM's main thread) are
  registered with it when the VM is up, and a thread's on-CPU time in the window is the sum of
  its intervals between being switched in and out.  A thread that never switched in the window
  ran the whole window or none of it; its schedstat says which.
* ``schedstat``: the kernel's per-thread run time (/proc/PID/task/TID/schedstat), read at both
  ends of the window.  It needs no BPF; both are recorded for every point, so they cross-check.

Resources: ``vm-cpu`` the vCPU threads, ``vmm-cpu`` the VMM's other threads (the NIC's I/O
thread above all), ``host-cpu`` both, in cores (CPU seconds per second).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.demo.runner import DemoRun
from vmprof_tui.libc import schedstat
from vmprof_tui.record.bpf_records import context_switches

RESOURCES = ("host-cpu", "vm-cpu", "vmm-cpu")
ACCOUNTINGS = ("sched", "schedstat")
MODES = {"cpu": 0, "net-send": 1, "net-recv": 2}  # programs/load.c
MAX_PACKETS = 1000  # packets per 20 ms period at level 1 (50,000 packets/s of 1 KiB)
POLL_S = 0.1  # the session is drained this often during a window (its ring buffer is finite)


def l_max(resource: str, cpus: Sequence[int] | None = None) -> float:
    """The resource's maximum: one vCPU for vm-cpu, the CPUs the VM may use otherwise."""
    return 1.0 if resource == "vm-cpu" else float(len(cpus) if cpus else os.cpu_count() or 1)


def on_cpu_ns(sched: np.ndarray, tid: int, t0: int, t1: int, ran_whole: bool) -> int:
    """On-CPU time of thread `tid` in [t0, t1] from sched_switch events (SCHED_DTYPE rows, any order).

    `sched` must hold every switch of the thread since some time before t0 (its history); `ran_whole`
    decides for a thread with no event at all in it: on the CPU throughout or not."""
    switches = context_switches(sched)
    ev = switches[(switches["prev_tid"] == tid) | (switches["next_tid"] == tid)]
    ev = ev[np.argsort(ev["time_ns"], kind="stable")]
    times = ev["time_ns"].astype(np.int64)
    switched_in = ev["next_tid"] == tid
    before = np.nonzero(times <= t0)[0]
    inside = np.nonzero((times > t0) & (times < t1))[0]
    if len(before):
        on_at_t0 = bool(switched_in[before[-1]])
    elif len(inside):
        on_at_t0 = not bool(switched_in[inside[0]])  # its first event switched it out: it was on
    else:
        return (t1 - t0) if ran_whole else 0
    starts = np.concatenate([[t0], times[inside]])
    ends = np.concatenate([times[inside], [t1]])
    on = np.concatenate([[on_at_t0], switched_in[inside]])
    return int((ends - starts)[on].sum())


@dataclass
class Point:
    """One measurement: CPU seconds per second of the VM's threads, by both accountings."""
    levels: list[float]
    window_s: float
    cores: dict[str, dict[str, float]] = field(default_factory=dict)  # accounting -> resource -> cores

    def value(self, resource: str, accounting: str) -> float:
        return self.cores[accounting][resource]


class Bench:
    """Demo VMs to measure points in, and (for ``sched``) the one collection session that watches them."""

    def __init__(self, workloads: Sequence[str], accounting: str = "sched", window_s: float = 1.0,
                 settle_s: float = 0.3, max_packets: int = MAX_PACKETS, cpus: Sequence[int] | None = None) -> None:
        unknown = [w for w in workloads if w not in MODES]
        if unknown:
            raise ValueError(f"unknown workload {unknown[0]!r}; choose from {', '.join(MODES)}")
        self.workloads = list(workloads)
        self.accounting = accounting
        self.window_s = window_s
        self.settle_s = settle_s
        self.max_packets = max_packets
        self.cpus = sorted(cpus) if cpus else None  # every thread of the VM pinned to these: the host it has
        self.session = None

    def __enter__(self) -> Bench:
        if self.accounting == "sched":
            from vmprof_tui.collect.session import CollectionSession  # BPF only when asked for
            self.session = CollectionSession(frequency=19, build_ids=False)
            self.session.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def spec(self, levels: Sequence[float]) -> list[dict]:
        procs = [{"program": "load", "args": [MODES[w], round(x * 1000), 0, self.max_packets]}
                 for w, x in zip(self.workloads, levels, strict=True) if x > 0]
        procs = procs or [{"program": "load", "args": [MODES["cpu"], 0, 0, 0]}]
        return [{"name": "vmprof-model", "nic": True, "vcpus": [{"pin": None, "processes": procs}]}]

    def measure(self, levels: Sequence[float]) -> Point:
        events = []
        with DemoRun(self.spec(levels)) as run:
            ready = run.ready["vmprof-model"]
            pid = ready["pid"]
            vcpus = {v["tid"] for v in ready["vcpus"]}
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            if self.cpus:
                for t in tids:
                    os.sched_setaffinity(t, self.cpus)
            if self.session is not None:
                self.session.poll()  # what came before this VM is of no use
                self.session.collector.add_vcpu_threads({t: pid for t in tids})
            registered = time.monotonic_ns()
            end_settle = time.monotonic() + self.settle_s
            while (now := time.monotonic()) < end_settle:
                time.sleep(min(POLL_S, end_settle - now))
                events += self._drain()
            t0 = time.monotonic_ns()
            before = {t: schedstat(pid, t)[0] for t in tids}
            end = time.monotonic() + self.window_s
            while (now := time.monotonic()) < end:
                time.sleep(min(POLL_S, end - now))
                events += self._drain()
            after = {t: schedstat(pid, t)[0] for t in tids}
            t1 = time.monotonic_ns()
            faults = list(run.faults)
        if faults:
            raise RuntimeError(f"the demo VM faulted while measuring {list(levels)}: {faults[0].get('what')}")
        events += self._drain()
        window = (t1 - t0) / 1e9
        ran = {t: after[t] - before[t] for t in tids}
        point = Point(list(map(float, levels)), window)
        point.cores["schedstat"] = split(ran, vcpus, window)
        if self.session is not None:
            sched = np.concatenate(events) if events else np.empty(0)
            # before registration a thread's switches were recorded only when the other side was
            # registered (a thread of the last VM): its history starts complete only from here
            sched = sched[sched["time_ns"] >= registered] if len(sched) else sched
            on = {t: on_cpu_ns(sched, t, t0, t1, ran[t] > (t1 - t0) / 2) if len(sched) else ran[t] for t in tids}
            point.cores["sched"] = split(on, vcpus, window)
        return point

    def _drain(self) -> list[np.ndarray]:
        return [self.session.poll().sched] if self.session is not None else []


def split(ns_by_tid: dict[int, int], vcpus: set[int], window_s: float) -> dict[str, float]:
    vm = sum(ns for t, ns in ns_by_tid.items() if t in vcpus) / 1e9 / window_s
    vmm = sum(ns for t, ns in ns_by_tid.items() if t not in vcpus) / 1e9 / window_s
    return {"host-cpu": vm + vmm, "vm-cpu": vm, "vmm-cpu": vmm}
