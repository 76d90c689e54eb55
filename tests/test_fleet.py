"""The analysis node and the history (issue 12): agent windows of real demo VMs, analysed on a real Dask
scheduler with two worker processes, stored in Parquet, asked with DuckDB."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, cpu_busy_ns, require_quiet_pcpu, require_root, thread_cpu_ns, vmprof
from textual.widgets import DataTable, Static

from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.demo import runner
from vmprof_tui.demo.scenarios import SHARED_CPU
from vmprof_tui.fleet.analyze import done_path, find_windows
from vmprof_tui.fleet.history import Store
from vmprof_tui.fleet.tasks import analyse_window_vm, window_vms
from vmprof_tui.record.spool import Agent, Spool
from vmprof_tui.show.store_app import StoreApp

HOSTS = ("h1", "h2", "h3")


def run_agent(spool_root: Path, window_s: float, scenario: list[tuple[float, list[dict]]],
              tail_s: float = 1.0) -> list[tuple[int, int]]:
    """The agent on host h1 while demo VMs run: (delay from the previous start, specs) per group of VMs.
    Returns, per group, the other work on the VMs' pCPU while it was the last group started (ns, wall ns)."""
    os.sched_setaffinity(0, {0})  # the profiler stays off the VMs' pCPU
    session = CollectionSession(1000)
    agent = Agent(session, Spool(spool_root, "h1"), window_s)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop.is_set,))
    thread.start()
    runs: list[runner.DemoRun] = []
    load: list[tuple[int, int]] = []
    mark = (0, 0, 0)

    def demo_cpu_ns() -> int:
        return sum(thread_cpu_ns(proc.pid, v["tid"]) for r in runs for proc, spec in zip(r.procs, r.specs, strict=True)
                   for v in r.ready[spec["name"]]["vcpus"] if v["pin"] in (None, SHARED_CPU))

    def measure() -> tuple[int, int, int]:
        return cpu_busy_ns(SHARED_CPU), demo_cpu_ns(), time.monotonic_ns()

    try:
        assert session.attached.wait(120)
        for delay, specs in scenario:
            stop.wait(delay)
            if runs:
                now = measure()
                load.append((max(now[0] - mark[0] - (now[1] - mark[1]), 0), now[2] - mark[2]))
            runs.append(runner.DemoRun(specs, duration_s=None))
            runs[-1].start()
            mark = measure()
        stop.wait(tail_s)
        now = measure()
        load.append((max(now[0] - mark[0] - (now[1] - mark[1]), 0), now[2] - mark[2]))
        return load
    finally:
        for r in runs:
            r.stop()
        stop.set()
        thread.join(60)


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three hosts' spools: one agent run over the steal3 demo, copied as the thesis copied one host's data."""
    require_root()
    root = tmp_path_factory.mktemp("spool")
    run_agent(root, 1.5, [(0.0, runner.scenario_specs("steal3"))], tail_s=5.0)
    for host in HOSTS[1:]:
        shutil.copytree(root / "h1", root / host)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, f"nothing answers on port {port}"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)


class Cluster:
    """`dask scheduler` and `dask worker`s as separate processes on localhost."""

    def __init__(self, tmp: Path, workers: int = 2) -> None:
        dask = str(Path(sys.executable).parent / "dask")
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.scheduler = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                           "--dashboard-address", ":0", "--no-show"], cwd=tmp, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.scheduler)
        self.workers = [subprocess.Popen([dask, "worker", self.address, "--nworkers", "1", "--nthreads", "1",
                                          "--no-dashboard", "--name", f"w{i}"], cwd=tmp, env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for i in range(workers)]
        from distributed import Client

        with Client(self.address, timeout=60) as c:
            c.wait_for_workers(workers, timeout=120)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture()
def cluster(tmp_path: Path) -> Cluster:
    c = Cluster(tmp_path)
    yield c
    c.close()


def table(store: Path, name: str) -> list[dict]:
    rows = []
    for f in sorted((store / name).rglob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


def single_process(spool: Path, store: Path) -> None:
    for ref in find_windows([spool]):
        for vm in window_vms(ref.path)[0]:
            analyse_window_vm(ref, vm, str(store))


def test_dask_cluster_equals_single_process_and_runs_once(spool: Path, cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = vmprof("analyze", str(spool), "--store", str(store), "--scheduler", cluster.address, timeout=600)
    assert out.returncode == 0, out.stderr
    refs = find_windows([spool])
    assert {r.host for r in refs} == set(HOSTS) and len(refs) >= 3 * 4
    assert all(done_path(store, r).exists() for r in refs)
    lines = [line for line in out.stdout.splitlines() if " window " in line]
    assert len(lines) == len(refs) and all("t0" in line and "t2" in line for line in lines)
    assert "continuity t0 + t1 > (t0 + t2/2) x n holds here for n <=" in out.stdout
    reference = tmp_path / "single"
    single_process(spool, reference)
    for name in ("profile", "vcpu"):
        assert table(store, name) == table(reference, name), f"the {name} table differs from single-process analysis"
    again = vmprof("analyze", str(spool), "--store", str(store), "--scheduler", cluster.address, timeout=600)
    assert again.returncode == 0 and " window " not in again.stdout, "a second run adds nothing"
    for name in ("profile", "vcpu"):
        assert table(store, name) == table(reference, name)


def test_a_worker_killed_mid_run_still_every_window_once(spool: Path, cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "analyze", str(spool), "--store", str(store),
                             "--scheduler", cluster.address], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the first window is done: tasks are running on both workers
    assert " window " in first, first
    cluster.workers[0].send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0
    refs = find_windows([spool])
    assert all(done_path(store, r).exists() for r in refs)
    reference = tmp_path / "single"
    single_process(spool, reference)
    for name in ("profile", "vcpu"):
        assert table(store, name) == table(reference, name), "every window once, as single-process analysis"


def test_corrupt_window_is_skipped_with_a_note(spool: Path, tmp_path: Path) -> None:
    copy = tmp_path / "spool"
    shutil.copytree(spool / "h1", copy / "h1")
    victim = sorted((copy / "h1" / "windows").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:100])
    out = vmprof("analyze", str(copy), "--store", str(tmp_path / "store"), "--workers", "1", timeout=600)
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if "skipped" in line]
    assert len(notes) == 1 and "window 2 skipped" in notes[0], out.stderr
    assert len([line for line in out.stdout.splitlines() if " window " in line]) == len(find_windows([copy])) - 1


def test_history_and_diff(spool: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    single_process(spool / "h1", store)
    out = vmprof("history", "--store", str(store), "--vm", "steal1", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    full = [r for r in rows if r["window_s"] >= 1.4 and r["steal_pct"] > 50]  # three VMs on one pCPU
    assert len(full) >= 3
    windows = {int(p.name[1:9]): p for p in (spool / "h1" / "windows").iterdir()}
    for r in full:  # the store says what a report of the window itself says
        rep = json.loads(vmprof("report", str(windows[r["window"]]), "--vm", "steal1", "--format", "json").stdout)
        assert abs(r["steal_pct"] - rep["ratios"]["steal"]) < 1.0, (r, rep["ratios"])
        assert r["top"][0]["function"] == "[steal]"
    csv = vmprof("history", "--store", str(store), "--format", "csv")
    assert csv.returncode == 0 and csv.stdout.startswith("host,vm,window,start")
    d = vmprof("diff", "--store", str(store), "--vm", "steal1", "1h..0m", "1h..0m", "--format", "json")
    assert d.returncode == 0 and all(r["delta"] == 0 for r in json.loads(d.stdout))
    bad = vmprof("history", "--store", str(tmp_path / "nothing"))
    assert bad.returncode == 1 and "holds no analysed window" in bad.stderr
    asyncio.run(browse_store(store))


async def browse_store(store: Path) -> None:
    """`vmprof top --store`: step through the windows, open a VM's functions."""
    app = StoreApp(Store(store))
    async with app.run_test(size=(160, 40)) as pilot:
        title = app.query_one("#title", Static)
        last = str(title.render())
        assert f"window {len(app.starts)} of {len(app.starts)}" in last and "3 VMs on 1 hosts" in last
        await pilot.press("left")
        assert f"window {len(app.starts) - 1} of" in str(title.render())
        table = app.query_one("#vms", DataTable)
        assert table.row_count == 3 and "steal1" in str(table.get_row_at(0)[1])
        await pilot.press("enter")
        await pilot.pause()
        functions = app.screen.query_one("#functions", DataTable)
        names = {str(functions.get_row_at(i)[1]) for i in range(functions.row_count)}
        assert {"[steal]", "compute_a", "compute_b"} <= names, names


