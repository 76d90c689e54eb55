"""Sliding windows that feed the live screen: the last N seconds as an Analysis.

``LiveWindow`` keeps the chunks of a collection session on this host (the same session as
`vmprof record`); ``ReplayWindow`` plays a recording at its own pace.  Both hand out the
same thing, an ``Analysis`` of a sliding window, so `vmprof top` has no analysis code of its own.
"""

from __future__ import annotations

import time
from collections import deque
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


class LiveWindow:
    """The last `window_s` seconds of a collection session on this host."""

    live = True

    def __init__(self, session: CollectionSession, window_s: float = 10.0) -> None:
        self.session = session
        self.window_s = window_s
        self.resolver = Resolver()
        self.processes: dict[int, dict] = {}  # host pid -> its snapshot, while it has samples in the window
        self.vms: list[dict] | None = None  # the running VMs (None until the first discovery)
        self._samples: deque[tuple[np.ndarray, Resolved]] = deque()  # drained chunks and their names
        self._sched: deque[np.ndarray] = deque()
        self._stacks: deque[np.ndarray] = deque()  # stack records of the window's samples (top -g)
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
        in_window = {int(pid) for chunk, _names in self._samples for pid in np.unique(chunk["pid"]).tolist()}
        gone = self.session.pids_seen - in_window
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
        if len(chunk.samples):
            # each chunk is resolved once; every refresh then only groups the window's names
            samples = _time_ordered(chunk.samples)
            vm_of_pid = {int(vm["pid"]): vm["name"] for vm in self.vms}
            self.resolver.load_guests(vm_of_pid.values(), self.bundles(), {})
            self._samples.append((samples, self.resolver.resolve(samples, self.processes, vm_of_pid)))
        if len(chunk.sched):
            self._sched.append(chunk.sched)
        if chunk.stacks is not None and len(chunk.stacks):
            self._stacks.append(chunk.stacks)
        self.host_stacks.update(chunk.host_stacks)
        horizon = now_ns - int(self.window_s * 1e9)
        while self._stacks and self._stacks[0]["time_ns"].max() < horizon:
            self._stacks.popleft()
        while self._samples and self._samples[0][0]["time_ns"][-1] < horizon:
            self._samples.popleft()
        while self._sched and self._sched[0]["time_ns"][-1] < horizon:
            self._sched.popleft()
        if self._samples:
            samples = np.concatenate([c[0] for c in self._samples])
            resolved = Resolved.concatenate([c[1] for c in self._samples])
        else:
            samples, resolved = np.empty(0, SAMPLE_DTYPE), None
        sched = np.concatenate(self._sched) if self._sched else np.empty(0, SCHED_DTYPE)
        keep = samples["time_ns"] >= horizon
        samples = samples[keep]
        resolved = resolved.take(keep) if resolved is not None else None
        sched = sched[sched["time_ns"] >= horizon]
        seconds = min(self.window_s, chunk.elapsed_s)
        stacks = None
        if self.session.collector.stacks:
            stacks = np.concatenate(self._stacks) if self._stacks else np.empty(0, STACK_DTYPE)
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
        self.samples = np.sort(self.rec.samples, order="time_ns")
        self.sched = np.sort(self.rec.sched, order="time_ns")
        self.meta = self.rec.meta
        # kallsyms is parsed once into the resolver (start); without it in the snapshot no window re-parses it
        self.snapshot = {k: v for k, v in self.rec.snapshot.items() if k != recording.KALLSYMS_KEY}

    started = True

    def start(self) -> None:
        self.resolver.kallsyms = kallsyms_table(self.rec.kallsyms() or "")

    @property
    def at_end(self) -> bool:
        return self.now >= self.t_end

    def poll(self, step_s: float = 1.0) -> Analysis:
        self.now = min(self.now + int(step_s * 1e9), self.t_end)
        lo = max(self.t0, self.now - int(self.window_s * 1e9))
        s = self.samples[np.searchsorted(self.samples["time_ns"], lo):np.searchsorted(self.samples["time_ns"],
                                                                                      self.now, "right")]
        e = self.sched[np.searchsorted(self.sched["time_ns"], lo):np.searchsorted(self.sched["time_ns"],
                                                                                  self.now, "right")]
        st = self.rec.stacks
        if st is not None:
            st = st[(st["time_ns"] >= lo) & (st["time_ns"] <= self.now)]
        rec = _window_recording(self.rec.path, self.meta, s, e, self.snapshot, self.rec.bundles, (self.now - lo) / 1e9,
                                stacks=st, host_stacks=self.rec.host_stacks)
        rec.problems = list(self.rec.problems)
        return Analysis(rec, resolver=self.resolver)

    def close(self) -> None:
        pass
