"""`vmprof record --lbr=simulate` (issue 38): LBR records on a machine without a PMU, from the exact
single-step ground truth, read back by everything that reads a PMU host's records."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from test_lbr_groundtruth import CFLAGS

from vmprof_tui.cli import main
from vmprof_tui.lbr import groundtruth
from vmprof_tui.lbr.model import CALL_RETURN_USER, Fields
from vmprof_tui.lbr.records import to_samples
from vmprof_tui.record.recording import load

RATE = 100_000  # a sample every 10,000 simulated cycles


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lbrsim") / "lbr_workload"
    subprocess.run(["gcc", *CFLAGS, "-DROUNDS=1000", "-o", str(out), str(ROOT / "tests/native/lbr_workload.c")],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def simulated(workload: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    rec = tmp_path_factory.mktemp("lbrsim") / "sim.vmprof"
    assert main(["record", "--lbr=simulate", "-F", str(RATE), "-q", "-o", str(rec), "--", str(workload)]) == 0
    return rec


def test_simulated_records_equal_the_single_step_truth(simulated: Path, workload: Path) -> None:
    rec = load(simulated)
    assert rec.complete and rec.meta["lbr"]["simulated"] is True and rec.meta["lbr"]["depth"] == 16
    samples = to_samples(rec.lbr)
    assert len(samples) > 30 and len(rec.samples) == len(samples)
    # an independent trace of the same static program: the same instructions, branches and cost
    t = groundtruth.trace(str(workload))
    sim = groundtruth.LbrSimulator(t, groundtruth.branches(t), CALL_RETURN_USER, 16)
    assert rec.meta["lbr"]["instructions"] == len(t.rips)
    points = np.cumsum([s.instructions for s in samples])
    # sampled as a PMU would: the instruction at which each period of 10,000 cycles was crossed
    assert np.array_equal(points, np.searchsorted(sim.cum_cost, 10_000 * np.arange(1, len(samples) + 1)))
    truth, _ = sim.samples(points.tolist(), Fields.FROM | Fields.TO)
    for got, want in zip(samples, truth, strict=True):
        assert np.array_equal(got.from_, want.from_) and np.array_equal(got.to, want.to)
        assert np.array_equal(got.lbr_cycles, want.lbr_cycles)
        assert (got.cycles, got.instructions, got.ip) == (want.cycles, want.instructions, want.ip)
        assert got.branch_filter == CALL_RETURN_USER and got.nr <= 16


def test_simulated_recording_is_marked_in_report_and_blocks(simulated: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(simulated)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED LBR (no PMU)" in out and "pair" in out
    assert main(["blocks", str(simulated), "-f", "pair", "--samples", "0"]) == 0
    assert "SIMULATED LBR (no PMU)" in capsys.readouterr().out


def test_simulate_stops_at_the_instruction_limit_and_keeps_the_trace(workload: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    rec = tmp_path / "cut.vmprof"
    assert main(["record", "--lbr=simulate", "-F", str(RATE), "--lbr-max-instructions", "30000", "-o", str(rec),
                 "--", str(workload)]) == 0
    err = capsys.readouterr().err
    assert "stopped at more than 30000 instructions" in err
    r = load(rec)
    assert r.complete and r.meta["lbr"]["instructions"] == 30000 and r.meta["lbr"]["stopped"]
    assert sum(s.instructions for s in to_samples(r.lbr)) < 30000


def test_simulate_bad_usage_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["record", "--lbr=simulate", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a command" in err[0]
    assert main(["record", "--lbr=simulate:type9", "-o", str(tmp_path / "x"), "--", "true"]) == 2
    assert "unknown LBR pattern" in capsys.readouterr().err


def test_simulate_stops_at_an_interrupt_and_keeps_the_trace(workload: Path) -> None:
    from vmprof_tui.lbr import simulate as lbr_simulate
    from vmprof_tui.lbr.patterns import get

    asked = []

    def interrupted() -> bool:  # Ctrl-C arrives after the third look (8192 instructions in)
        asked.append(1)
        return len(asked) >= 3

    run = lbr_simulate.simulate([str(workload)], get("type4").with_options(info=True), RATE, should_stop=interrupted)
    assert run.stopped == "an interrupt" and run.instructions == 8192 and len(run.records) > 0


def test_a_rep_string_instruction_is_one_instruction_and_no_branch(tmp_path: Path) -> None:
    prog = tmp_path / "rep_string"
    subprocess.run(["gcc", *CFLAGS, "-o", str(prog), str(ROOT / "tests/native/rep_string.c")], check=True,
                   capture_output=True)
    t = groundtruth.trace(str(prog))
    assert t.exit_status == 0  # the 4096 iterations ran
    rep = [a for a, code in t.insn_bytes.items() if code[:2] == b"\xf3\xaa"]  # rep stosb
    assert len(rep) == 1 and int(np.count_nonzero(t.rips == rep[0])) == 1 and len(t.rips) < 100
    assert groundtruth.branches(t).from_.size > 0  # the call into main and its return, nothing at the rep
