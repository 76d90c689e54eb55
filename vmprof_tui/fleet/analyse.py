"""`vmprof analyze`: complete windows of one or more spools → Dask tasks (one a window) → the Parquet store.

Dask distributed does the scheduling: an embedded LocalCluster by default, a real cluster with
`--scheduler tcp://HOST:8786`. A worker that dies mid-task has its task re-run by the scheduler;
tasks write their output idempotently (tasks.py), and a window is marked done in the store only
after all its tables are written, so re-running `analyze` skips it and nothing is added twice.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.fleet.tasks import WindowRef, analyse_window
from vmprof_tui.record.spool import WINDOW_RE

DONE = "done"  # store/done/HOST/W<seq>.json: the window is fully in the store
CORRUPT = "corrupt"  # store/corrupt/HOST/W<seq>.json: the window was skipped as corrupt (why, when): history says so


class StoreWriteError(OSError):
    """The store cannot be written (read-only, full, no permission): the whole run stops with one line."""


@dataclass
class WindowResult:
    ref: WindowRef
    t0_s: float  # store time on the agent (from its log)
    t1_s: float  # window length
    t2_s: float  # analysis cost: its task's run time
    t2_cpu_s: float = 0.0  # of it, the worker's CPU time (t2 where nothing else runs on the node)
    vms: list[str] = field(default_factory=list)
    error: str | None = None


def find_windows(spools: Iterable[Path]) -> list[WindowRef]:
    """Complete windows of every host folder in these spools (a spool folder, or one host's folder)."""
    refs = []
    for spool in spools:
        hosts = [spool] if (spool / "windows").is_dir() else [p for p in sorted(spool.iterdir())
                                                               if (p / "windows").is_dir()]
        for host in hosts:
            for p in sorted((host / "windows").iterdir()):
                m = WINDOW_RE.match(p.name)
                if m:
                    refs.append(WindowRef(host.name, int(m.group(1)), int(m.group(2)), str(p)))
    return refs


def done_path(store: Path, ref: WindowRef) -> Path:
    return store / DONE / ref.host / f"W{ref.seq:08d}.json"


def corrupt_path(store: Path, ref: WindowRef) -> Path:
    return store / CORRUPT / ref.host / f"W{ref.seq:08d}.json"


def write_marker(path: Path, content: dict) -> None:
    """A small JSON file written atomically under a name no concurrent `analyze` uses (files.write_file); an
    existing one is replaced whole (two runs that finish the same window write the same facts)."""
    files.make_dirs(path.parent)
    files.write_file(path, json.dumps(content))


def corrupt_windows(store: Path) -> list[dict]:
    """The windows `analyze` skipped as corrupt (host, seq, start, why), oldest first."""
    out = []
    for p in sorted((store / CORRUPT).glob("*/W*.json")):
        try:
            entry = json.loads(p.read_text())
            out.append({"host": p.parent.name, "seq": int(p.stem[1:]), "start_unix_s": int(entry["start_unix_s"]),
                        "why": str(entry["why"])})
        except (OSError, ValueError, KeyError, TypeError):
            out.append({"host": p.parent.name, "seq": int(p.stem[1:]) if p.stem[1:].isdigit() else -1,
                        "start_unix_s": 0, "why": "its corrupt-window note is unreadable"})
    return out


def check_store(store: Path) -> None:
    """StoreWriteError when `analyze` could not write the store: found before any window is analysed."""
    try:
        store.mkdir(parents=True, exist_ok=True)
        probe = store / f".write-test.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise StoreWriteError(e.errno, f"cannot write the store {store}: {e.strerror or e}") from None


def agent_log(window: Path) -> dict[int, dict]:
    try:
        lines = (window.parent.parent / "agent.jsonl").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        try:
            w = json.loads(line)
            out[int(w["seq"])] = w
        except (ValueError, KeyError, TypeError):
            continue
    return out


class Analyser:
    def __init__(self, store: Path, scheduler: str | None = None, workers: int | None = None) -> None:
        self.store = store
        self.scheduler = scheduler
        self.workers = workers or os.cpu_count() or 1
        self._client = None
        self._cluster = None
        self._scratch: str | None = None
        self._config: object = None

    def __enter__(self) -> Analyser:
        import dask
        from distributed import Client, LocalCluster

        if self.scheduler:
            self._client = Client(self.scheduler, timeout=30)
        else:
            # the workers' scratch space in a private new folder: Dask's default, a fixed $TMPDIR/dask-scratch-space,
            # is a path another user can plant a link at
            self._scratch = tempfile.mkdtemp(prefix="vmprof-dask-")
            # the cluster's own lock files go there too; the setting is undone in __exit__.  The workers keep glibc's
            # own malloc thresholds: Dask's MALLOC_TRIM_THRESHOLD_ fixes them, and every large array of the analysis
            # is then mapped and unmapped anew, page by page (docs/fleet.md: t2)
            environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
            environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            # No statistical profiler in the workers: it walks the task's stack every 10 ms, a twentieth of a
            # 64-CPU window's CPU time (docs/fleet.md)
            self._config = dask.config.set({"temporary-directory": self._scratch,
                                            "distributed.nanny.pre-spawn-environ": environ,
                                            "distributed.worker.profile.enabled": False})
            self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                         dashboard_address=None, local_directory=self._scratch)
            self._client = Client(self._cluster)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        if self._scratch is not None:
            self._config.__exit__(None, None, None)
            shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def n_threads(self) -> int:
        return sum(self._client.nthreads().values()) or 1

    def run(self, refs: list[WindowRef], on_window: Callable[[WindowResult], None] | None = None,
            retries: int = 3) -> list[WindowResult]:
        """Analyse the windows not yet in the store; each window is one task."""
        from distributed import as_completed

        check_store(self.store)
        todo = [r for r in refs if not done_path(self.store, r).exists()]
        c = self._client
        results: dict[WindowRef, WindowResult] = {}
        futures = {}
        for ref in todo:  # a window is one task: read once, checked, every VM's tables and the host's (tasks.py)
            log = agent_log(Path(ref.path)).get(ref.seq, {})
            results[ref] = WindowResult(ref, float(log.get("t0_s", 0.0)), float(log.get("t1_s", 0.0)), 0.0)
            f = c.submit(analyse_window, ref, str(self.store), key=f"vmprof-{ref.host}-{ref.seq}", retries=retries,
                         pure=False)
            futures[f] = ref
        finished = []
        for f in as_completed(futures):
            ref = futures[f]
            res = results[ref]
            try:
                out = f.result()
                res.vms, res.t2_s, res.t2_cpu_s = out["vms"], out["seconds"], out["cpu_seconds"]
                res.error = out.get("error")
            except OSError as e:  # the store (read-only, full): every other window would fail the same way
                if e.filename and Path(e.filename).is_relative_to(self.store):
                    for other in futures:
                        other.cancel()
                    raise StoreWriteError(e.errno, f"cannot write the store {self.store}: "
                                                   f"{e.strerror or e}: {e.filename}") from None
                res.error = f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - one window's failure is noted, the others go on
                res.error = f"{type(e).__name__}: {e}"
            finished.append(self._finish(res, on_window))
        return finished

    def _finish(self, res: WindowResult, on_window: Callable[[WindowResult], None] | None) -> WindowResult:
        try:
            if res.error is None:
                write_marker(done_path(self.store, res.ref), {
                    "vms": res.vms, "t0_s": res.t0_s, "t1_s": res.t1_s, "t2_s": res.t2_s,
                    "analysed_unix_s": time.time()})
                corrupt_path(self.store, res.ref).unlink(missing_ok=True)  # it was repaired
            elif res.error.startswith("corrupt"):
                write_marker(corrupt_path(self.store, res.ref), {"why": res.error,
                                                                 "start_unix_s": res.ref.start_unix_s,
                                                                 "checked_unix_s": time.time()})
        except OSError as e:
            raise StoreWriteError(e.errno, f"cannot write the store {self.store}: {e.strerror or e}") from None
        if on_window is not None:
            on_window(res)
        return res


def hosts_per_node(t0: float, t1: float, t2: float, threads: int) -> int:
    """The largest n with t0 + t1 > (t0 + t2 / threads) * n: hosts whose windows this node keeps up with
    (t2 is the window's analysis cost; the node runs `threads` tasks at once)."""
    per_window = t0 + t2 / max(threads, 1)
    if per_window <= 0:
        return 0
    n = int((t0 + t1) / per_window)
    return n - 1 if n > 0 and (t0 + t1) <= per_window * n else n
