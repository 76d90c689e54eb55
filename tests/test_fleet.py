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
from test_fleet_one_pass import assert_same_tables
from test_tui import until
from textual.widgets import DataTable, Static

from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.demo import runner
from vmprof_tui.demo.scenarios import SHARED_CPU
from vmprof_tui.fleet.analyse import corrupt_path, done_path, find_windows
from vmprof_tui.fleet.history import Store
from vmprof_tui.fleet.store_app import StoreApp
from vmprof_tui.fleet.tasks import HOST_TASK, TABLES, analyse_window, analyse_window_vm, window_vms
from vmprof_tui.record.spool import Agent, Spool

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
        analyse_window(ref, str(store))


def test_one_pass_of_real_windows_writes_what_the_per_vm_tasks_write(spool: Path, tmp_path: Path) -> None:
    """Windows of the agent over real demo VMs: the one pass against a whole analysis per VM and for the host."""
    refs = [r for r in find_windows([spool]) if r.host == "h1"]
    for ref in refs:
        for vm in [*window_vms(ref.path)[0], HOST_TASK]:
            analyse_window_vm(ref, vm, str(tmp_path / "reference"))
        analyse_window(ref, str(tmp_path / "one"))
    assert_same_tables(tmp_path / "one", tmp_path / "reference")


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
    for name in TABLES:
        assert table(store, name) == table(reference, name), f"the {name} table differs from single-process analysis"
    again = vmprof("analyze", str(spool), "--store", str(store), "--scheduler", cluster.address, timeout=600)
    assert again.returncode == 0 and " window " not in again.stdout, "a second run adds nothing"
    for name in TABLES:
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
    for name in TABLES:
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
        rep = json.loads(vmprof("report", str(windows[r["window_id"]]), "--vm", "steal1", "--format", "json").stdout)
        assert abs(r["steal_pct"] - rep["ratios"]["steal"]) < 1.0, (r, rep["ratios"])
        assert r["top"][0]["function"] == "[steal]"
    csv = vmprof("history", "--store", str(store), "--format", "csv")
    assert csv.returncode == 0 and csv.stdout.startswith("host,vm,window_id,start")
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
        await pilot.press("left")  # the window is loaded from the store, then the title and table change
        await until(pilot, lambda: f"window {len(app.starts) - 1} of" in str(title.render()), timeout=30)
        table = app.query_one("#vms", DataTable)
        assert table.row_count == 3 and "steal1" in str(table.get_row_at(0)[1])
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.screen.query("#functions")), timeout=30)
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
    assert {r["window_id"] for r in json.loads(only.stdout)} >= {rows[i]["window_id"] for i in flagged}


def test_a_corrupt_window_is_skipped_and_stays_visible_as_corrupt(spool: Path, tmp_path: Path) -> None:
    """50 flipped bytes in the middle of a window (its end chunk intact): `analyze` skips it with one line naming
    the damage instead of storing it as a window of empty rows, marks it corrupt (not done), says so again when
    run again, and `history` says it was skipped with one line."""
    import random

    copy = tmp_path / "spool"
    shutil.copytree(spool / "h1", copy / "h1")
    victim = sorted((copy / "h1" / "windows").iterdir())[2]
    data = bytearray(victim.read_bytes())
    rng = random.Random(7)
    for at in rng.sample(range(len(data) // 3, 2 * len(data) // 3), 50):
        data[at] ^= 0xFF
    victim.write_bytes(bytes(data))
    store = tmp_path / "store"
    for run in range(2):
        out = vmprof("analyze", str(copy), "--store", str(store), "--workers", "1", timeout=600)
        assert out.returncode == 0, out.stderr
        notes = [line for line in out.stderr.splitlines() if "skipped" in line]
        assert len(notes) == 1 and "h1 window 3 skipped: corrupt recording" in notes[0], (run, out.stderr)
        assert "damaged chunk" in notes[0]
    ref = next(r for r in find_windows([copy]) if r.seq == 3)
    assert not done_path(store, ref).exists() and corrupt_path(store, ref).exists()
    assert not [f for f in (store / "profile").rglob("w00000003-*.parquet")], "no rows of the corrupt window"
    hist = vmprof("history", "--store", str(store))
    assert hist.returncode == 0, hist.stderr
    skipped = [line for line in hist.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("vmprof history: h1 window 3 skipped: corrupt recording")
    assert all(int(line.split()[2]) != 3 for line in hist.stdout.splitlines()[1:])


def test_analyze_onto_a_read_only_store_is_one_line(spool: Path, tmp_path: Path) -> None:
    """A store on a read-only file system: one line naming the store, exit 1, before any window is analysed;
    a store path that is a file likewise (neither is blamed on the Dask scheduler)."""
    require_root()
    store = tmp_path / "ro"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(store)], check=True)
    try:
        out = vmprof("analyze", str(spool / "h1"), "--store", str(store), "--workers", "1", timeout=600)
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"vmprof: cannot write the store {store}: Read-only file system"], out.stderr
    assert " window " not in out.stdout
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    out = vmprof("analyze", str(spool / "h1"), "--store", str(a_file), "--workers", "1", timeout=600)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
    assert f"cannot write the store {a_file}" in out.stderr and "scheduler" not in out.stderr


