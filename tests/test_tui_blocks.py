"""The block view of `vmprof top` (issue 38), with Textual's pilot: on a replay of a simulated LBR
recording its instruction counts are the single-step ground truth and its times those of
`vmprof blocks`; `b` from a function row, Enter to a block's disassembly and chain, the one line
without LBR data, `--perf-script`, and the paper's worked example (Tables 6, 7 and 2)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from test_lbr_paper import TABLE7, paper_sample, synthetic_shor
from test_lbr_simulate import simulated, workload  # noqa: F401 - fixtures
from test_tui import cells, replay_path, until  # noqa: F401 - replay_path: a fixture
from textual.widgets import Static

from vmprof_tui.analyse.window import ReplayWindow
from vmprof_tui.cli import main
from vmprof_tui.cli.top import lbr_window
from vmprof_tui.lbr import groundtruth, perf_script
from vmprof_tui.lbr.blocks import analyse
from vmprof_tui.lbr.model import CALL_RETURN_USER, Fields, LbrSample, ResolvedAddr
from vmprof_tui.lbr.recording import samples_of_recording
from vmprof_tui.lbr.records import to_samples
from vmprof_tui.lbr.screen import BlockScreen, BlocksScreen, LbrViews
from vmprof_tui.lbr.source import NO_LBR, LbrSource, from_recording
from vmprof_tui.record.recording import load
from vmprof_tui.record.writer import Writer
from vmprof_tui.show.function_screen import FunctionScreen
from vmprof_tui.show.host_screen import HostScreen
from vmprof_tui.show.tui import VmprofTop

SIZE = (80, 24)


def run(app: VmprofTop, script) -> None:  # noqa: ANN001
    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await script(pilot)
    asyncio.run(go())


def drawn(app: VmprofTop, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def block_view(pilot, function: str) -> None:  # noqa: ANN001
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, BlocksScreen) and app.screen.data is not None
                and len(cells(app)) == len(app.screen.data.rows) > 0, timeout=15)


def blocks_json(rec: Path, function: str, capsys: pytest.CaptureFixture) -> dict:
    capsys.readouterr()
    assert main(["blocks", str(rec), "-f", function, "--format", "json", "--samples", "0"]) == 0
    return json.loads(capsys.readouterr().out)


def test_block_view_counts_are_the_ground_truth_and_times_those_of_blocks(
        simulated: Path, workload: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    window, src = lbr_window(str(simulated), None, 5.0, [], None)
    app = VmprofTop(window, 1.0, None, LbrViews(src), "pair")
    shown: dict[str, list[str]] = {}

    async def script(pilot) -> None:  # noqa: ANN001
        await block_view(pilot, "pair")
        shown.update({row[0]: row for row in cells(app)})
        assert "SIMULATED LBR" in drawn(app, "#notes")
    run(app, script)
    # the truth: the same program single-stepped again, the LBR at the recorded sample instants
    t = groundtruth.trace(str(workload))
    sim = groundtruth.LbrSimulator(t, groundtruth.branches(t), CALL_RETURN_USER, 16)
    points = np.cumsum([s.instructions for s in to_samples(load(simulated).lbr)]).tolist()
    _, truth = sim.samples(points, Fields.FROM | Fields.TO)
    want = blocks_json(simulated, "pair", capsys)["blocks"]
    assert len(shown) == len(want) >= 3
    for b in want:
        row = shown[f"{b['start']:x}-{b['end']:x}"]
        occurrences = [tb for tb in truth if (tb.start, tb.end) == (b["start"], b["end"])]
        assert b["exact"] and row[9].strip() == "exact"  # pair has no loop: every block exact
        assert all(tb.straight for tb in occurrences)
        assert [int(row[1]), int(row[2])] == [occurrences[0].instructions, len(occurrences)]
        assert {tb.instructions for tb in occurrences} == {b["ic"]}
        # the times: exactly what `vmprof blocks` computes, as the table rounds them
        assert [c.strip() for c in row[4:9]] == [f"{b['cycles'][k]:.1f}" for k in ("mean", "p50", "p90", "p99")] + [
            f"{b['lbr_cycles']['mean']:.1f}"]
        assert row[10].strip() == (f"{b['total_cycles']:.1f}" if b["total_cycles"] < 1000
                                   else f"{b['total_cycles']:.0f}")
    # sorted by total time
    totals = [b["total_cycles"] for b in want]
    assert [r[0] for r in shown.values()] == [f"{b['start']:x}-{b['end']:x}" for b in
                                              sorted(want, key=lambda b: -b["total_cycles"])]
    assert totals


def test_b_on_a_host_function_row_then_enter_shows_disassembly_and_chain(simulated: Path) -> None:  # noqa: F811
    window, src = lbr_window(str(simulated), None, 5.0, [], None)
    app = VmprofTop(window, 1.0, None, LbrViews(src))

    async def script(pilot) -> None:  # noqa: ANN001
        await until(pilot, lambda: any(r[0] == "(host)" for r in cells(app)))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, HostScreen) and any(r[-1] == "loopy" for r in cells(app)))
        table = app.screen.query_one("#table")
        table.move_cursor(row=[r[-1] for r in cells(app)].index("loopy"), animate=False)
        await pilot.press("b")
        await block_view(pilot, "loopy")
        rows = cells(app)
        assert all(r[9].strip() == "has branches" for r in rows)  # its loop: counted once through, marked
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, BlockScreen) and "LBR0" in drawn(app, "#block"))
        text = drawn(app, "#block")
        start, end = (int(x, 16) for x in rows[0][0].split("-"))
        marked = [int(line.split()[1], 16) for line in text.splitlines() if line.startswith("▶")]
        assert marked[0] == start and marked[-1] == end and len(marked) == int(rows[0][1])
        assert "◀ block starts at this target" in text and "◀ block ends at this source" in text
        assert "has branches" in text
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, BlocksScreen))
    run(app, script)


def test_b_without_lbr_data_says_so_in_one_line(simulated: Path, tmp_path: Path) -> None:  # noqa: F811
    rec = load(simulated)
    plain = tmp_path / "plain.vmprof"  # the same samples and maps, no branch records
    w = Writer(plain, {"backend": "test", "frequency": 1000})
    w.add(rec.samples, rec.sched)
    w.add_snapshot(rec.snapshot)
    w.close({"duration_s": 0.01, "lost": {"samples": [], "sched": []}, "vms": []})
    window, src = lbr_window(str(plain), None, 5.0, [], None)
    assert src is None
    app = VmprofTop(window, 1.0, None, LbrViews(src))

    async def script(pilot) -> None:  # noqa: ANN001
        await until(pilot, lambda: any(r[0] == "(host)" for r in cells(app)))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, HostScreen) and any(r[-1] == "pair" for r in cells(app)))
        await pilot.press("space")  # paused: no refresh puts "end of the recording" over the line
        await until(pilot, lambda: app.paused and not app._polling)
        await pilot.press("b")
        await until(pilot, lambda: app.message == NO_LBR)
        assert isinstance(app.screen, HostScreen) and "\n" not in NO_LBR
    run(app, script)


def test_perf_script_source_shows_the_same_blocks(simulated: Path, workload: Path, tmp_path: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture) -> None:
    samples = to_samples(load(simulated).lbr)
    text = tmp_path / "prog.txt"
    text.write_text(perf_script.to_text(samples))
    window, src = lbr_window(None, str(text), 5.0, [str(workload)], 3.3e9)  # --freq-mhz 3300: times in ns
    app = VmprofTop(window, 1.0, None, LbrViews(src), "pair")
    shown: list[list[str]] = []

    async def script(pilot) -> None:  # noqa: ANN001
        await block_view(pilot, "pair")
        shown.extend(cells(app))
        assert "ns = CPI x instr" in drawn(app, "#title")
    run(app, script)
    capsys.readouterr()
    assert main(["blocks", str(simulated), "-f", "pair", "--format", "json", "--samples", "0",
                 "--freq-mhz", "3300"]) == 0
    want = json.loads(capsys.readouterr().out)["blocks"]
    assert [(r[0], int(r[1]), int(r[2]), r[4].strip()) for r in shown] == [
        (f"{b['start']:x}-{b['end']:x}", b["ic"], b["count"], f"{b['ns']['mean']:.1f}") for b in want]


def paper_app(samples: list[LbrSample], resolve, read_code, function: str) -> VmprofTop:  # noqa: ANN001
    """The block view of samples given in memory, replayed as perf script data would be."""
    samples = [dataclasses.replace(s, time_ns=1_000_000_000 + i, pid=1, tid=1, comm="shor")
               for i, s in enumerate(samples)]
    rec = perf_script.as_recording(perf_script.PerfScriptData(samples), "paper")
    src = LbrSource(samples, resolve, "paper", None, read_code=read_code)
    return VmprofTop(ReplayWindow(Path("paper"), 5.0, rec), 1.0, None, LbrViews(src), function)


def test_paper_table6_in_the_block_view() -> None:
    resolve, read_code = synthetic_shor()
    app = paper_app([paper_sample()], resolve, read_code, "quantum_toffoli")
    cpi = 3513946 / 5614190

    async def script(pilot) -> None:  # noqa: ANN001
        await block_view(pilot, "quantum_toffoli")
        rows = cells(app)
        # Table 6's blocks in quantum_toffoli, each timed with the sample's measured CPI 0.626
        assert {r[3].strip() for r in rows} == {"0.626"}
        for r in rows:
            assert r[4].strip() == f"{cpi * int(r[1]):.1f}"
        assert "end before start 1" not in drawn(app, "#notes")  # that rejected block lies in quantum_exp_mod_n
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, BlockScreen) and "LBR11" in drawn(app, "#block"))
        chain = [line.split() for line in drawn(app, "#block").splitlines() if line.startswith("LBR")]
        # Table 7: the kinds and the functions of the chain
        assert [(p[1], p[2].split("+")[0], p[4].split("+")[0]) for p in chain] == TABLE7
    run(app, script)


def test_paper_table2_row_in_the_block_view() -> None:
    """Table 2's example row: CPI 0.81 x 38 instructions = 30.78 cycles."""
    code = b"\x90" * 37 + b"\xe8\x00\x00\x00\x00"

    def resolve(addr: int) -> ResolvedAddr | None:
        return ResolvedAddr("foo1.o", addr, "foo1", 0x2000, 0x2000 + len(code)) if 0x2000 <= addr < 0x2100 else None

    s = LbrSample(from_=[0x1000, 0x2025], to=[0x2000, 0x3000], cycles=81, instructions=100)
    app = paper_app([s], resolve, lambda p, v, n: code[v - 0x2000: v - 0x2000 + n], "foo1")

    async def script(pilot) -> None:  # noqa: ANN001
        await block_view(pilot, "foo1")
        assert [c.strip() for c in cells(app)[0][:5]] == ["2000-2025", "38", "1", "0.810", "30.8"]
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, BlockScreen) and "38 instructions" in drawn(app, "#block"))
        assert "CPI 0.810, mean 30.78 cycles" in drawn(app, "#block")
    run(app, script)



