"""`vmprof blocks` as a user runs it (issue 7); exit codes as every command's (README)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from vmprof_tui.lbr import capability

DATA = ROOT / "tests/data/lbr"


def blocks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmprof_tui", "blocks", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_usage_and_help() -> None:
    r = blocks()
    assert r.returncode == 2 and "needs a recording (REC) or --perf-script FILE" in r.stderr
    r = blocks("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "--perf-script" in r.stdout
    r = blocks("--format", "xml")
    assert r.returncode == 2


def test_patterns_volume() -> None:
    r = blocks("--patterns", "--rate", "1000", "--cpus", "16")
    assert r.returncode == 0, r.stderr
    first, with_info = r.stdout.split("\n\n")
    rows = {line.split()[0]: line.split() for line in first.splitlines() if line.startswith("type")}
    assert "with the info word" in with_info
    assert set(rows) == {"type1", "type2", "type3", "type4"}
    assert rows["type4"][1] == "32" and rows["type2"][1] == "16" and rows["type3"][1] == "16"  # values per sample
    assert int(rows["type2"][3]) < int(rows["type4"][3])


def test_check_says_why() -> None:
    r = blocks("--check")
    caps = capability.detect()
    if caps.ok:
        assert r.returncode == 0 and "LBR collection available" in r.stdout
    else:
        assert r.returncode == 1
        assert r.stderr.strip() == caps.message
        assert len(r.stderr.strip().splitlines()) == 1


def test_perf_script_end_to_end() -> None:
    r = blocks("--perf-script", str(DATA / "perf_script_brstackinsn.txt"), "--function", "leaf", "--format", "csv",
               "--freq-mhz", "2000")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("sample,time_ns,cpu,pid")
    assert len(lines) == 3 and all(",leaf,ok,1," in line for line in lines[1:])
    r = blocks("--perf-script", str(DATA / "perf_script_brstack.txt"), "--format", "table")
    assert r.returncode == 0, r.stderr
    assert "CPI 0.626" in r.stdout
    assert "unmapped 15" in r.stdout


def test_runtime_failures_are_one_line() -> None:
    r = blocks("--perf-script", str(DATA / "nonexistent.txt"))
    assert r.returncode == 1 and r.stderr.startswith("vmprof: cannot read") and r.stderr.count("\n") == 1
    r = blocks("some.rec")
    assert r.returncode == 1 and r.stderr.startswith("vmprof: cannot read some.rec") and r.stderr.count("\n") == 1