def test_steal_burst_is_flagged_in_the_right_windows(tmp_path: Path) -> None:
    """One VM alone, then two disturbance VMs on its pCPU: the windows after they start stand out, no other."""
    require_root()
    specs = runner.scenario_specs("correction")
    alone, _ = run_agent(tmp_path, 1.0, [(0.0, specs[:1]), (7.0, specs[1:])], tail_s=4.0)
    require_quiet_pcpu(*alone, "a VM alone on its pCPU has no steal only when nothing else uses that pCPU")
    store = tmp_path / "store"
    single_process(tmp_path / "h1", store)
    out = vmprof("history", "--store", str(store), "--vm", "measured", "--format", "json")
    rows = json.loads(out.stdout)
    burst = next(i for i, r in enumerate(rows) if r["steal_pct"] > 20)
    assert burst >= 5, [r["steal_pct"] for r in rows]
    flagged = [i for i, r in enumerate(rows) if any(a.startswith("steal") for a in r["anomalies"])]
    print("steal %:", [round(r["steal_pct"]) for r in rows], "flagged:", flagged)
    assert flagged and flagged[0] == burst, "the first disturbed window is flagged, none before"
    assert all(rows[i]["steal_pct"] > 20 for i in flagged), "only disturbed windows are flagged"
    only = vmprof("history", "--store", str(store), "--vm", "measured", "--anomalies", "--format", "json")
    assert {r["window"] for r in json.loads(only.stdout)} >= {rows[i]["window"] for i in flagged}
