"""`vmprof agent` (issue 12, the measured host): back-to-back windows of one collection session in a
spool, against real demo VMs and a one-shot recording of the same span."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import record_scenario, require_root, start_sampling, vmprof

from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.analyse.source import RecordingSource
from vmprof_tui.collect.session import Chunk, CollectionSession, read_kallsyms
from vmprof_tui.demo import runner
from vmprof_tui.record import recording
from vmprof_tui.record.recorder import Recorder
from vmprof_tui.record.recording import snapshot
from vmprof_tui.record.spool import WINDOW_RE, Agent, Spool, parse_duration, parse_size
from vmprof_tui.record.writer import Writer


def windows(spool: Path, host: str = "h1") -> list[Path]:
    return Spool(spool, host).complete_windows()


def wait_windows(spool: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> list[Path]:
    deadline = time.monotonic() + timeout
    while len(found := windows(spool)) < n:
        assert time.monotonic() < deadline, f"only {len(found)} windows after {timeout} s"
        with pytest.raises(subprocess.TimeoutExpired):  # the agent must still run
            proc.wait(timeout=0.2)
    return found


def shares(profile: Profile) -> dict[tuple, float]:
    """Each row's % of the profile, as `report --format json` gives it."""
    total = profile.total_samples or 1.0
    return {(r.function, r.module, r.process or ""): 100.0 * r.samples / total for r in profile.rows}


class TeeSession:
    """A collection session whose chunks also go, whole, into one one-shot recording (written as `vmprof record`
    writes it): the windows and the one-shot recording then hold the same samples, so what differs between
    their reports is only what cutting into windows changes."""

    def __init__(self, session: CollectionSession, path: Path) -> None:
        self._session = session
        self.recorder = Recorder(path, session)

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)

    def start(self) -> None:
        self._session.start()
        self.recorder.writer = Writer(self.recorder.out, self._session.meta())
        self.first = True

    def poll(self, **kw: float) -> Chunk:
        chunk = self._session.poll(**kw)
        self.recorder._write(chunk, first=self.first)
        self.first = False
        return chunk

    def finish(self) -> tuple[Chunk, dict]:
        chunk, lost = self._session.finish()
        self.recorder._write(chunk)
        self.recorder.writer.add_snapshot(snapshot(kallsyms=read_kallsyms()))
        self.recorder.writer.close({"duration_s": 0.0, "lost": lost})
        return chunk, lost


@pytest.mark.parametrize("frequency", [1000, 10000])
def test_windows_touch_and_match_a_one_shot_recording(tmp_path: Path, frequency: int) -> None:
    require_root()
    os.sched_setaffinity(0, {0})  # as record_scenario: the profiler stays off the VMs' pCPU
    one_shot = tmp_path / "one-shot.vmprof"
    session = TeeSession(CollectionSession(frequency), one_shot)
    spool = Spool(tmp_path / "spool", "h1")
    agent = Agent(session, spool, window_s=5.0)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop.is_set,))
    thread.start()
    try:
        assert session.attached.wait(120)
        with runner.DemoRun(runner.scenario_specs("steal3"), duration_s=31.0) as run:
            run.wait(60)
    finally:
        stop.set()
        thread.join(60)
    log = spool.read_log()
    assert len(log) >= 7 and all(w["stored"] for w in log)
    assert sum(w["uncovered_s"] for w in log) == 0.0
    for a, b in zip(log, log[1:], strict=False):
        assert a["end_ns"] == b["start_ns"], "consecutive windows touch"
    assert sum(w["lost_samples"] for w in log) == 0
    rec = recording.load(one_shot)
    assert sum(w["samples"] for w in log) == len(rec.samples), "every sample is in exactly one window"
    first_ns = min(int(a["time_ns"].min()) for a in (rec.samples, rec.sched))
    vm_pids = {name: vm["pid"] for name, vm in run.ready.items()}  # this test's VMs (others may run on the host)
    vm_times = [rec.samples["time_ns"][rec.samples["pid"] == pid] for pid in vm_pids.values()]
    lived = (max(int(t.min()) for t in vm_times), min(int(t.max()) for t in vm_times))  # all VMs ran
    compared = 0
    for w in log:
        if w["start_ns"] < lived[0] or w["end_ns"] > lived[1]:
            continue  # windows where the VMs did not run all along
        lo, hi = (w["start_ns"] - first_ns) / 1e9, (w["end_ns"] - 1 - first_ns) / 1e9
        window_an = analyse(recording.load(spool.windows / w["file"]))
        ref_an = analyse(rec, time_range=(lo, hi))  # what `report --time-range` analyses
        for vm in vm_pids:
            got, want = shares(window_an.guest_profile(vm)), shares(ref_an.guest_profile(vm))
            print(f"window {w['seq']} {vm}: " + ", ".join(f"{k[0]} {k[1]} {got.get(k, 0):.1f}/{want.get(k, 0):.1f}"
                                                          for k in sorted(set(got) | set(want))))
            for key in set(got) | set(want):
                assert abs(got.get(key, 0.0) - want.get(key, 0.0)) <= 1.0, (w["seq"], vm, key, got, want)
        compared += 1
    assert compared >= 5, "at least five windows of 5 s where the VMs ran all along"


