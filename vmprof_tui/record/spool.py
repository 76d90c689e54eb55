"""The continuous agent's spool: back-to-back windows of one collection session, one recording each.

Layout (thesis ch. 4: per-window data apart from static data)::

    SPOOL/HOST/windows/W<seq>-<start unix s>.vmprof   complete windows (written as .tmp, then renamed)
    SPOOL/HOST/static/kallsyms-<sha256>.txt.gz         static data (kallsyms, guest bundles as tars),
    SPOOL/HOST/static/bundle-<sha256>.tar.gz           stored once per change, referenced by each window
    SPOOL/HOST/static/elf-<build id>.txt.gz            symbols of a sampled host object, once per build id
    SPOOL/HOST/agent.jsonl                             one line per window: t0, t1, uncovered, lost, ...

Windows are cut by time on the samples' own clock, so consecutive windows touch: the uncovered
time between them is 0 by construction, and what the agent reports is what it measured.  Writing
runs on a thread of its own behind a queue, so storing a window never stops draining (the thesis's
fix of the same kind brought its uncovered rate from 35% to 13% for one VM; docs/papers.md).
Reading host objects' symbol tables also runs there, once per build id per agent (and not at all
when the spool already holds that build's table).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import files
from vmprof_tui.collect.session import Chunk, CollectionSession, read_kallsyms, read_object_table
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SAMPLE_GUEST, SAMPLE_HOST_KERNEL, SCHED_DTYPE
from vmprof_tui.record.recording import OBJECTS_REF_KEY, bundle_tar, object_ref, snapshot
from vmprof_tui.record.writer import WriteFailed, Writer

WINDOW_CODEC = "zstd"  # a window's tables: much faster to store than zlib, as small (docs/fleet.md: t0)

WINDOW_RE = re.compile(r"^W(\d{8})-(\d+)\.vmprof$")
KALLSYMS_CHECK_S = 60.0  # kallsyms is read again (stored only if it changed) at most this often
LATE_NS = 300_000_000  # a window closes this long after its end: records drained late still land in it
MAX_QUEUED = 4  # windows waiting for the writer; more means the disk cannot keep up: the oldest is dropped


@dataclass
class WindowStats:
    """What `vmprof agent --status` and the log show per window."""
    seq: int
    file: str
    start_ns: int  # window bounds on the sampling clock (CLOCK_MONOTONIC)
    end_ns: int
    t1_s: float  # window length
    t0_s: float = 0.0  # store time
    uncovered_s: float = 0.0  # gap between this window's start and the previous window's end (an earlier agent's)
    samples: int = 0
    sched_events: int = 0
    lost_samples: int = 0
    objects_stored: int = 0  # host objects' symbol tables read and stored for this window (new build ids)
    objects_cpu_s: float = 0.0  # the writer thread's CPU time spent on them
    objects_bytes: int = 0  # their size in the spool
    stored: bool = True
    error: str | None = None
    end_unix_s: float = 0.0  # the window's end on the wall clock: where a restarted agent measures its outage from


@dataclass
class SpoolWindow:
    """One of the agent's back-to-back windows while it fills, then stored as one recording in the spool (not the
    live screen's window: analyse/window.py; docs/architecture.md, glossary)."""
    seq: int
    start_ns: int
    end_ns: int
    start_unix_s: float
    samples: np.ndarray = field(default_factory=lambda: np.empty(0, SAMPLE_DTYPE))
    sched: np.ndarray = field(default_factory=lambda: np.empty(0, SCHED_DTYPE))
    processes: dict[int, dict] = field(default_factory=dict)
    bundles: dict[str, bytes] = field(default_factory=dict)  # guest bundle tars of VMs first seen in this window
    lost: dict = field(default_factory=dict)


def parse_size(text: str) -> int:
    """10G, 500M, 64k, or bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 500M, 10G)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def parse_duration(text: str) -> float:
    """60, 60s, 5m, 24h, 7d -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 60s, 5m, 24h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


