"""Sessions that feed the live screen: the last N seconds as an Analysis.

``LiveSession`` collects on this host (the same Collector as `vmprof record`);
``ReplaySession`` plays a recording at its own pace.  Both hand out the same
thing, an ``Analysis`` of a sliding window, so `vmprof top` has no analysis
code of its own.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import numpy as np

from vmprof_tui import discover, recording
from vmprof_tui.analysis import Analysis, Resolved, SymbolCache
from vmprof_tui.backends import load_backend
from vmprof_tui.collect import Collector, check_privileges
from vmprof_tui.recorder import snapshot_processes
from vmprof_tui.records import SAMPLE_DTYPE, SCHED_DTYPE
from vmprof_tui.symbols import kallsyms_table


def _window_recording(path: Path, meta: dict, samples: np.ndarray, sched: np.ndarray, snapshot: dict,
                      bundles: dict[str, bytes], seconds: float, lost: dict | None = None) -> recording.Recording:
    rec = recording.Recording(path, meta, samples, sched, snapshot, bundles)
    rec.end = {"duration_s": seconds, "lost": lost or {"samples": [], "sched": []}, "vms": snapshot.get("vms", [])}
    return rec


class LiveSession:
    """Collect on this host and keep the last `window_s` seconds."""

    live = True

    def __init__(self, frequency: int = 1000, window_s: float = 10.0) -> None:
        check_privileges()
        self.backend = load_backend()
        self.frequency = frequency
        self.window_s = window_s
        self.collector = Collector(self.backend, frequency=frequency)
        self.cache = SymbolCache()
        self.vms: dict[int, discover.VmInfo] = {}
        self.snapshot: dict = {}
        self.pids_seen: set[int] = set()
        self._samples: deque[tuple[np.ndarray, Resolved]] = deque()  # drained chunks and their names
        self._sched: deque[np.ndarray] = deque()
        self.started_at = 0.0
        self.last_discover = 0.0
        self.messages: list[str] = []  # for the screen: VMs that started or stopped

    @property
    def meta(self) -> dict:
        return {"backend": self.backend.name, "frequency": self.frequency, "event": self.collector.event}

    @property
    def started(self) -> bool:
        return self.collector.started

    def start(self) -> None:
        if self.started:
            return
        self.collector.start()
        self.cache.kallsyms = kallsyms_table(Path("/proc/kallsyms").read_text())
        self.started_at = time.monotonic()
        self._discover()

    def _discover(self) -> None:
        self.last_discover = time.monotonic()
        current = {vm.pid: vm for vm in discover.discover_vms()}
        for pid, vm in current.items():
            known = self.vms.get(pid)
            new = vm.vcpu_threads if known is None else {t: v for t, v in vm.vcpu_threads.items()
                                                          if t not in known.vcpu_threads}
            if new:
                self.collector.add_vcpu_threads({t: pid for t in new})
        for pid, vm in self.vms.items():
            if pid not in current:
                self.messages.append(f"VM {vm.name} (pid {pid}) stopped")
        for pid, vm in current.items():
            if self.vms and pid not in self.vms:
                self.messages.append(f"VM {vm.name} (pid {pid}) started")
        self.vms = current  # VMs that went away drop out of the live view as the window moves on
        self.snapshot["vms"] = [vm.to_json() for vm in self.vms.values()]

    def _forget_processes(self) -> None:
        """Drop the snapshots of processes with no sample left in the window: a host that starts many short
        processes would otherwise fill memory, and a reused pid gets a fresh snapshot."""
        in_window = {int(pid) for chunk, _names in self._samples for pid in np.unique(chunk["pid"]).tolist()}
        for pid in self.pids_seen - in_window:
            self.snapshot.pop(f"process:{pid}", None)
        self.pids_seen &= in_window

    def bundles(self) -> dict[str, Path]:
        return {vm.name: Path(vm.bundle) for vm in self.vms.values() if vm.bundle}

    def poll(self) -> Analysis:
        now_ns = time.monotonic_ns()
        drained = self.collector.drain()
        if time.monotonic() - self.last_discover >= 2.0:  # new VMs are rare; /proc scans are not free
            self._discover()
            self._forget_processes()
        if len(drained.samples):
            new_pids = set(np.unique(drained.samples["pid"]).tolist()) - self.pids_seen - {0}
            for pid, snap in snapshot_processes(self.collector, new_pids, build_ids=False).items():
                self.snapshot[f"process:{pid}"] = snap
            self.pids_seen |= new_pids
            # each chunk is resolved once; every refresh then only groups the window's names
            chunk = Analysis(_window_recording(Path("(live)"), self.meta, drained.samples, drained.sched[:0],
                                               self.snapshot, {}, 0.0), self.bundles(), cache=self.cache,
                             timelines=False)
            self._samples.append((chunk.samples, chunk.resolved()))
        if len(drained.sched):
            self._sched.append(drained.sched)
        horizon = now_ns - int(self.window_s * 1e9)
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
        seconds = min(self.window_s, time.monotonic() - self.started_at)
        rec = _window_recording(Path("(live)"), self.meta, samples, sched, self.snapshot, {}, seconds,
                                self.collector.lost())
        return Analysis(rec, self.bundles(), cache=self.cache, resolved=resolved)

    def close(self) -> None:
        self.collector.close()


class ReplaySession:
    """Play a recording through the same screens, one refresh interval of recorded time per poll."""

    live = False

    def __init__(self, path: Path, window_s: float = 10.0) -> None:
        self.rec = recording.load(path)
        self.window_s = window_s
        self.cache = SymbolCache()
        times = [a["time_ns"] for a in (self.rec.samples, self.rec.sched) if len(a)]
        self.t0 = int(min(t.min() for t in times)) if times else 0
        self.t_end = int(max(t.max() for t in times)) if times else 0
        self.now = self.t0
        self.samples = np.sort(self.rec.samples, order="time_ns")
        self.sched = np.sort(self.rec.sched, order="time_ns")
        self.meta = self.rec.meta
        # kallsyms is parsed once into the cache (start); without it in the snapshot no window re-parses it
        self.snapshot = {k: v for k, v in self.rec.snapshot.items() if k != "kallsyms"}

    started = True

    def start(self) -> None:
        self.cache.kallsyms = kallsyms_table(self.rec.snapshot.get("kallsyms", ""))

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
        rec = _window_recording(self.rec.path, self.meta, s, e, self.snapshot, self.rec.bundles, (self.now - lo) / 1e9)
        rec.problems = list(self.rec.problems)
        return Analysis(rec, cache=self.cache)

    def close(self) -> None:
        pass
