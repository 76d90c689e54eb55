"""Live LBR in `vmprof top` (issue 38): the collection session takes a ready-made LBR collector (issue 32), here the
simulated one, which single-steps a command and samples it poll by poll as a PMU host's collector would; the block
view follows the live window, and its instruction counts are the single-step ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require_root
from test_lbr_simulate import RATE, workload  # noqa: F401 - a fixture
from test_tui import cells, select, until
from test_tui_blocks import block_view, drawn, run

from vmprof_tui.analyse.window import LiveWindow
from vmprof_tui.cli import main
from vmprof_tui.collect.session import CollectionSession, SessionError
from vmprof_tui.lbr import groundtruth, simulate
from vmprof_tui.lbr.capability import detect
from vmprof_tui.lbr.collector import LbrCollector, LbrConfig
from vmprof_tui.lbr.live import LiveLbr
from vmprof_tui.lbr.model import CALL_RETURN_USER, Fields
from vmprof_tui.lbr.patterns import get
from vmprof_tui.lbr.recording import simulated_note
from vmprof_tui.lbr.screen import LbrViews
from vmprof_tui.lbr.simulated_collector import SimulatedCollector
from vmprof_tui.show.host_screen import HostScreen
from vmprof_tui.show.tui import VmprofTop

PATTERN = get("type4").with_options(info=True)
PERIOD = simulate.CLOCK_HZ // RATE


def test_simulated_collector_polled_gives_the_records_of_a_whole_run(workload: Path) -> None:  # noqa: F811
    """Sampled poll by poll while the command runs, the records are those `record --lbr=simulate` writes (but
    their times: the host's clock when the program got there, in order)."""
    sim = SimulatedCollector([str(workload)], PATTERN, PERIOD)
    sim.check()
    sim.start()
    parts = []
    while sim.running:  # a poll whenever the thread has not ended within 0.2 s: many polls, at arbitrary steps
        sim._thread.join(0.2)
        parts.append(sim.poll())
    parts.append(sim.poll())
    got = np.concatenate(parts)
    assert sum(len(p) > 0 for p in parts) > 3 and len(sim.host_samples()) == len(got)
    whole = simulate.simulate([str(workload)], PATTERN, RATE)
    want = whole.records
    assert len(got) == len(want) > 30
    times = got["hdr"]["time_ns"]
    assert np.all(np.diff(times.astype(np.int64)) >= 0) and np.all(times > 0)
    for name in ("time_ns", "pid", "tid"):  # another run of the program
        got["hdr"][name] = want["hdr"][name]
    assert got.tobytes() == want.tobytes()
    assert sim.meta()["instructions"] == whole.instructions and sim.stats()["samples"] == len(want)
    assert simulated_note({"lbr": sim.meta()}).startswith("SIMULATED LBR (no PMU): lbr_workload single-stepped")


def test_b_in_the_live_screen_shows_blocks_of_the_simulated_collector(workload: Path) -> None:  # noqa: F811
    """`vmprof top --lbr=simulate -- CMD`: the session (with the BPF sampler) polls the simulated collector; `b` on
    the host view's row of a function opens its blocks in the live window, counted as the single-step truth."""
    require_root()
    sim = SimulatedCollector([str(workload)], PATTERN, PERIOD)
    lbr = LiveLbr("SIMULATED LBR (single-step truth)", None, lambda: simulated_note({"lbr": sim.meta()}))
    window = LiveWindow(CollectionSession(1000, build_ids=False, lbr=sim), 120.0)
    window.lbr_sink = lbr.take
    app = VmprofTop(window, 0.5, None, LbrViews(lbr))
    shown: dict[str, list[str]] = {}

    async def script(pilot) -> None:  # noqa: ANN001
        await until(pilot, lambda: any(r[0] == "(host)" for r in cells(app)), timeout=60)
        await select(pilot, app, "(host)")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, HostScreen) and any(r[-1] == "pair" for r in cells(app)),
                    timeout=60)
        table = app.screen.query_one("#table")
        table.move_cursor(row=[r[-1] for r in cells(app)].index("pair"), animate=False)
        await pilot.press("b")
        await block_view(pilot, "pair")
        # the command has ended and every sample it gave is in the window (120 s) and on the screen: the poll
        # sets the screen's data before the table is drawn from it, so the table must show that data's rows
        def table_shows_every_sample() -> bool:
            data = app.screen.data
            if sim.running or data is None or not data.samples == sim.stats()["samples"] > 30:
                return False
            drawn_rows = {(r[0], int(r[2])) for r in cells(app)}
            return drawn_rows == {(f"{r.stat.start:x}-{r.stat.end:x}", r.stat.count) for r in data.rows} \
                and sum(n for _, n in drawn_rows) >= 30

        await until(pilot, table_shows_every_sample, timeout=120)
        shown.update({row[0]: row for row in cells(app)})
        assert "SIMULATED LBR (no PMU): lbr_workload" in drawn(app, "#notes")
    try:
        run(app, script)
    finally:
        window.close()
    # the truth: the same program single-stepped again, the LBR at the instants the live samples were taken
    t = groundtruth.trace(str(workload))
    truth_sim = groundtruth.LbrSimulator(t, groundtruth.branches(t), CALL_RETURN_USER, 16)
    points = np.cumsum([s.instructions for s in lbr.samples]).tolist()
    _, truth = truth_sim.samples(points, Fields.FROM | Fields.TO)
    assert len(shown) >= 3
    for key, row in shown.items():
        start, end = (int(x, 16) for x in key.split("-"))
        occurrences = [tb for tb in truth if (tb.start, tb.end) == (start, end)]
        assert occurrences and all(tb.straight for tb in occurrences)
        assert [int(row[1]), int(row[2])] == [occurrences[0].instructions, len(occurrences)]
        assert row[9].strip() == "exact"


def test_top_lbr_simulate_without_a_command_is_bad_usage(capsys) -> None:  # noqa: ANN001
    assert main(["top", "--lbr=simulate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lbr=simulate needs a command" in err[0]


def test_the_session_takes_the_hardware_collector_alike() -> None:
    """The hardware collector goes through the same session door: without a PMU the session refuses it in one line
    before loading anything (the probe's line); with one, its records come in the session's chunks."""
    require_root()
    caps = detect(PATTERN.branch_filter)
    collector = LbrCollector(LbrConfig(PATTERN, period=1_000_003))
    if not caps.ok:
        with pytest.raises(SessionError) as e:
            CollectionSession(100, lbr=collector)
        assert str(e.value) == f"--lbr: {caps.message}" and "\n" not in str(e.value)
        return
    session = CollectionSession(100, lbr=collector)  # PMU hosts only (never run on the development machines)
    session.start()
    x = 0
    for i in range(3_000_000):
        x += i
    chunk, _lost = session.finish()  # and closes it
    assert chunk.lbr is not None and len(chunk.lbr) > 0 and session.meta()["lbr"]["pattern"] == "type4"