def test_demo_lbr_scenario_without_the_screen(capsys: pytest.CaptureFixture) -> None:
    """`vmprof demo --scenario lbr`: the demo program simulated; --no-tui prints what the block view shows."""
    assert main(["demo", "--scenario", "lbr", "--no-tui"]) == 0
    out = capsys.readouterr().out
    assert "simulated LBR:" in out and "SIMULATED LBR (no PMU): lbr_demo" in out
    assert "function hash_step" in out and "hash_step" in out.split("per block")[1]


def test_block_view_follows_the_window(simulated: Path) -> None:  # noqa: F811
    """As the replay's window moves, the rows are the blocks of the LBR samples inside it."""
    window, src = lbr_window(str(simulated), None, 5.0, [], None)
    span_s = (window.t_end - window.t0) / 1e9
    window.window_s, window.step_s = span_s / 4, span_s / 12
    app = VmprofTop(window, 0.3, None, LbrViews(src), "pair")
    seen: list[tuple[tuple[int, int], dict[str, int]]] = []

    async def still(pilot) -> None:  # noqa: ANN001
        await pilot.press("space")
        await until(pilot, lambda: app.paused and not app._polling)
        seen.append((app.analysis.span(), {r[0]: int(r[2]) for r in cells(app)}))
        await pilot.press("space")

    async def script(pilot) -> None:  # noqa: ANN001
        await block_view(pilot, "pair")
        await until(pilot, lambda: app.analysis.span()[1] > window.t0 + 3 * window.step_s * 1e9)
        await still(pilot)
        await until(pilot, lambda: app.analysis.span()[0] > seen[0][0][1])  # a window after the first
        await still(pilot)
    run(app, script)
    rec = load(simulated)
    samples, resolve, resolve_pid, _ = samples_of_recording(rec)
    for (lo, hi), shown in seen:
        inside = [s for s in samples if lo <= s.time_ns <= hi]
        want = {f"{b.start:x}-{b.end:x}": b.count for b in analyse(inside, resolve, resolve_pid=resolve_pid)
                .block_stats("pair")}
        assert shown == want and want
    assert seen[0][1] != seen[1][1] or seen[0][0] != seen[1][0]


