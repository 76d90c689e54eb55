"""`vmprof analyze`: complete windows of one or more spools → Dask tasks (window × VM) → the Parquet store.

Dask distributed does the scheduling: an embedded LocalCluster by default, a real cluster with
`--scheduler tcp://HOST:8786`. A worker that dies mid-task has its task re-run by the scheduler;
tasks write their output idempotently (tasks.py), and a window is marked done in the store only
after all its VMs are written, so re-running `analyze` skips it and nothing is added twice.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.fleet.tasks import WindowRef, analyse_window_vm, window_vms
from vmprof_tui.record.recording import RecordingError, load
from vmprof_tui.record.spool import WINDOW_RE

DONE = "done"  # store/done/HOST/W<seq>.json: the window is fully in the store


@dataclass
class WindowResult:
    ref: WindowRef
    t0_s: float  # store time on the agent (from its log)
    t1_s: float  # window length
    t2_s: float  # analysis cost: the sum of its tasks' run times
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


def check_window(path: str) -> str | None:
    """None when the window is usable, else why not: a corrupt or cut window (the agent renames only complete
    ones) is skipped with this note; lesser problems (static data missing) only leave notes in the analysis."""
    try:
        rec = load(Path(path))
    except RecordingError as e:
        return str(e)
    return None if rec.end is not None else "; ".join(rec.problems)


class Analyzer:
    def __init__(self, store: Path, scheduler: str | None = None, workers: int | None = None) -> None:
        self.store = store
        self.scheduler = scheduler
        self.workers = workers or os.cpu_count() or 1
        self._client = None
        self._cluster = None
        self._scratch: str | None = None
        self._config: object = None

    def __enter__(self) -> Analyzer:
        import dask
        from distributed import Client, LocalCluster

        if self.scheduler:
            self._client = Client(self.scheduler, timeout=30)
        else:
            # the workers' scratch space in a private new folder: Dask's default, a fixed $TMPDIR/dask-scratch-space,
            # is a path another user can plant a link at
            self._scratch = tempfile.mkdtemp(prefix="vmprof-dask-")
            # the cluster's own lock files go there too; the setting is undone in __exit__
            self._config = dask.config.set({"temporary-directory": self._scratch})
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
        """Analyse the windows not yet in the store; each (window, VM) is one task."""
        from distributed import as_completed

        todo = [r for r in refs if not done_path(self.store, r).exists()]
        c = self._client
        checks = dict(zip(todo, c.gather(c.map(check_window, [r.path for r in todo], pure=False)), strict=True))
        results: dict[WindowRef, WindowResult] = {}
        futures = {}
        for ref in todo:
            log = agent_log(Path(ref.path)).get(ref.seq, {})
            res = results[ref] = WindowResult(ref, float(log.get("t0_s", 0.0)), float(log.get("t1_s", 0.0)), 0.0)
            if checks[ref] is not None:
                res.error = checks[ref]
        good = [r for r in todo if results[r].error is None]
        vms_of = dict(zip(good, c.gather(c.map(window_vms, [r.path for r in good], pure=False)), strict=True))
        for ref in good:
            results[ref].vms, results[ref].t2_s = vms_of[ref]
            for vm in results[ref].vms:
                f = c.submit(analyse_window_vm, ref, vm, str(self.store), key=f"vmprof-{ref.host}-{ref.seq}-{vm}",
                             retries=retries, pure=False)
                futures[f] = ref
        pending = {ref: len(results[ref].vms) for ref in good}
        finished = []
        for ref in good:
            if not pending[ref]:  # a window with no VM: done at once
                finished.append(self._finish(results[ref], on_window))
        for f in as_completed(futures):
            ref = futures[f]
            res = results[ref]
            try:
                out = f.result()
                res.t2_s += out["seconds"]
            except Exception as e:  # noqa: BLE001 - one window's failure is noted, the others go on
                res.error = f"{type(e).__name__}: {e}"
            pending[ref] -= 1
            if pending[ref] == 0:
                finished.append(self._finish(res, on_window))
        for ref in todo:
            if results[ref].error is not None and ref not in good:
                finished.append(self._finish(results[ref], on_window))
        return finished

    def _finish(self, res: WindowResult, on_window: Callable[[WindowResult], None] | None) -> WindowResult:
        if res.error is None:
            path = done_path(self.store, res.ref)
            files.make_dirs(path.parent)
            files.write_file(path, json.dumps({"vms": res.vms, "t0_s": res.t0_s, "t1_s": res.t1_s, "t2_s": res.t2_s,
                                               "analysed_unix_s": time.time()}))
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
