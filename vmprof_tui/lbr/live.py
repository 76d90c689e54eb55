"""The LBR samples of a live session for the block view (`vmprof top --lbr`): the raw records of each drained chunk
(collect/session.py: ``Chunk.lbr``), from a hardware collector or the simulated one alike, turned into samples with
their counter deltas carried from one chunk to the next, and named through the session's process snapshots as a
recording's samples are (lbr/recording.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vmprof_tui.lbr.model import Resolve
from vmprof_tui.lbr.recording import process_resolver
from vmprof_tui.lbr.records import to_samples
from vmprof_tui.lbr.source import LbrSource
from vmprof_tui.resolve.spaces import ObjectCache

KEEP_S = 120.0  # the longest window of the live screen (cli/top.py WINDOW_S): older samples are forgotten


class LiveLbr(LbrSource):
    """An LbrSource that a LiveWindow feeds (its lbr_sink is ``take``)."""

    def __init__(self, label: str, freq_hz: float | None = None, note: Callable[[], str | None] | None = None,
                 keep_s: float = KEEP_S) -> None:
        super().__init__([], lambda _addr: None, label, freq_hz, resolve_pid=self._resolve_pid)
        self.note, self.keep_ns = note, int(keep_s * 1e9)
        self.objects = ObjectCache()
        self.snapshots: dict[int, dict] = {}
        self._resolvers: dict[int, Resolve | None] = {}
        self._tail: np.ndarray | None = None  # the last record of each CPU so far: the next deltas start there

    def _resolve_pid(self, pid: int) -> Resolve | None:
        if self._resolvers.get(pid) is None:
            snap = self.snapshots.get(pid)
            self._resolvers[pid] = process_resolver(snap["maps"], self.objects) if snap else None
        return self._resolvers[pid]

    def take(self, records: np.ndarray, processes: dict[int, dict]) -> None:
        """A chunk's LBR records, and the snapshots of the processes the window holds."""
        for pid, snap in processes.items():
            if self.snapshots.get(pid) is not snap:  # new, or snapshotted again (an exec)
                self.snapshots[pid] = snap
                self._resolvers.pop(pid, None)
        if self.note is not None and (notes := [n for n in [self.note()] if n]) != self.notes:
            with self._lock:
                self.notes, self._cache = notes, None  # the note says how far the simulation got
        if not len(records):
            return
        # the counters are running totals: each CPU's first record of the chunk counts from its last one before
        joined = records if self._tail is None else np.concatenate([self._tail, records])
        comm = {pid: str(snap.get("comm") or "") for pid, snap in self.snapshots.items()}
        samples = to_samples(joined, comm)
        if self._tail is not None:
            carried = {int(c) for c in self._tail["hdr"]["cpu"]}
            fresh = []
            for s in samples:  # time order, stable: a CPU's carried record comes before its new ones
                if s.cpu in carried:
                    carried.discard(s.cpu)
                    continue
                fresh.append(s)
            samples = fresh
        hdr = joined["hdr"]
        order = np.argsort(hdr["time_ns"], kind="stable")
        _cpus, last = np.unique(hdr["cpu"][order][::-1], return_index=True)
        self._tail = joined[order][len(order) - 1 - last]
        self.add(samples, self.keep_ns)