class Spool:
    """One host's folder in the spool: windows, static data, the log, retention."""

    def __init__(self, root: Path, host: str, keep_s: float | None = None, max_bytes: int | None = None) -> None:
        self.dir = root / host
        self.windows = self.dir / "windows"
        self.static = self.dir / "static"
        self.log_path = self.dir / "agent.jsonl"
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        files.make_dirs(self.windows)  # 0700: windows and static data name guest and host code (files.py)
        files.make_dirs(self.static)

    def remove_unfinished(self) -> None:
        """Delete the windows left in progress by an agent that was killed: for the agent starting on this spool
        only (a reader, such as `vmprof agent --status`, would delete the window a running agent is writing).
        The host's folder is made private too (a spool an older vmprof left readable by all)."""
        with contextlib.suppress(OSError):  # a link to the folder (a setup of the owner's) is left as it is
            files.set_dir_mode(self.dir)
        for tmp in self.windows.glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    def complete_windows(self) -> list[Path]:
        return sorted(p for p in self.windows.iterdir() if WINDOW_RE.match(p.name))

    def next_seq(self) -> int:
        """A restarted agent continues the numbering of the windows already there."""
        done = self.complete_windows()
        return int(WINDOW_RE.match(done[-1].name).group(1)) + 1 if done else 1

    def store_static(self, kind: str, data: bytes, ext: str) -> str:
        """Static data is stored once per content (gzipped); windows reference it by this relative path."""
        return self._store(f"{kind}-{hashlib.sha256(data).hexdigest()[:16]}.{ext}.gz", data)

    def has_object(self, build_id: str) -> bool:
        return (self.windows / object_ref(build_id)).exists()

    def store_object(self, build_id: str, table: bytes) -> str:
        """A host object's symbol table, stored once per build id."""
        return self._store(object_ref(build_id).removeprefix("../static/"), table)

    def _store(self, name: str, data: bytes) -> str:
        path = self.static / name
        if not path.exists():
            files.write_file(path, gzip.compress(data, 6, mtime=0))
        return f"../static/{name}"

    def log(self, stats: WindowStats) -> None:
        with contextlib.suppress(OSError):
            files.append_line(self.log_path, json.dumps(asdict(stats)))

    def last_end_unix_s(self) -> float | None:
        """Where the last window in the log ended on the wall clock (an agent killed before it wrote one: that
        window's start plus its length, from its file name), or None for a new spool."""
        for w in reversed(self.read_log()):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if w.get("end_unix_s"):
                    return float(w["end_unix_s"])
                m = WINDOW_RE.match(str(w["file"]))
                if m:
                    return int(m.group(2)) + float(w["t1_s"])
        return None

    def read_log(self) -> list[dict]:
        try:
            lines = self.log_path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def retain(self) -> list[Path]:
        """Delete the oldest windows past --keep or over --max-size; returns what was deleted."""
        windows = self.complete_windows()
        deleted = []
        if self.keep_s is not None:
            horizon = time.time() - self.keep_s
            for p in windows:
                if int(WINDOW_RE.match(p.name).group(2)) < horizon:
                    deleted.append(p)
        if self.max_bytes is not None:
            kept = [p for p in windows if p not in deleted]
            sizes = [p.stat().st_size for p in kept]
            total = sum(sizes)
            # oldest first; the newest window stays even when it alone is over the limit
            for p, size in zip(kept[:-1], sizes[:-1], strict=True):
                if total <= self.max_bytes:
                    break
                deleted.append(p)
                total -= size
        for p in deleted:
            p.unlink(missing_ok=True)
        return deleted


