"""Sliding windows that feed the live screen: the last N seconds as an Analysis.

``LiveWindow`` keeps the chunks of a collection session on this host (the same session as
`vmprof record`); ``ReplayWindow`` plays a recording at its own pace.  Both hand out the
same thing, an ``Analysis`` of a sliding window, so `vmprof top` has no analysis code of its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.collect.session import CollectionSession, read_kallsyms
from vmprof_tui.record import recording
from vmprof_tui.record.records import SAMPLE_DTYPE, SCHED_DTYPE, STACK_DTYPE
from vmprof_tui.resolve.resolver import Resolved, Resolver
from vmprof_tui.resolve.symtab import kallsyms_table


def _window_recording(path: Path, meta: dict, samples: np.ndarray, sched: np.ndarray, snapshot: dict,
                      bundles: dict[str, bytes], seconds: float, lost: dict | None = None,
                      stacks: np.ndarray | None = None, host_stacks: dict | None = None) -> recording.Recording:
    rec = recording.Recording(path, meta, samples, sched, snapshot, bundles, stacks=stacks,
                              host_stacks=host_stacks or {})
    # rec.end is still None here, so vms() reads the window's snapshot
    rec.end = {"duration_s": seconds, "lost": lost or {"samples": [], "sched": []}, recording.VMS_KEY: rec.vms()}
    return rec


def _time_ordered(samples: np.ndarray) -> np.ndarray:
    """Samples in time order (a stable sort, as Analysis does; drained chunks usually are already)."""
    t = samples["time_ns"]
    return samples if np.all(t[1:] >= t[:-1]) else samples[np.argsort(t, kind="stable")]


class ResolvedChunks:
    """The chunks of a sliding window, each resolved once when it arrives: a refresh then only joins the
    window's chunks and groups their name codes (the cost of a refresh does not grow with the resolving
    of what earlier refreshes saw)."""

    def __init__(self) -> None:
        self.samples: deque[tuple[np.ndarray, Resolved]] = deque()
        self.sched: deque[np.ndarray] = deque()
        self.stacks: deque[np.ndarray] = deque()  # stack records of the samples (-g)

    def add(self, samples: np.ndarray, sched: np.ndarray, resolve: Callable[[np.ndarray], Resolved],
            stacks: np.ndarray | None = None) -> None:
        if len(samples):
            samples = _time_ordered(samples)
            self.samples.append((samples, resolve(samples)))
        if len(sched):
            self.sched.append(sched)
        if stacks is not None and len(stacks):
            self.stacks.append(stacks)

    def pids(self) -> set[int]:
        return {int(pid) for chunk, _names in self.samples for pid in np.unique(chunk["pid"]).tolist()}

    def window(self, horizon: int) -> tuple[np.ndarray, Resolved | None, np.ndarray, np.ndarray]:
        """(samples, their names, sched events, stack records) from `horizon` (ns) on; older chunks are forgotten."""
        while self.stacks and self.stacks[0]["time_ns"].max() < horizon:
            self.stacks.popleft()
        while self.samples and self.samples[0][0]["time_ns"][-1] < horizon:
            self.samples.popleft()
        while self.sched and self.sched[0]["time_ns"][-1] < horizon:
            self.sched.popleft()
        if self.samples:
            samples = np.concatenate([c[0] for c in self.samples])
            resolved = Resolved.concatenate([c[1] for c in self.samples])
            keep = samples["time_ns"] >= horizon
            samples, resolved = samples[keep], resolved.take(keep)
        else:
            samples, resolved = np.empty(0, SAMPLE_DTYPE), None
        sched = np.concatenate(self.sched) if self.sched else np.empty(0, SCHED_DTYPE)
        stacks = np.concatenate(self.stacks) if self.stacks else np.empty(0, STACK_DTYPE)
        return samples, resolved, sched[sched["time_ns"] >= horizon], stacks[stacks["time_ns"] >= horizon]


class LiveWindow:
    """The last `window_s` seconds of a collection session on this host."""

    live = True

    def __init__(self, session: CollectionSession, window_s: float = 10.0) -> None:
        self.session = session
        self.window_s = window_s
        self.resolver = Resolver()
        self.processes: dict[int, dict] = {}  # host pid -> its snapshot, while it has samples in the window
        self.vms: list[dict] | None = None  # the running VMs (None until the first discovery)
        self.chunks = ResolvedChunks()
        self.host_stacks: dict[int, np.ndarray] = {}  # host stack-map id -> addresses, for the session's life
        self.messages: list[str] = []  # for the screen: VMs that started or stopped
        self._last_forget = time.monotonic()

    @property
    def meta(self) -> dict:
        return {"backend": self.session.backend.name, "frequency": self.session.frequency,
                "event": self.session.collector.event}

    @property
    def started(self) -> bool:
        return self.session.started

    def start(self) -> None:
        if self.started:
            return
        self.session.start()
        self.resolver.kallsyms = kallsyms_table(read_kallsyms())

    def _forget_processes(self) -> None:
        """Drop the snapshots of processes with no sample left in the window: a host that starts many short
        processes would otherwise fill memory, and a reused pid gets a fresh snapshot."""
        self._last_forget = time.monotonic()
        gone = self.session.pids_seen - self.chunks.pids()
        for pid in gone:
            self.processes.pop(pid, None)
        self.session.forget_processes(gone)

    def bundles(self) -> dict[str, Path]:
        return {vm.name: Path(vm.bundle) for vm in self.session.vms.values() if vm.bundle}

    def poll(self) -> Analysis:
        now_ns = time.monotonic_ns()
        chunk = self.session.poll(discover_every_s=2.0)
        if chunk.new_vms or chunk.gone_vms:
            if self.vms is not None:  # the first discovery is no news
                self.messages += [f"VM {vm.name} (pid {vm.pid}) started" for vm in chunk.new_vms]
            self.messages += [f"VM {vm.name} (pid {vm.pid}) stopped" for vm in chunk.gone_vms]
        if time.monotonic() - self._last_forget >= 2.0:
            self._forget_processes()
        # VMs that went away drop out of the live view as the window moves on
        self.vms = [vm.to_json() for vm in self.session.vms.values()]
        self.processes.update(chunk.processes)
        vm_of_pid = {int(vm["pid"]): vm["name"] for vm in self.vms}
        if len(chunk.samples):
            self.resolver.load_guests(vm_of_pid.values(), self.bundles(), {})
        self.chunks.add(chunk.samples, chunk.sched, lambda s: self.resolver.resolve(s, self.processes, vm_of_pid),
                        chunk.stacks)
        self.host_stacks.update(chunk.host_stacks)
        samples, resolved, sched, stacks = self.chunks.window(now_ns - int(self.window_s * 1e9))
        seconds = min(self.window_s, chunk.elapsed_s)
        if not self.session.collector.stacks:
            stacks = None
        rec = _window_recording(Path("(live)"), self.meta, samples, sched,
                                recording.snapshot(vms=self.vms, processes=self.processes), {}, seconds,
                                self.session.lost(), stacks, self.host_stacks)
        return Analysis(rec, self.bundles(), resolver=self.resolver, resolved=resolved)

    def close(self) -> None:
        self.session.close()


class ReplayWindow:
    """Play a recording through the same screens, one refresh interval of recorded time per poll."""

    live = False

    def __init__(self, path: Path, window_s: float = 10.0) -> None:
        self.rec = recording.load(path)
        self.window_s = window_s
        self.resolver = Resolver()
        times = [a["time_ns"] for a in (self.rec.samples, self.rec.sched) if len(a)]
        self.t0 = int(min(t.min() for t in times)) if times else 0
        self.t_end = int(max(t.max() for t in times)) if times else 0
        self.now = self.t0
        self.samples = _time_ordered(self.rec.samples)  # load gives them in time order already
        self.sched = np.sort(self.rec.sched, order="time_ns")
        self.stacks = None if self.rec.stacks is None else np.sort(self.rec.stacks, order="time_ns")
        self.meta = self.rec.meta
        # kallsyms is parsed once into the resolver (start); without it in the snapshot no window re-parses it
        self.snapshot = {k: v for k, v in self.rec.snapshot.items() if k != recording.KALLSYMS_KEY}
        self.chunks = ResolvedChunks()
        self._loaded_ns = self.t0  # the records up to this time are in self.chunks (or were)
        self._fresh = True
        self._processes = self.rec.processes()
        self._vm_of_pid = {int(vm["pid"]): vm["name"] for vm in self.rec.vms()}

    started = True

    def start(self) -> None:
        self.resolver.kallsyms = kallsyms_table(self.rec.kallsyms() or "")
        self.resolver.objects.add_tables(self.rec.object_tables)  # a window of `vmprof agent` replayed

    @property
    def at_end(self) -> bool:
        return self.now >= self.t_end

    def _between(self, table: np.ndarray, lo: int, hi: int, fresh: bool) -> np.ndarray:
        """The records of a time-sorted table in (lo, hi], or [lo, hi] for a fresh window."""
        t = table["time_ns"]
        return table[np.searchsorted(t, lo, "left" if fresh else "right"):np.searchsorted(t, hi, "right")]

    def poll(self, step_s: float = 1.0) -> Analysis:
        self.now = min(self.now + int(step_s * 1e9), self.t_end)
        lo = max(self.t0, self.now - int(self.window_s * 1e9))
        fresh = self._fresh or self.now < self._loaded_ns or lo > self._loaded_ns
        if fresh:  # the first poll, or a jump back or past a whole window: start over
            self.chunks = ResolvedChunks()
            self._loaded_ns, self._fresh = lo, False
            self.resolver.load_guests(self._vm_of_pid.values(), {}, self.rec.bundles)
        # as on a live host, each new stretch of records is resolved once, when it arrives
        self.chunks.add(self._between(self.samples, self._loaded_ns, self.now, fresh),
                        self._between(self.sched, self._loaded_ns, self.now, fresh),
                        lambda s: self.resolver.resolve(s, self._processes, self._vm_of_pid),
                        None if self.stacks is None else self._between(self.stacks, self._loaded_ns, self.now, fresh))
        self._loaded_ns = self.now
        s, resolved, e, st = self.chunks.window(lo)
        rec = _window_recording(self.rec.path, self.meta, s, e, self.snapshot, self.rec.bundles, (self.now - lo) / 1e9,
                                stacks=None if self.stacks is None else st, host_stacks=self.rec.host_stacks)
        rec.problems = list(self.rec.problems)
        return Analysis(rec, resolver=self.resolver, resolved=resolved)

    def close(self) -> None:
        pass