def test_sigkill_loses_at_most_the_open_window_and_restart_continues(tmp_path: Path) -> None:
    require_root()
    spool = tmp_path / "spool"
    args = ("agent", "--spool", str(spool), "--host", "h1", "--window", "1s")
    agent = start_sampling(*args)
    before = wait_windows(spool, 2, agent)
    agent.send_signal(signal.SIGKILL)
    agent.wait(30)
    after_kill = windows(spool)
    assert len(after_kill) >= len(before) and all(recording.load(p).complete for p in after_kill)
    agent = start_sampling(*args)  # a restart continues in the same spool
    try:
        wait_windows(spool, len(after_kill) + 1, agent)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    seqs = [int(WINDOW_RE.match(p.name).group(1)) for p in windows(spool)]
    assert seqs == sorted(set(seqs)) and seqs[len(after_kill)] > seqs[len(after_kill) - 1]
    assert not list((spool / "h1" / "windows").glob("*.tmp"))


def test_retention_by_size_deletes_the_oldest(tmp_path: Path) -> None:
    require_root()
    spool = tmp_path / "spool"
    out = vmprof("agent", "--spool", str(spool), "--host", "h1", "--window", "1s", "--max-size", "30k", "-d", "5.5")
    assert out.returncode == 0, out.stderr
    log = Spool(spool, "h1").read_log()
    kept = windows(spool)
    assert len(log) >= 5 and len(kept) < len(log)
    # the oldest go first: what is left is the newest windows, within the limit (or the newest alone, when a
    # loaded host makes one window bigger than the limit)
    assert [p.name for p in kept] == [w["file"] for w in log[len(log) - len(kept):]]
    assert sum(p.stat().st_size for p in kept) <= 30 * 1024 or len(kept) == 1


