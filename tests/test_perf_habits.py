"""What a perf user types on the first day (issue 36, items 1-3 and 9): perf's record options either work or
are refused with one line; -p PID ends with the process; the workload's exit status is record's."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import require_root, start_recording, vmprof

from vmprof_tui.collect.bpf import pmu_available
from vmprof_tui.record import recording


def one_line(res: subprocess.CompletedProcess, code: int, says: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code and len(lines) == 1 and says in lines[0], (res.returncode, res.stderr)


@pytest.mark.parametrize("args, says", [
    (["-c", "10000"], "-c 10000: vmprof samples by frequency, not every N events: use -F HZ"),
    (["-C", "1"], "-C 1: vmprof samples every CPU; vmprof report --cpu N shows one of them"),
    (["-t", "1"], "-t 1: vmprof keeps the samples of a whole process: use -p PID"),
    (["-e", "instructions"], "argument -e/--event: takes cpu-clock or cycles, not 'instructions'"),
])
def test_perf_options_without_an_equivalent_are_one_line(args: list[str], says: str) -> None:
    one_line(vmprof("record", "-d", "1", *args), 2, says)


def test_unknown_record_option_prints_records_usage() -> None:
    res = vmprof("record", "--bogus")
    assert res.returncode == 2 and res.stderr.startswith("usage: vmprof record"), res.stderr
    assert "vmprof record: error: unrecognized arguments: --bogus" in res.stderr


def test_event_cpu_clock_is_recorded_and_cycles_needs_a_pmu(tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "e.vmprof"
    res = vmprof("record", "-d", "0.3", "-q", "-e", "cpu-clock", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert recording.load(out).meta["event"] == "cpu-clock"
    res = vmprof("record", "-d", "0.3", "-q", "-e", "cycles", "-o", str(out))
    if pmu_available():
        assert res.returncode == 0 and recording.load(out).meta["event"] == "cycles", res.stderr
    else:  # these hosts: no PMU; nothing is written over the cpu-clock recording
        one_line(res, 1, "the cycles event needs a hardware PMU and this host has none")
        assert recording.load(out).meta["event"] == "cpu-clock" and not Path(f"{out}.old").exists()


def test_call_graph_mode_after_g_is_explained() -> None:
    one_line(vmprof("record", "-d", "1", "-g", "dwarf"), 2, "command not found: dwarf (a call-graph mode goes after "
                                                           "--call-graph)")


@pytest.mark.parametrize("args", [["--call-graph", "fp"], ["-g", "--call-graph", "fp"], ["-g"]])
def test_call_graph_fp_records_stacks(args: list[str], tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "g.vmprof"
    res = vmprof("record", "-d", "0.3", "-q", *args, "-o", str(out))
    assert res.returncode == 0, res.stderr
    rec = recording.load(out)
    assert rec.meta["stacks"] and rec.stacks is not None


def test_record_exits_with_the_commands_status(tmp_path: Path) -> None:
    require_root()
    res = vmprof("record", "-q", "-o", str(tmp_path / "c.vmprof"), "--", "sh", "-c", "exit 3")
    assert res.returncode == 3, res.stderr
    res = vmprof("record", "-q", "-o", str(tmp_path / "c.vmprof"), "--", "sh", "-c", "kill -TERM $$")
    assert res.returncode == 128 + 15, res.stderr
    res = vmprof("record", "-q", "-o", str(tmp_path / "c.vmprof"), "--", "true")
    assert res.returncode == 0, res.stderr


def record_pid(tmp_path: Path, command: list[str], until: str) -> tuple[dict, int]:
    """`vmprof record -p` (no -d) of a process started just before it, which ends once a progress line matches
    `until`; recording must then end by itself.  Returns the report's JSON and the pid."""
    proc = subprocess.Popen(command)
    out = tmp_path / "p.vmprof"
    try:
        rec = start_recording(out, "-p", str(proc.pid))
        deadline = time.monotonic() + 60
        while not any(re.search(until, line) for line in rec.lines):
            assert time.monotonic() < deadline and rec.poll() is None, "".join(rec.lines)
            with pytest.raises(subprocess.TimeoutExpired):
                rec.wait(timeout=0.2)
    finally:
        proc.terminate()
        proc.wait()
    assert rec.wait(60) == 0, "".join(rec.lines)  # ended with the process, no -d, no signal
    assert any(f"process {proc.pid} exited" in line for line in rec.lines), "".join(rec.lines)
    report = vmprof("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout), proc.pid


def test_record_pid_stops_when_a_sleep_exits_and_has_no_idle(tmp_path: Path) -> None:
    """A sleeping process: the CPUs were idle meanwhile, but that idle is not the process's (issue 36: the report
    of -p sleep said IDLE 100%)."""
    require_root()
    doc, _pid = record_pid(tmp_path, ["sleep", "60"], r": +[2-9]\.\ds ")  # 2 s recorded
    assert doc["ratios"]["idle"] == 0.0, doc["ratios"]


def test_record_pid_of_a_busy_process_is_all_its_own_samples(tmp_path: Path) -> None:
    """A busy loop (no child processes): its report is its own samples only, no idle, no VM."""
    require_root()
    host, pid = record_pid(tmp_path, ["sh", "-c", "while :; do :; done"], r"samples [1-9]\d{2,}")  # 100 or more
    ratios = host["ratios"]
    assert ratios["idle"] == 0.0 and ratios["vm"] == 0.0, ratios
    assert ratios["os"] + ratios["user"] == pytest.approx(100.0), ratios
    assert host["total_samples"] >= 100 and {r["pid"] for r in host["rows"]} == {pid}, host["rows"][:5]
