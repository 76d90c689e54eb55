"""Import of `perf record -b` data through `perf script` text (issue 7).

The fixtures in tests/data/lbr/ are hand-written in the documented format (no PMU host
was available; see their README.md).  The round trip through real analysis of a traced
program is in test_lbr_groundtruth.py::test_perf_script_round_trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from vmprof_tui.cli.blocks import run_blocks_from_perf_script
from vmprof_tui.lbr.blocks import BlocksError
from vmprof_tui.lbr.model import BranchFilter, Fields
from vmprof_tui.lbr.perf_script import PerfScriptError, parse

DATA = ROOT / "tests/data/lbr"


def test_brstack_fixture_parses_exactly() -> None:
    d = parse((DATA / "perf_script_brstack.txt").read_text())
    assert len(d.samples) == 3
    assert d.events == {"cycles:u": 3, "instructions:u": 2}
    assert [(m.pid, m.start, m.length, m.pgoff, m.path) for m in d.mmaps] == [
        (5163, 0x400000, 0x8000, 0, "/nonexistent/shor")]
    a, b, c = d.samples
    # the paper's Table 6: LBR0 (oldest) .. LBR11 (newest), counters of the sample group
    assert (a.comm, a.pid, a.tid, a.cpu, a.ip) == ("shor", 5163, 5163, 0, 0x4026B3)
    assert a.time_ns == 81234_567890000
    assert (a.cycles, a.instructions) == (3513946, 5614190)
    assert a.cpi == pytest.approx(0.626, abs=5e-4)
    assert a.nr == 12
    assert (int(a.from_[0]), int(a.to[0])) == (0x4026CC, 0x406100)
    assert (int(a.from_[-1]), int(a.to[-1])) == (0x407140, 0x40265F)
    assert a.branch_types == ["CALL", "CALL", "RET", "RET", "RET", "CALL", "CALL", "CALL", "CALL", "RET", "CALL",
                              "RET"]
    assert a.lbr_cycles is None and a.fields == Fields.FROM | Fields.TO  # all cycle fields were 0
    # old six-field syntax, timed LBR, no instructions line
    assert (b.pid, b.tid, b.cpu, b.cycles, b.instructions, b.cpi) == (4321, 4322, 1, 100003, None, None)
    assert list(b.lbr_cycles) == [7, 40, 12]
    assert list(b.from_) == [0x401125, 0x40114B, 0x401160]
    # eight-field syntax: the not-taken entry is dropped
    assert d.skipped_not_taken == 1
    assert (c.nr, c.cycles, c.instructions) == (3, 100007, 150021)
    assert c.branch_types == ["CALL", "IND_CALL", "RET"]
    # only call/return types seen -> the call/return filter
    assert all(s.branch_filter == BranchFilter.CALL | BranchFilter.RETURN for s in d.samples)


def test_brstackinsn_listing() -> None:
    d = parse((DATA / "perf_script_brstackinsn.txt").read_text())
    assert len(d.samples) == 1
    s = d.samples[0]
    assert (s.cycles, s.instructions) == (200003, 260004)
    assert s.branch_filter == BranchFilter.ANY  # brstackinsn needs every branch recorded
    # the group member's repeated listing is not counted twice
    assert s.listed_insns == {(0x401120, 0x40112B): (6, "leaf"), (0x401136, 0x401141): (7, "leaf")}
    assert list(s.lbr_cycles) == [9, 4, 6]


def test_brstackinsn_counts_stand_in_for_missing_objects() -> None:
    doc = json.loads(run_blocks_from_perf_script(str(DATA / "perf_script_brstackinsn.txt"), "leaf", "json",
                                                 freq_hz=2e9, max_samples=None))
    rows = doc["samples"][0]["blocks"]
    assert [(r["start"], r["end"], r["instructions"], r["lbr_cycles"], r["status"], r["exact"]) for r in rows] == [
        (0x401120, 0x40112B, 6, 4, "ok", True), (0x401136, 0x401141, 7, 6, "ok", True)]
    cpi = 200003 / 260004
    assert rows[0]["cycles"] == cpi * 6 and rows[1]["ns"] == cpi * 7 / 2e9 * 1e9
    assert any("brstackinsn listing" in n for n in doc["notes"])


def test_paper_sample_without_object_is_unmapped_but_timed() -> None:
    """Table 6 imported: CPI 0.626 per sample; the object is not on disk, so every block is
    counted as unmapped (and said so), none is guessed."""
    doc = json.loads(run_blocks_from_perf_script(str(DATA / "perf_script_brstack.txt"), None, "json",
                                                 max_samples=None))
    s0 = doc["samples"][0]
    assert s0["cpi"] == pytest.approx(0.626, abs=5e-4)
    assert len(s0["blocks"]) == 11  # 12 entries delimit 11 blocks
    assert {b["status"] for b in s0["blocks"]} == {"unmapped"}
    assert doc["rejected"]["unmapped"] == doc["counts"]["blocks"] == 11 + 2 + 2
    assert doc["counts"]["unresolved_addresses"] > 0
    assert doc["samples"][1]["cpi"] is None
    assert [c["kind"] for c in s0["chain"]][:3] == ["call", "call", "ret"]  # from perf's TYPE column


def test_bad_inputs(tmp_path: Path) -> None:
    sym = tmp_path / "sym.txt"
    sym.write_text("  prog  1/1  [000] 1.000000:  1000 cycles:u:  401000 main+0x0 (/x)  main+0x10/leaf+0x0/P/-/-/0\n")
    with pytest.raises(PerfScriptError, match="brstacksym"):
        parse(sym.read_text())
    empty = tmp_path / "empty.txt"
    empty.write_text("  prog  1/1  [000] 1.000000:  1000 cycles:u:  401000 main+0x0 (/x)\n")
    with pytest.raises(BlocksError, match="no samples with branch records"):
        run_blocks_from_perf_script(str(empty), None)
    with pytest.raises(BlocksError, match="cannot read"):
        run_blocks_from_perf_script(str(tmp_path / "missing.txt"), None)
    bare = tmp_path / "bare.txt"
    bare.write_text("0x401000/0x401100/P/-/-/0\n")
    with pytest.raises(PerfScriptError, match="without the sample fields"):
        parse(bare.read_text())