def test_full_spool_is_one_line_and_collection_goes_on(tmp_path: Path) -> None:
    """The spool's filesystem fills up while the agent runs: the windows that do not fit are counted with one
    line each, collection goes on, the stored windows stay readable, and storing resumes once there is room."""
    require_root()
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        agent = start_sampling("agent", "--spool", str(mnt), "--host", "h1", "--window", "1s")
        wait_windows(mnt, 1, agent)
        filler = mnt / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        deadline = time.monotonic() + 60
        while not any("NOT stored" in line for line in agent.lines):
            assert time.monotonic() < deadline, "".join(agent.lines)
            with pytest.raises(subprocess.TimeoutExpired):
                agent.wait(timeout=0.2)
        filler.unlink()
        stored_before = len(windows(mnt))
        wait_windows(mnt, stored_before + 1, agent)  # room again: storing resumes
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0
        full = [line for line in agent.lines if "NOT stored" in line]
        assert full and all("the spool is full; collection goes on" in line for line in full), full
        for p in windows(mnt):
            assert recording.load(p).complete
        assert not list((mnt / "h1" / "windows").glob("*.tmp"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_metrics_endpoint_serves_steal_by_vm(tmp_path: Path) -> None:
    require_root()
    port = 19466 + os.getpid() % 500
    agent = start_sampling("agent", "--spool", str(tmp_path), "--host", "h1", "--window", "1s",
                           "--metrics", f"127.0.0.1:{port}")
    try:
        record_scenario(tmp_path, "steal3", 2.5)
        wait_windows(tmp_path, 3, agent)
        deadline = time.monotonic() + 60
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            if 'vmprof_vcpu_seconds_total{state="steal_type1",vcpu="0",vm="steal1"}' in text:
                break
            assert time.monotonic() < deadline, text[-2000:]
            with pytest.raises(subprocess.TimeoutExpired):
                agent.wait(timeout=0.5)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    assert "vmprof_window_store_seconds" in text and "vmprof_lost_samples_total 0.0" in text


def test_sizes_durations_and_bad_usage() -> None:
    assert parse_size("10G") == 10 << 30 and parse_size("500M") == 500 << 20 and parse_size("64k") == 65536
    assert parse_duration("24h") == 86400 and parse_duration("90") == 90 and parse_duration("5m") == 300
    bad = vmprof("agent", "--spool", "/tmp/x", "--window", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr


def test_prometheus_scrapes_the_agent(tmp_path: Path) -> None:
    """Debian's prometheus scrapes `vmprof agent --metrics`; its HTTP API returns the VMs' steal series."""
    require_root()
    metrics_port, prom_port = 19466 + os.getpid() % 500, 19966 + os.getpid() % 500
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vmprof\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    agent = start_sampling("agent", "--spool", str(tmp_path / "spool"), "--host", "h1", "--window", "1s",
                           "--metrics", f"127.0.0.1:{metrics_port}")
    prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    query = (f"http://127.0.0.1:{prom_port}/api/v1/query?query="
             "vmprof_vcpu_seconds_total%7Bstate%3D%22steal_type1%22%7D")
    try:
        record_scenario(tmp_path, "steal3", 3.0)
        deadline = time.monotonic() + 120
        while True:
            try:
                doc = json.loads(urllib.request.urlopen(query, timeout=5).read())
                series = {r["metric"]["vm"]: float(r["value"][1]) for r in doc["data"]["result"]}
            except OSError:  # not up yet
                series = {}
            if {"steal1", "steal2", "steal3"} <= set(series) and min(series.values()) > 0:
                break
            assert time.monotonic() < deadline, f"prometheus has {series}"
            with pytest.raises(subprocess.TimeoutExpired):
                prom.wait(timeout=0.5)
    finally:
        for p in (agent, prom):
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    print("steal type 1 seconds per VM, as Prometheus has them:", series)


def test_status_leaves_the_window_in_progress(tmp_path: Path) -> None:
    """`vmprof agent --status` reads a spool that a running agent writes: the window in progress (.tmp) stays
    (a reader that cleaned up would make the agent's rename of that window fail)."""
    spool = Spool(tmp_path, "h1")
    in_progress = spool.windows / "W00000001-1764000000.tmp"
    in_progress.write_bytes(b"being written")
    assert vmprof("agent", "--spool", str(tmp_path), "--host", "h1", "--status").returncode == 0
    assert windows(tmp_path) == [] and in_progress.exists()
    spool.remove_unfinished()  # what an agent starting on this spool does
    assert not in_progress.exists()


def _non_loopback_address() -> str:
    """An IPv4 address of this host other than 127.x (the test machines have one on eth0)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines() if " lo " not in line]
    assert found, f"no non-loopback IPv4 address here: {out}"
    return found[0]


def _answers(address: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except OSError:
        return False


def test_metrics_colon_port_listens_on_every_interface(tmp_path: Path) -> None:
    """`--metrics :PORT` is reachable from other hosts (every interface); `--metrics PORT` stays on 127.0.0.1;
    `ADDR:PORT` that address; a bad port is one line of usage; --help says which is which."""
    import socket

    from vmprof_tui.fleet.metrics import AgentMetrics, parse_address

    assert parse_address(":9466") == ("0.0.0.0", 9466) and parse_address("9466") == ("127.0.0.1", 9466)
    assert parse_address("10.0.0.1:80") == ("10.0.0.1", 80) and parse_address("[::1]:9466") == ("::1", 9466)
    outside = _non_loopback_address()
    for given, reachable_from_outside in ((":{}", True), ("{}", False), ("127.0.0.1:{}", False)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = AgentMetrics().serve(given.format(port))
        try:
            assert _answers("127.0.0.1", port)
            assert _answers(outside, port) == reachable_from_outside, (given, outside)
        finally:
            server.shutdown()
            server.server_close()
    for bad in (":99999", ":0", "host:", ":port"):
        out = vmprof("agent", "--spool", str(tmp_path / "spool"), "--metrics", bad)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        assert "--metrics takes PORT, :PORT or ADDR:PORT" in out.stderr
    assert not (tmp_path / "spool").exists(), "bad usage makes no spool"
    help_text = " ".join(vmprof("agent", "--help").stdout.split())
    assert "PORT on 127.0.0.1 only, :PORT on every interface" in help_text


def test_metrics_holder_labels_stay_bounded(tmp_path: Path) -> None:
    """Host process names as the `cause` label were unbounded series: 30 windows, each with 8 new host processes
    preempting a vCPU, give at most MAX_HOLDER_LABELS names plus "other", and no second of steal is lost."""
    import sys

    from prometheus_client import CollectorRegistry

    sys.path.insert(0, str(Path(__file__).parent))
    from synth import MS, SynthRecording

    from vmprof_tui.fleet.metrics import MAX_HOLDER_LABELS, AgentMetrics

    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    expected = 0.0
    for window in range(30):
        b = SynthRecording(frequency=1000, cpus=2)
        web = b.vm("web", pid=100, vcpus={0: 101})
        t = 0
        for i in range(8):
            b.run(web, 0, cpu=1, start_ns=t, end_ns=t + 5 * MS)
            b.preempt(web, 0, start_ns=t + 5 * MS, end_ns=t + 5 * MS + (i + 1) * MS)
            b.host_task(1000 + window * 10 + i, f"job{window}-{i}", cpu=1, start_ns=t + 5 * MS,
                        end_ns=t + 5 * MS + (i + 1) * MS)
            t += 5 * MS + (i + 1) * MS
        b.run(web, 0, cpu=1, start_ns=t, end_ns=t + 5 * MS)
        an = analyse(recording.load(b.write(tmp_path / f"w{window}.vmprof")))
        metrics.add_window(RecordingSource(an), True, 0.0, 0.0, 0)
        expected += sum(range(1, 9)) / 1000
    labels = {s.labels["cause"]: s.value for m in registry.collect() if m.name == "vmprof_vcpu_steal_seconds"
              for s in m.samples if s.name.endswith("_total") and s.labels["type"] == "1"}
    assert "other" in labels and len(labels) <= MAX_HOLDER_LABELS + 1, sorted(labels)
    assert sum(labels.values()) == pytest.approx(expected, rel=0.02)


def test_an_agent_outage_counts_as_uncovered_time(tmp_path: Path) -> None:
    """SIGKILL, then a restart on the same spool: the time from the end of the last stored window to the first
    window of the new agent was covered by none, and it is counted: the new first window's uncovered_s is at
    least the time the agent was down, and `--status` reports an uncovered share above 0."""
    require_root()
    spool = tmp_path / "spool"
    args = ("agent", "--spool", str(spool), "--host", "h1", "--window", "1s")
    agent = start_sampling(*args)
    wait_windows(spool, 2, agent)
    agent.send_signal(signal.SIGKILL)
    agent.wait(30)
    killed_at = time.time()
    before = Spool(spool, "h1").read_log()
    assert sum(w["uncovered_s"] for w in before) == 0.0  # windows of one run touch
    restarted_at = time.time()
    agent = start_sampling(*args)
    try:
        deadline = time.monotonic() + 120
        while len(Spool(spool, "h1").read_log()) <= len(before):
            assert time.monotonic() < deadline, "no window after the restart"
            with pytest.raises(subprocess.TimeoutExpired):
                agent.wait(timeout=0.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    log = Spool(spool, "h1").read_log()
    first = log[len(before)]
    gap = first["end_unix_s"] - first["t1_s"] - before[-1]["end_unix_s"]
    print(f"outage: last window ended {killed_at - before[-1]['end_unix_s']:.2f} s before the kill, "
          f"the first new window started {gap:.2f} s after it; uncovered_s {first['uncovered_s']:.2f}")
    assert first["uncovered_s"] == pytest.approx(gap, abs=0.01)
    # no window covers the time from the last stored window's end until the new agent was started, at least
    assert first["uncovered_s"] >= restarted_at - before[-1]["end_unix_s"] > 0
    assert all(w["uncovered_s"] == 0.0 for w in log[len(before) + 1:]), "the new run's windows touch again"
    status = vmprof("agent", "--spool", str(spool), "--host", "h1", "--status")
    share = float(re.search(r"not stored, uncovered ([\d.]+)% of", status.stdout).group(1))
    total = sum(w["t1_s"] + w["uncovered_s"] for w in log)
    assert share == pytest.approx(100 * first["uncovered_s"] / total, abs=0.01) and share > 0, status.stdout