class Agent:
    """Consumer of a CollectionSession that cuts windows by time and stores them in a Spool."""

    def __init__(self, session: CollectionSession, spool: Spool, window_s: float = 60.0,
                 on_window: Callable[[WindowStats, Path | None], None] | None = None) -> None:
        self.session = session
        self.spool = spool
        self.window_ns = int(window_s * 1e9)
        self.on_window = on_window  # called on the writer thread after each window (stored or not)
        self.processes: dict[int, dict] = {}  # every snapshot still needed by some window
        self.last_sampled: dict[int, int] = {}  # pid -> seq of the last window it was sampled in
        self.stats: list[WindowStats] = []
        self.not_stored = 0
        self._queue: queue.Queue[SpoolWindow | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="vmprof-agent-writer", daemon=True)
        self._lost_before: dict[str, int] = {"samples": 0, "sched": 0}
        self._prev_end_ns: int | None = None
        self._prev_end_unix: float | None = None  # the last window of an earlier agent on this spool
        self.bundle_refs: dict[str, str] = {}  # VM name -> its guest bundle in the spool's static data
        self.kallsyms_ref = ""
        self.object_refs: dict[str, str | None] = {}  # build id -> its table in the spool (None: cannot be read)
        self._kallsyms_read = -KALLSYMS_CHECK_S
        self._pending_samples: list[np.ndarray] = []  # drained, not yet in a closed window
        self._pending_sched: list[np.ndarray] = []

    def run(self, should_stop: Callable[[], bool], drain_s: float = 0.1) -> None:
        s = self.session
        # the monotonic clock of an earlier agent may be another boot's: its outage is measured on the wall clock
        self._prev_end_unix = self.spool.last_end_unix_s()
        s.start()
        self._writer.start()
        start_ns, self._unix_at = time.monotonic_ns(), time.time()
        self._mono_at = start_ns
        self.window = SpoolWindow(self.spool.next_seq(), start_ns, start_ns + self.window_ns, self._unix_at)
        try:
            while not should_stop():
                time.sleep(drain_s)
                self._take(s.poll())
        finally:
            chunk, _lost = s.finish()
            self._take(chunk, final=True)
            self._queue.put(None)
            self._writer.join()

    def _take(self, chunk: Chunk, final: bool = False) -> None:
        """Keep a chunk's records; close the open window once its end has passed by LATE_NS (records of
        its last moments drained after its end still land in it)."""
        for pid, snap in chunk.processes.items():
            self.processes[pid] = snap
        for vm in chunk.new_vms:
            if vm.bundle and Path(vm.bundle, "bundle.json").exists():
                with contextlib.suppress(OSError):  # taken now: a demo VM's folder goes away with it
                    self.window.bundles[vm.name] = bundle_tar(Path(vm.bundle))
        self._pending_samples.append(chunk.samples)
        self._pending_sched.append(chunk.sched)
        while final or time.monotonic_ns() >= self.window.end_ns + LATE_NS:
            win = self.window
            samples, sched = np.concatenate(self._pending_samples), np.concatenate(self._pending_sched)
            if final:  # the last window ends with its last record
                times = [int(a["time_ns"].max()) + 1 for a in (samples, sched) if len(a)]
                win.end_ns = max([win.start_ns, *times])
            s_in, e_in = samples["time_ns"] < win.end_ns, sched["time_ns"] < win.end_ns
            win.samples, win.sched = samples[s_in], sched[e_in]
            self._pending_samples, self._pending_sched = [samples[~s_in]], [sched[~e_in]]
            self._close(win)
            if final:
                return
            self.window = SpoolWindow(win.seq + 1, win.end_ns, win.end_ns + self.window_ns,
                                 self._unix_at + (win.end_ns - self._mono_at) / 1e9)

    def _close(self, win: SpoolWindow) -> None:
        samples = win.samples
        pids = set(np.unique(samples["pid"]).tolist()) - {0}
        for pid in pids:
            self.last_sampled[pid] = win.seq
        win.processes = {pid: self.processes[pid] for pid in pids if pid in self.processes}
        # snapshots not needed by this window or the last one are forgotten; the session re-snapshots a
        # pid sampled again later (it may be another process by then)
        stale = [pid for pid, seq in self.last_sampled.items() if seq < win.seq - 1]
        for pid in stale:
            self.processes.pop(pid, None)
            del self.last_sampled[pid]
        self.session.forget_processes(stale)
        lost = self.session.lost()
        win.lost = {k: sum(v) - self._lost_before.get(k, 0) for k, v in lost.items() if k in ("samples", "sched")}
        self._lost_before = {k: sum(v) for k, v in lost.items() if k in ("samples", "sched")}
        if self._queue.qsize() >= MAX_QUEUED:  # the disk is far behind: drop the oldest waiting window
            with contextlib.suppress(queue.Empty):
                dropped = self._queue.get_nowait()
                if dropped is not None:
                    self._record(WindowStats(dropped.seq, "", dropped.start_ns, dropped.end_ns,
                                             (dropped.end_ns - dropped.start_ns) / 1e9, stored=False,
                                             error="the writer fell behind"), None)
        self._queue.put(win)

    def _write_loop(self) -> None:
        while (win := self._queue.get()) is not None:
            self._store(win)

    def _store(self, win: SpoolWindow) -> None:
        name = f"W{win.seq:08d}-{int(win.start_unix_s)}.vmprof"
        final = self.spool.windows / name
        tmp = final.with_suffix(".tmp")
        samples, sched = win.samples, win.sched
        stats = WindowStats(win.seq, name, win.start_ns, win.end_ns, (win.end_ns - win.start_ns) / 1e9,
                            samples=len(samples), sched_events=len(sched), lost_samples=win.lost.get("samples", 0))
        stats.end_unix_s = win.start_unix_s + stats.t1_s
        if self._prev_end_ns is not None:
            stats.uncovered_s = max(0, win.start_ns - self._prev_end_ns) / 1e9
        elif self._prev_end_unix is not None:  # a restart: the time since the last stored window was not covered
            stats.uncovered_s = max(0.0, win.start_unix_s - self._prev_end_unix)
        self._prev_end_ns = win.end_ns
        t = time.monotonic()
        try:
            if time.monotonic() - self._kallsyms_read >= KALLSYMS_CHECK_S:  # reading it is not free
                self.kallsyms_ref = self.spool.store_static("kallsyms", read_kallsyms().encode(), "txt")
                self._kallsyms_read = time.monotonic()
            for vm_name, tar in win.bundles.items():
                self.bundle_refs[vm_name] = self.spool.store_static("bundle", tar, "tar")
            object_refs = self._store_objects(win, stats)
            meta = self.session.meta()
            meta.update(start_monotonic_ns=win.start_ns, start_unix_s=win.start_unix_s,
                        window={"seq": win.seq, "start_ns": win.start_ns, "end_ns": win.end_ns})
            w = Writer(tmp, meta, codec=WINDOW_CODEC)
            try:
                w.add(samples, sched)
                vms = [vm.to_json() for vm in self.session.vms_seen.values()]
                w.add_snapshot({**snapshot(vms=vms, processes=win.processes), "kallsyms_ref": self.kallsyms_ref,
                                "bundle_refs": dict(self.bundle_refs), OBJECTS_REF_KEY: object_refs})
                w.close({"duration_s": stats.t1_s, "samples": len(samples), "lost": {
                    "samples": [win.lost.get("samples", 0)], "sched": [win.lost.get("sched", 0)]},
                    "end_monotonic_ns": win.end_ns, "vms": vms})
            except BaseException:
                w.abandon(keep=False)
                raise
            os.replace(tmp, final)
            stats.t0_s = time.monotonic() - t
            self.spool.retain()
        except (OSError, WriteFailed) as failed:
            e = failed.error if isinstance(failed, WriteFailed) else failed
            tmp.unlink(missing_ok=True)
            self.not_stored += 1
            stats.stored, stats.file = False, ""
            stats.error = ("the spool is full" if e.errno == errno.ENOSPC else
                           f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
            stats.t0_s = time.monotonic() - t
        self._record(stats, final if stats.stored else None)

    def _store_objects(self, win: SpoolWindow, stats: WindowStats) -> dict[str, str]:
        """The symbol tables of the host objects this window's user samples fell in: stored when their build id
        is new to the spool (read from the host's file on this thread), referenced in any case."""
        refs = {}
        cpu = time.thread_time()
        for path, build_id in sampled_objects(win.samples, win.processes):
            if build_id not in self.object_refs:
                if self.spool.has_object(build_id):  # stored by an earlier run of the agent
                    self.object_refs[build_id] = object_ref(build_id)
                elif (table := read_object_table(path, build_id)) is None:
                    self.object_refs[build_id] = None  # its samples are named from the analysis node's files
                else:
                    self.object_refs[build_id] = ref = self.spool.store_object(build_id, table)
                    stats.objects_stored += 1
                    stats.objects_bytes += (self.spool.windows / ref).stat().st_size
            if (ref := self.object_refs[build_id]) is not None:
                refs[build_id] = ref
        stats.objects_cpu_s = time.thread_time() - cpu
        return refs

    def _record(self, stats: WindowStats, path: Path | None) -> None:
        if not stats.stored and stats.error == "the writer fell behind":
            self.not_stored += 1
        self.stats.append(stats)
        self.spool.log(stats)
        if self.on_window is not None:
            self.on_window(stats, path)


def sampled_objects(samples: np.ndarray, processes: dict[int, dict]) -> set[tuple[str, str]]:
    """(path, build id) of the host objects with a build id that host user samples fell in (objects without
    a build id are not stored: they are named from the analysis node's own files)."""
    user = (samples["flags"] & (SAMPLE_GUEST | SAMPLE_HOST_KERNEL)) == 0
    pids, ips = samples["pid"][user], samples["host_ip"][user]
    out = set()
    for pid in np.unique(pids).tolist():
        snap = processes.get(pid)
        build_ids = (snap or {}).get("build_ids") or {}
        if not build_ids:
            continue
        maps = []
        for line in snap["maps"].splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and "x" in parts[1] and parts[5] in build_ids:
                lo, hi = parts[0].split("-")
                maps.append((int(lo, 16), int(hi, 16), parts[5]))
        if not maps:
            continue
        maps.sort()
        starts, ends = np.array([m[0] for m in maps], np.uint64), np.array([m[1] for m in maps], np.uint64)
        a = ips[pids == pid]
        which = np.searchsorted(starts, a, side="right").astype(np.int64) - 1
        hit = which[(which >= 0) & (a < ends[np.maximum(which, 0)])]
        out |= {(maps[i][2], build_ids[maps[i][2]]) for i in np.unique(hit).tolist()}
    return out