def test_two_concurrent_analyze_runs_on_one_store_both_succeed(spool: Path, tmp_path: Path) -> None:
    """Two `vmprof analyze` runs on one store at once: no shared temporary name, a window finished by the other
    run is no error, and the store holds every window once, as a single run makes it."""
    store = tmp_path / "store"
    runs = [subprocess.Popen([sys.executable, "-m", "vmprof_tui", "analyze", str(spool / "h1"), "--store",
                              str(store), "--workers", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in runs]
    for p, (_stdout, stderr) in zip(runs, outs, strict=True):
        assert p.returncode == 0 and "skipped" not in stderr and "scheduler" not in stderr, stderr
    refs = find_windows([spool / "h1"])
    assert all(done_path(store, r).exists() for r in refs)
    assert not list(store.rglob("*.tmp")), "no temporary file left"
    reference = tmp_path / "single"
    single_process(spool / "h1", reference)
    for name in TABLES:
        assert table(store, name) == table(reference, name), name


def test_history_and_diff_say_when_nothing_matched(spool: Path, tmp_path: Path) -> None:
    """`history --vm nosuch`, `--host nosuch`, `--since` after the last window: one line, exit 1; `--baseline 0`
    or `-3`: bad usage, exit 2; `diff` with an empty range names it, exit 1."""
    store = tmp_path / "store"
    single_process(spool / "h1", store)
    for args, code, says in (
            (("--vm", "nosuch"), 1, "vmprof: no VM named nosuch in"),
            (("--host", "nosuch"), 1, "vmprof: no host named nosuch in"),
            (("--vm", "steal1", "--since", "2999-01-01"), 1, "vmprof: no window in"),
            (("--baseline", "0"), 2, "--baseline takes 3 or more windows, not 0"),
            (("--baseline", "-3"), 2, "--baseline takes 3 or more windows, not -3")):
        out = vmprof("history", "--store", str(store), *args)
        assert out.returncode == code and len(out.stderr.splitlines()) == 1 and says in out.stderr, (args, out.stderr)
        assert out.stdout == ""
    listed = vmprof("history", "--store", str(store), "--vm", "nosuch").stderr.split("(VMs: ")[1]
    assert {"steal1", "steal2", "steal3"} <= set(listed.rstrip(")\n").split(", ")), listed  # (and any other VM here)
    empty = vmprof("diff", "--store", str(store), "--vm", "steal1", "1000d..999d", "1h..0m")
    assert empty.returncode == 1 and len(empty.stderr.splitlines()) == 1, empty.stderr
    assert "range A 1000d..999d (" in empty.stderr and "holds no window of VM steal1" in empty.stderr
    empty = vmprof("diff", "--store", str(store), "--vm", "steal1", "1h..0m", "1000d..999d")
    assert empty.returncode == 1 and "range B 1000d..999d (" in empty.stderr, empty.stderr
    nosuch = vmprof("diff", "--store", str(store), "--vm", "nosuch", "1h..0m", "1h..0m")
    assert nosuch.returncode == 1 and "no VM named nosuch" in nosuch.stderr, nosuch.stderr


def test_the_store_answers_the_queries_a_user_writes(spool: Path, tmp_path: Path) -> None:
    """DuckDB over the store as a user asks it, nothing quoted: `window_id` (WINDOW is reserved), state totals
    that add up to each vCPU's time without counting steal twice, every steal cause the metrics export (adding
    up to the steal states), who held the pCPU, co-stop and halt polling, and the host level per window."""
    import duckdb

    store = tmp_path / "store"
    single_process(spool / "h1", store)
    db = duckdb.connect()
    for name in TABLES:
        db.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{store}/{name}/**/*.parquet', "
                   "hive_partitioning = true)")
    by_state = dict(db.execute("SELECT state, sum(seconds) FROM vcpu GROUP BY state").fetchall())
    assert set(by_state) == {"guest_user", "guest_kernel", "idle", "steal_type1", "steal_type2"}
    # per vCPU and window, the states add up to the vCPU's time: at most the window, nothing counted twice
    over = db.execute("SELECT window_id, vm, vcpu, sum(seconds) AS s, max(window_s) AS w FROM vcpu "
                      "GROUP BY window_id, vm, vcpu HAVING sum(seconds) > max(window_s) * 1.02").fetchall()
    assert over == [], over
    full = db.execute("SELECT count(*) FROM (SELECT window_id, vm, vcpu FROM vcpu GROUP BY ALL "
                      "HAVING sum(seconds) > 0.95 * max(window_s))").fetchone()[0]
    assert full >= 3, "VMs that ran the whole window account for all of it"
    steal = dict(db.execute("SELECT state, sum(seconds) FROM vcpu WHERE state LIKE 'steal%' GROUP BY state")
                 .fetchall())
    causes = dict(db.execute("SELECT type, sum(seconds) FROM steal GROUP BY type").fetchall())
    assert causes[1] == pytest.approx(steal["steal_type1"], rel=1e-6, abs=1e-9)
    assert causes.get(2, 0.0) == pytest.approx(steal["steal_type2"], rel=1e-6, abs=1e-9)
    type1 = {c for (c,) in db.execute("SELECT DISTINCT cause FROM steal WHERE type = 1").fetchall()}
    assert type1 == {"preempted", "wakeup", "throttled", "irq"}
    # who held the pCPU adds up to the type-1 steal of the preemptions (steal3 is never throttled), per vCPU
    by_cause = dict(db.execute("SELECT cause, sum(seconds) FROM steal WHERE type = 1 GROUP BY cause").fetchall())
    assert by_cause["throttled"] == 0
    held = db.execute("SELECT sum(seconds) FROM steal_holder").fetchone()[0]
    assert held == pytest.approx(by_cause["preempted"] + by_cause["irq"], rel=1e-6)
    assert held == pytest.approx(steal["steal_type1"] - by_cause["wakeup"], rel=1e-6)
    apart = db.execute("SELECT * FROM (SELECT host, window_id, vm, vcpu, sum(seconds) AS held FROM steal_holder "
                       "GROUP BY ALL) JOIN (SELECT host, window_id, vm, vcpu, sum(seconds) AS preempted FROM steal "
                       "WHERE cause IN ('preempted', 'irq') GROUP BY ALL) USING (host, window_id, vm, vcpu) "
                       "WHERE abs(held - preempted) > 1e-9 + 1e-6 * preempted").fetchall()
    assert apart == [], apart
    assert steal["steal_type1"] > 1.0, "three VMs on one pCPU steal from each other"
    other = {w for (w,) in db.execute("SELECT DISTINCT what FROM vcpu_other").fetchall()}
    assert other == {"costop", "halt_poll", "irq_while_running"}
    windows = db.execute("SELECT count(DISTINCT window_id) FROM vcpu").fetchone()[0]
    host = db.execute("SELECT window_id, sum(samples) FILTER (WHERE vm IS NOT NULL), count(*) FROM host_profile "
                      "GROUP BY window_id ORDER BY window_id").fetchall()
    assert len(host) == windows and all(n > 0 for _w, _vm_samples, n in host)
    assert any(vm_samples for _w, vm_samples, _n in host), "the host level has the VMs' time"
    # the store's own reader agrees with the rows
    rows = json.loads(vmprof("history", "--store", str(store), "--vm", "steal1", "--format", "json").stdout)
    assert rows and all("window_id" in r for r in rows)