def test_b_on_a_guest_function_row(replay_path: Path, simulated: Path) -> None:  # noqa: F811
    """`b` on a VM's function row: without LBR data one line; with LBR data whose samples are no VM's, the
    view says the host's LBR sees no guest branches here."""
    from test_tui import select

    VM, PROCESS = "twoprocs", "compute(1)"  # noqa: N806 - the demo's names in test_tui's recording
    def to_functions(app: VmprofTop):  # noqa: ANN202
        async def script(pilot) -> None:  # noqa: ANN001
            await until(pilot, lambda: any(r[0] == VM and r[1] not in ("0", "-") for r in cells(app)), timeout=15)
            await pilot.press("space")
            await select(pilot, app, VM)
            await pilot.press("enter")
            await until(pilot, lambda: cells(app) and cells(app)[0][0] == "vcpu0")
            await pilot.press("enter")
            await until(pilot, lambda: any(r[0] == PROCESS for r in cells(app)))
            await select(pilot, app, PROCESS)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, FunctionScreen) and
                        "compute_a" in [r[0] for r in cells(app)])
            await select(pilot, app, "compute_a")
            await until(pilot, lambda: not app._polling)
            await pilot.press("b")
        return script

    app = VmprofTop(ReplayWindow(replay_path, 5.0), 1.0, None, LbrViews(None))

    async def without(pilot) -> None:  # noqa: ANN001
        await to_functions(app)(pilot)
        await until(pilot, lambda: app.message == NO_LBR)
        assert isinstance(app.screen, FunctionScreen)
    run(app, without)
    lbr = from_recording(load(simulated))  # LBR samples of a host process: none is the VM's
    app = VmprofTop(ReplayWindow(replay_path, 5.0), 1.0, None, LbrViews(lbr))

    async def with_lbr(pilot) -> None:  # noqa: ANN001
        await to_functions(app)(pilot)
        await until(pilot, lambda: isinstance(app.screen, BlocksScreen) and app.screen.vm == VM)
        await until(pilot, lambda: f"no LBR sample of VM {VM}" in drawn(app, "#notes"))
        assert cells(app) == []
    run(app, with_lbr)


def test_top_blocks_without_lbr_data_is_bad_usage(capsys: pytest.CaptureFixture) -> None:
    assert main(["top", "--blocks", "pair"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--blocks needs LBR data" in err[0]
