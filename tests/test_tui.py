"""`vmprof top` with Textual's pilot, on a replayed recording and on live demo VMs (issue 6)."""

from __future__ import annotations

import asyncio
import html
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, record_scenario
from textual.widgets import DataTable

from vmprof_tui.analyse.window import LiveWindow, ReplayWindow
from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.demo import runner
from vmprof_tui.show.dialogs import HelpScreen
from vmprof_tui.show.host_screen import HostScreen
from vmprof_tui.show.screen import TableScreen
from vmprof_tui.show.timeline_screen import TimelineScreen
from vmprof_tui.show.tui import VmprofTop


@pytest.fixture(scope="module")
def replay_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_scenario(tmp_path_factory.mktemp("tui"), "two-procs", 3.0).rec.path


def cells(app: VmprofTop) -> list[list[str]]:
    table = app.screen.query_one(DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def select(pilot, app: VmprofTop, text: str) -> None:  # noqa: ANN001
    table = app.screen.query_one(DataTable)
    for i in range(table.row_count):
        if str(table.get_row_at(i)[0]) == text:  # the row's name (other cells may repeat it)
            table.move_cursor(row=i, animate=False)
            await until(pilot, lambda: str(table.get_row_at(table.cursor_row)[0]) == text)
            return
    raise AssertionError(f"{text} not on screen: {cells(app)}")


async def until(pilot, check, timeout: float = 5.0) -> None:  # noqa: ANN001
    """Wait for the screen to show something (a loaded CI machine can be slow to refresh)."""
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        await pilot.pause(0.1)
    assert check(), (type(pilot.app.screen).__name__, cells(pilot.app))


async def drive(app: VmprofTop, vm: str, process: str) -> None:
    async with app.run_test(size=(160, 40)) as pilot:
        # the VM is listed, and its vCPU has run within the window (a replay starts before the VMs do)
        await until(pilot, lambda: any(r[0] == vm and r[1] not in ("0", "-") for r in cells(app)), timeout=15)
        assert any(r[0] == "(host)" for r in cells(app))
        # navigate on a still picture (paused: the tables are not rebuilt under the keys)
        await pilot.press("space")
        assert app.paused
        await select(pilot, app, vm)
        await pilot.press("enter")  # VM -> vCPUs
        await until(pilot, lambda: cells(app) and cells(app)[0][0] == "vcpu0")
        await pilot.press("enter")  # vCPU -> processes
        await until(pilot, lambda: any(r[0] == process for r in cells(app)))
        await select(pilot, app, process)
        await pilot.press("enter")  # process -> functions
        await until(pilot, lambda: "compute_a" in [r[0] for r in cells(app)])
        functions = [r[0] for r in cells(app)]
        assert "compute_a" in functions and "compute_b" in functions, functions
        for _ in range(3):
            await pilot.press("escape")
        await until(pilot, lambda: any(r[0] == vm for r in cells(app)))
        # filter, sort, pause, help
        await pilot.press("slash")
        await pilot.pause(0.2)
        for ch in "host":
            await pilot.press(ch)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert [r[0] for r in cells(app)] == ["(host)"]
        # the host view, drawn: names in brackets are shown as they are (not taken for markup)
        await pilot.press("enter")
        await until(pilot, lambda: any(r[3] == "[kernel.kallsyms]" for r in cells(app)))
        assert "[kernel.kallsyms]" in app.export_screenshot()
        await pilot.press("escape")
        await until(pilot, lambda: [r[0] for r in cells(app)] == ["(host)"])
        await pilot.press("slash")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert len(cells(app)) >= 2
        before = app.screen.sort_column
        await pilot.press("o")
        assert app.screen.sort_column == before + 1
        await pilot.press("space")
        assert not app.paused
        await pilot.press("space")
        assert app.paused
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause(0.2)
        # steal detail and timeline of the VM
        await select(pilot, app, vm)
        await pilot.press("s")
        await until(pilot, lambda: any(r[1] in ("type 1", "type 2", "idle") for r in cells(app)))
        await pilot.press("escape")
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen)
                    and "vcpu0" in str(app.screen.query_one("#timeline").render()))
        await pilot.press("escape")
        await pilot.press("q")


def test_replay_screens(replay_path: Path) -> None:
    asyncio.run(drive(VmprofTop(ReplayWindow(replay_path), refresh_s=0.5), "twoprocs", "compute(1)"))


def test_long_tables_hold_the_first_rows(replay_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table holds the first max_rows rows by the sort (a 64-CPU host view has ~65,000), and says so."""
    monkeypatch.setattr(TableScreen, "max_rows", 5)

    async def run() -> None:
        app = VmprofTop(ReplayWindow(replay_path), refresh_s=0.5)
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: any(r[0] == "(host)" for r in cells(app)), timeout=15)
            await pilot.press("space")
            await select(pilot, app, "(host)")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, HostScreen) and len(cells(app)) == 5)
            shown = [float(r[0].replace(",", "")) for r in cells(app)]  # samples: the 5 largest, in order
            assert shown == sorted(shown, reverse=True)
            assert "first 5 of" in str(app.screen.query_one("#status").render())
            await pilot.press("q")

    asyncio.run(run())


def test_live_screens() -> None:
    os.sched_setaffinity(0, {0})
    with runner.DemoRun(runner.scenario_specs("alone"), duration_s=30):
        session = LiveWindow(CollectionSession(1000, build_ids=False), 10.0)
        session.start()
        try:
            asyncio.run(drive(VmprofTop(session, refresh_s=0.5), "alone", "compute"))
        finally:
            session.close()


def test_demo_in_tmux(artifacts: Path) -> None:
    """The README's main command, in a real terminal: the screen shows the demo VM and a guest function."""
    tmux = shutil.which("tmux")
    assert tmux, "tmux is installed by tools/bootstrap.sh"
    session = f"vmprof-test-{os.getpid()}"
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "40",
                    f"cd {ROOT} && env -u COLUMNS -u LINES .venv/bin/vmprof demo --scenario two-procs"], check=True)
    subprocess.run([tmux, "resize-window", "-t", session, "-x", "160", "-y", "40"], capture_output=True)
    try:
        screen = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(1)
            screen = subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
            if "twoprocs" in screen and "compute_a" in screen:
                break
        (artifacts / "vmprof-demo-screen.txt").write_text(screen)
        assert "twoprocs" in screen and "compute_a" in screen, screen
        subprocess.run([tmux, "send-keys", "-t", session, "q"], check=True)
        time.sleep(3)
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)


def test_svg_screenshot(replay_path: Path, artifacts: Path) -> None:
    async def shot() -> None:
        app = VmprofTop(ReplayWindow(replay_path), refresh_s=0.5)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(1.5)
            app.save_screenshot(filename="vmprof-top.svg", path=str(artifacts))
            await pilot.press("q")

    asyncio.run(shot())
    svg = (artifacts / "vmprof-top.svg").read_text()
    assert "twoprocs" in svg.replace("&#160;", " ")


def test_screens_of_a_new_user() -> None:
    """Issue 16 on the stored recording of three VMs: the host view tells its [unknown] rows apart, drill-down
    screens sort by samples, s and t work from every screen of a VM, rows of 0 samples are not listed, and the
    overview plots the selected VM's user, steal and idle."""
    from vmprof_tui.show.overview_screen import OverviewScreen
    from vmprof_tui.show.process_screen import ProcessScreen
    from vmprof_tui.show.steal_screen import StealScreen

    app = VmprofTop(ReplayWindow(ROOT / "tests" / "data" / "golden" / "steal3.vmprof", window_s=1.0), refresh_s=0.3)

    async def go() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: len(app.usage.get("steal1", ())) >= 3, timeout=15)
            await pilot.press("space")
            await select(pilot, app, "steal2")
            await pilot.pause(0.3)
            shot = app.export_screenshot().replace("&#160;", " ")
            Path(ROOT / "test-artifacts").mkdir(exist_ok=True)
            (ROOT / "test-artifacts" / "top-plot.svg").write_text(app.export_screenshot())
            assert "VM steal2: the last" in shot and "steal %" in shot, "the plot of the selected VM"
            # host view: process and module columns tell the [unknown] rows apart
            await select(pilot, app, "(host)")
            await pilot.press("enter")
            await until(pilot, lambda: app.screen.columns[:3] == ("samples", "%", "process"))
            rows = cells(app)
            unknown = [(r[2], r[3]) for r in rows if r[4] == "[unknown]"]
            assert len(unknown) >= 3 and len(set(unknown)) == len(unknown), unknown
            samples = [int(r[0]) for r in rows]
            assert samples == sorted(samples, reverse=True) and min(samples) > 0
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, OverviewScreen))
            # a VM's screens: processes sorted by samples, no 0-sample rows, s and t everywhere
            await select(pilot, app, "steal1")
            await pilot.press("enter")
            await until(pilot, lambda: cells(app) and cells(app)[0][0] == "vcpu0")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProcessScreen) and cells(app))
            counts = [int(r[2]) for r in cells(app)]
            assert counts == sorted(counts, reverse=True) and min(counts) > 0, cells(app)
            for key, screen in (("s", StealScreen), ("t", TimelineScreen)):
                await pilot.press(key)
                await until(pilot, lambda screen=screen: isinstance(app.screen, screen))
                await pilot.press("escape")
                await until(pilot, lambda: isinstance(app.screen, ProcessScreen))
            await select(pilot, app, "compute")
            await pilot.press("enter")
            await until(pilot, lambda: "compute_a" in [r[0] for r in cells(app)])
            await pilot.press("t")
            await until(pilot, lambda: isinstance(app.screen, TimelineScreen))
            await pilot.press("s")  # from the timeline too
            await until(pilot, lambda: isinstance(app.screen, StealScreen))
            seconds = [float(r[3]) for r in cells(app)]
            assert seconds == sorted(seconds, reverse=True)
            await pilot.press("q")

    asyncio.run(go())


def test_live_table_draws_what_it_holds() -> None:
    """The kept renders of LiveTable are those of DataTable, a changed value is drawn anew, and rows removed
    together leave the table as rows removed one by one do."""
    from rich.text import Text
    from textual.app import App

    from vmprof_tui.show.live_table import LiveTable

    class Two(App):
        def compose(self):  # noqa: ANN202
            yield LiveTable(id="live", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="plain", cursor_type="row", zebra_stripes=True)

    def lines(table: DataTable) -> list[str]:
        return [table.render_line(y).text for y in range(table.row_count + 1)]

    async def main() -> None:
        app = Two()
        async with app.run_test(size=(80, 20)) as pilot:
            tables = [app.query_one("#live", DataTable), app.query_one("#plain", DataTable)]
            for t in tables:
                t.add_columns("name", "samples")
                for i in range(5):
                    t.add_row(Text(f"f{i}"), Text(str(i * 10), justify="right"), key=f"f{i}")
            await pilot.pause()
            assert lines(tables[0]) == lines(tables[1])
            for t in tables:
                t.update_cell("f2", t.ordered_columns[1].key, Text("12345", justify="right"))
            await pilot.pause()
            assert lines(tables[0]) == lines(tables[1])
            assert any("12345" in line for line in lines(tables[0]))
            # rows removed in one pass leave what removing them one by one leaves
            tables[0].remove_rows(["f1", "f3"])
            for key in ("f1", "f3"):
                tables[1].remove_row(key)
            for t in tables:
                t.add_row(Text("f9"), Text("90", justify="right"), key="f9")
            await pilot.pause()
            assert lines(tables[0]) == lines(tables[1]) and tables[0].row_count == 4
            assert [tables[0].get_row_index(k) for k in ("f0", "f2", "f4", "f9")] == [0, 1, 2, 3]

    asyncio.run(main())


def test_overview_summary_agrees_with_the_guest_profile() -> None:
    """The overview and the VM screen read the host and each VM (and vCPU) from Analysis.host_summary and
    guest_summary (no rows built); they must say what the profiles say: shares, steal of each type, the top
    process and the top resolved function."""
    from vmprof_tui.analyse.analysis import analyse
    from vmprof_tui.analyse.kinds import RowKind
    from vmprof_tui.record import recording

    an = analyse(recording.load(ROOT / "tests" / "data" / "golden" / "steal3.vmprof"))
    host, h = an.host_profile(), an.host_summary()
    assert (h.ratios, h.total_samples, h.lost_samples) == (host.ratios, host.total_samples, host.lost_samples)
    top = max((r for r in host.rows if r.kind is RowKind.FUNCTION), key=lambda r: r.samples)
    assert (h.top_process, h.top_function) == (top.process, top.function)
    for vm, vcpu in [(vm, None) for vm in an.vm_names()] + [(tl.vm, tl.vcpu) for tl in an.timelines.values()]:
        p = an.guest_profile(vm, vcpu)
        s = an.guest_summary(vm, vcpu)
        assert s.ratios == p.ratios and s.total_samples == p.total_samples
        for t, got in ((1, s.steal1), (2, s.steal2)):
            assert got == pytest.approx(sum(r.samples for r in p.rows if r.kind.steal_type == t))
        funcs = [r for r in p.rows if r.kind is RowKind.FUNCTION]
        by_proc: dict[str, float] = {}
        for r in funcs:
            by_proc[r.process or "?"] = by_proc.get(r.process or "?", 0) + r.samples
        assert s.top_function == max(funcs, key=lambda r: r.samples).function
        assert s.top_process == max(by_proc, key=by_proc.__getitem__)


def test_a_window_polled_for_detail_sums_the_same() -> None:
    """While the steal or timeline screen is shown, each chunk is analysed in full once and summarised from that
    analysis: the summaries and rows are the same as from the shares-only analysis, and the detail is kept."""
    golden = ROOT / "tests" / "data" / "golden" / "steal3.vmprof"
    plain, detailed = ReplayWindow(golden, window_s=2.0), ReplayWindow(golden, window_s=2.0)
    plain.start()
    detailed.start()
    while not plain.at_end:
        a, b = plain.poll(step_s=0.7), detailed.poll(step_s=0.7, detail=True)
        assert all(c._detail is not None for c in detailed.chunks.chunks)
        assert a.host_summary() == b.host_summary() and a.host_rows(None) == b.host_rows(None)
        for vm in a.vm_names():
            for vcpu in [None, *(v for v, _tid in a.vcpu_threads(vm))]:
                assert a.guest_summary(vm, vcpu) == b.guest_summary(vm, vcpu)
                assert a.guest_rows(vm, vcpu) == b.guest_rows(vm, vcpu)

@pytest.mark.parametrize("step_s", [1.0, 0.7])
def test_overview_of_a_sliding_window_adds_up_its_chunks(step_s: float) -> None:
    """The live overview sums the summaries of the window's chunks (each analysed once, with the switches before
    it) instead of analysing the whole window each refresh.  On one span the sum is the whole analysis exactly;
    over a sliding window of whole chunks it agrees with the window's whole Analysis to a fraction of a percentage
    point (each chunk prices a vCPU's blank time at that chunk's sampling rate) and names the same top names."""
    from vmprof_tui.analyse.analysis import analyse
    from vmprof_tui.analyse.kinds import RowKind
    from vmprof_tui.analyse.segments import SegmentKind, vcpu_segments
    from vmprof_tui.analyse.shares import WindowSummary
    from vmprof_tui.analyse.steal import vcpu_steal
    from vmprof_tui.record import recording

    golden = ROOT / "tests" / "data" / "golden" / "steal3.vmprof"
    an = analyse(recording.load(golden))
    one = WindowSummary([an.span_summary()], an.rec.lost_samples)
    assert one.host_summary() == an.host_summary()
    for vm in an.vm_names():
        assert one.vcpu_threads(vm) == an.vcpu_threads(vm)
        for vcpu in [None, *(v for v, _tid in an.vcpu_threads(vm))]:
            got, want = one.guest_summary(vm, vcpu), an.guest_summary(vm, vcpu)
            assert got.ratios == pytest.approx(want.ratios, abs=1e-9)
            assert (got.top_process, got.top_function) == (want.top_process, want.top_function)
            assert got.steal1 == pytest.approx(want.steal1) and got.steal2 == pytest.approx(want.steal2)

    window = ReplayWindow(golden, window_s=2.0)
    window.start()
    while not window.at_end:
        view = window.poll(step_s=step_s)
        whole = view.analysis  # the window's Analysis, as the other screens see it
        assert view.vm_names() == whole.vm_names() and view.span() == whole.span()
        pairs = [(view.host_summary(), whole.host_summary())] + [
            (view.guest_summary(vm, vcpu), whole.guest_summary(vm, vcpu))
            for vm in whole.vm_names() for vcpu in [None, *(v for v, _tid in whole.vcpu_threads(vm))]]
        rows, count = view.host_rows(10**6)  # the host view's rows, sorted by samples
        want_rows = whole.host_profile().shown_rows
        assert count == len(rows) == len(want_rows)
        assert [r.samples for r in rows] == sorted((r.samples for r in want_rows), reverse=True)
        assert {(r.function, r.module, r.process, r.pid, r.kind): pytest.approx(r.samples) for r in rows} == {
            (r.function, r.module, r.process, r.pid, r.kind): r.samples for r in want_rows}
        assert view.host_rows(5) == (rows[:5], count)
        for vm in whole.vm_names():  # the processes and functions screens' rows
            for vcpu in [None, *(v for v, _tid in whole.vcpu_threads(vm))]:
                got_rows = {(r.function, r.module, r.process, r.pid, r.kind): r.samples
                            for r in view.guest_rows(vm, vcpu)}
                want_rows = {(r.function, r.module, r.process, r.pid, r.kind): r.samples
                             for r in whole.guest_profile(vm, vcpu).shown_rows}
                functions = {k: n for k, n in want_rows.items() if k[-1] in (RowKind.FUNCTION, RowKind.UNKNOWN)}
                assert {k: n for k, n in got_rows.items() if k in functions} == functions  # counted: exact
                total = whole.guest_profile(vm, vcpu).total_samples
                for k in set(got_rows) | set(want_rows):  # virtual: each chunk at its own sampling rate
                    assert got_rows.get(k, 0.0) == pytest.approx(want_rows.get(k, 0.0), abs=0.003 * total + 1)
        for vm in whole.vm_names():  # the steal screen: each chunk's detail, summed
            for got_v, want_v in zip(view.vcpu_steal(vm), vcpu_steal(whole, vm), strict=True):
                assert (got_v["vcpu"], got_v["tid"]) == (want_v["vcpu"], want_v["tid"])
                # a vCPU on a CPU as a chunk ends is counted to its last record there (a sample period at most)
                assert got_v["wall_s"] == pytest.approx(want_v["wall_s"], rel=0.003)
                tol = 0.005 * want_v["wall_s"]
                for key in ("idle_s", "steal_type1_s", "steal_type2_s", "skew_s", "halt_poll_s"):
                    assert got_v[key] == pytest.approx(want_v[key], abs=tol), key
                for key in ("type1_by_cause_s", "type1_by_holder_s", "type2_by_exit_s"):
                    for name in set(got_v[key]) | set(want_v[key]):
                        assert got_v[key].get(name, 0.0) == pytest.approx(want_v[key].get(name, 0.0), abs=tol), name
                assert got_v["ratios"] == pytest.approx(want_v["ratios"], abs=0.5)
        for vm in whole.vm_names():  # the timeline screen: each chunk's segments, one after the other
            got_segments = view.vcpu_segments(vm)
            assert sorted(got_segments) == sorted(tl.vcpu for tl in whole.vm_timelines(vm))
            for tl in whole.vm_timelines(vm):
                want_segments = vcpu_segments(whole, tl)
                for kind in SegmentKind:
                    got_ns, want_ns = (sum(g.end_ns - g.start_ns for g in segs if g.kind is kind)
                                       for segs in (got_segments[tl.vcpu], want_segments))
                    assert got_ns == pytest.approx(want_ns, abs=0.005 * tl.wall_ns), kind
        for got, want in pairs:
            assert got.ratios == pytest.approx(want.ratios, abs=0.3)
            assert got.total_samples == pytest.approx(want.total_samples, rel=0.01)
            assert (got.top_process, got.top_function) == (want.top_process, want.top_function)


def test_timeline_tells_steal_wakeup_wait_and_throttled_apart() -> None:
    """Issue 36.15: the timeline drew steal, wake-up wait and throttled with one glyph (▒) and, in Textual's
    256-colour output, one colour (38;5;197); each now has its own glyph and colour, and the legend says which."""
    from rich.color import ColorSystem
    from rich.style import Style

    app = VmprofTop(ReplayWindow(ROOT / "tests" / "data" / "golden" / "steal3.vmprof", window_s=1.0), refresh_s=0.3)

    async def go() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, lambda: any(r[0] == "steal1" and r[1] not in ("0", "-") for r in cells(app)),
                        timeout=15)
            await pilot.press("space")
            await select(pilot, app, "steal1")
            await pilot.press("t")
            await until(pilot, lambda: isinstance(app.screen, TimelineScreen)
                        and "vcpu0" in str(app.screen.query_one("#timeline").render()))
            text = app.screen.draw(app.analysis)
            await pilot.press("q")
        plain = text.plain

        def style_at(i: int) -> Style:
            return Style.combine(Style.parse(str(s.style)) for s in text.spans if s.start <= i < s.end)

        shown = {}
        for label in ("steal", "wake-up wait", "throttled", "guest", "VMM", "idle"):
            at = plain.index(f" {label}  ") - 1  # the legend: two glyphs, then the label
            shown[label] = (plain[at], style_at(at).color)
        kinds = [shown[k] for k in ("steal", "wake-up wait", "throttled")]
        assert len({glyph for glyph, _c in shown.values()}) == len(shown), shown
        assert len({c.downgrade(ColorSystem.EIGHT_BIT).number for _g, c in kinds}) == 3, kinds
        strips = [line for line in plain.splitlines() if line.startswith("vcpu")]
        steal_glyph = shown["steal"][0]
        assert strips and steal_glyph in strips[0], "steal3's vCPUs are preempted: the strip shows steal"
        first = plain.index(strips[0]) + strips[0].index(steal_glyph)
        assert style_at(first).color == shown["steal"][1], "the strip uses the legend's colour"

    asyncio.run(go())


def test_host_view_at_80x24_gives_the_function_column_its_width() -> None:
    """Issue 36.16: at 80x24 the host view's module (and process) column, sized to its longest name, pushed
    the function column off the screen; now process and module names are cut first."""
    from vmprof_tui.show.screen import SCROLLBAR

    app = VmprofTop(ReplayWindow(ROOT / "tests" / "data" / "golden" / "lbr.vmprof", window_s=1.0), refresh_s=0.3)

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: any(r[0] == "(host)" for r in cells(app)), timeout=15)
            await pilot.press("space")
            await select(pilot, app, "(host)")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, HostScreen) and len(cells(app)) > 5)
            await pilot.pause(0.3)
            table = app.screen.query_one(DataTable)
            widths = {c.label.plain: c.get_render_width(table) for c in table.columns.values()}
            assert sum(widths.values()) <= 80 - SCROLLBAR, widths
            assert widths["function"] >= 80 // 3, widths
            assert table.virtual_size.width <= 80, "nothing to scroll sideways to"
            functions = [r[4] for r in cells(app)]
            assert any(f.startswith("clang::") and len(f) > 20 for f in functions), functions
            shot = app.export_screenshot().replace("&#160;", " ")
            assert "clang::ASTContext::getDec" in shot, "the function is on the screen"
            await pilot.press("slash")  # the filter reads whole names, not the cut cells
            await pilot.press(*"getDeclAttrs", "enter")
            await until(pilot, lambda: len(cells(app)) == 1 and cells(app)[0][4].startswith("clang::ASTContext"))
            await pilot.press("q")

    asyncio.run(go())


def _flipped(tmp: Path, name: str, which: slice) -> Path:
    """steal3.vmprof with one byte flipped in the middle of each chunk in `which` (chunk 0 is the metadata)."""
    from vmprof_tui.record import recording

    data = bytearray((ROOT / "tests" / "data" / "golden" / "steal3.vmprof").read_bytes())
    pos, starts = len(recording.MAGIC) + 2, []
    while pos < len(data):
        starts.append(pos)
        pos += recording.CHUNK_HEADER.size + recording.CHUNK_HEADER.unpack_from(data, pos)[3]
    for start in starts[which]:
        length = recording.CHUNK_HEADER.unpack_from(data, start)[3]
        data[start + recording.CHUNK_HEADER.size + length // 2] ^= 0x40
    path = tmp / name
    path.write_bytes(bytes(data))
    return path


def test_replay_of_a_corrupt_recording_names_the_skipped_chunks(tmp_path: Path) -> None:
    """`top --replay` of a bit-flipped recording says on its status line how many chunks were skipped; one with
    nothing readable but its metadata says so instead of "no VM on this host — try vmprof demo", and `steal` and
    `report --vm` name the corruption instead of "has no VM"."""
    from conftest import vmprof

    some = _flipped(tmp_path, "some.vmprof", slice(3, 16, 4))
    app = VmprofTop(ReplayWindow(some, window_s=1.0), refresh_s=0.3)

    async def status_of(app: VmprofTop) -> str:
        async with app.run_test(size=(200, 40)) as pilot:
            await until(pilot, lambda: "sort:" in str(app.screen.query_one("#status").render()), timeout=15)
            text = str(app.screen.query_one("#status").render())
            await pilot.press("q")
            return text

    status = asyncio.run(status_of(app))
    assert "corrupt recording some.vmprof: 4 damaged chunks (" in status and "skipped" in status, status
    nothing = _flipped(tmp_path, "nothing.vmprof", slice(1, None))
    status = asyncio.run(status_of(VmprofTop(ReplayWindow(nothing, window_s=1.0), refresh_s=0.3)))
    assert "corrupt recording nothing.vmprof" in status and "no readable VM in this recording" in status, status
    assert "vmprof demo" not in status
    for args in (("steal", str(nothing)), ("report", str(nothing), "--level", "guest")):
        out = vmprof(*args)
        assert out.returncode == 1, out.stderr
        assert out.stderr.startswith(f"vmprof: {nothing} has no readable VM: corrupt recording nothing.vmprof: ")
        assert "damaged chunks" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def _top_in_a_terminal(*args: str) -> tuple[subprocess.Popen, int]:
    """`vmprof top ARGS` on a pseudo-terminal of 120x40, returned once it has drawn its status line."""
    import fcntl
    import pty
    import select as sel
    import struct
    import sys
    import termios

    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "top", *args], cwd=ROOT, stdin=side, stdout=side,
                            stderr=side, start_new_session=True, env={**os.environ, "TERM": "xterm-256color"})
    os.close(side)
    seen, deadline = b"", time.monotonic() + 60
    while b"sort:" not in seen and time.monotonic() < deadline:
        if sel.select([main], [], [], 1.0)[0]:
            seen += os.read(main, 65536)
    assert b"sort:" in seen, seen[-2000:]
    return proc, main


def _ends(proc: subprocess.Popen, main: int, timeout: float = 20) -> bool:
    """Whether the process ends in time (the terminal's output is read meanwhile, so it never blocks)."""
    import select as sel

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if sel.select([main], [], [], 0.2)[0]:
            try:
                os.read(main, 65536)
            except OSError:
                break
    try:
        proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    finally:
        os.close(main)
    return True


@pytest.mark.parametrize("refresh", ["-1", "0", "nan", "0.1", "11"])
def test_top_refuses_a_refresh_outside_what_the_screen_allows(refresh: str) -> None:
    """--refresh -1 spun the screen at 97% CPU, deaf to q and SIGTERM; 0 froze it: refused with one line, exit 2."""
    from conftest import vmprof

    out = vmprof("top", "--replay", str(ROOT / "tests" / "data" / "golden" / "steal3.vmprof"), "--refresh", refresh)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"vmprof top: --refresh takes seconds from 0.25 to 10, not {float(refresh):g}"], out.stderr


@pytest.mark.parametrize("refresh", ["0.25", "10"])
def test_q_and_sigterm_end_top_at_any_refresh_it_accepts(refresh: str) -> None:
    """At the fastest and the slowest refresh: q ends the screen, and so does SIGTERM."""
    import signal

    golden = str(ROOT / "tests" / "data" / "golden" / "steal3.vmprof")
    proc, main = _top_in_a_terminal("--replay", golden, "--refresh", refresh, "--window", "1")
    os.write(main, b"q")
    assert _ends(proc, main) and proc.returncode == 0
    proc, main = _top_in_a_terminal("--replay", golden, "--refresh", refresh, "--window", "1")
    proc.send_signal(signal.SIGTERM)
    assert _ends(proc, main), "SIGTERM did not end top"


@pytest.mark.parametrize("size", [(40, 10), (80, 24), (160, 50)])
def test_overview_shows_the_vm_table_in_a_small_terminal(size: tuple[int, int]) -> None:
    """In a 40x10 terminal the overview showed only the plot: the VM table now keeps the room (the plot shows
    from 26 rows up)."""
    from vmprof_tui.show.overview_screen import OverviewScreen

    app = VmprofTop(ReplayWindow(ROOT / "tests" / "data" / "golden" / "steal3.vmprof", window_s=1.0), refresh_s=0.3)

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: len(cells(app)) == 4, timeout=15)  # (host) and three VMs

            def shown() -> bool:  # drawn on the screen, not only in the table's data (a refresh can lag)
                shot = app.export_screenshot().replace("&#160;", " ")
                return "(host)" in shot and "steal1" in shot

            await until(pilot, shown, timeout=15)
            table = app.screen.query_one(DataTable)
            assert isinstance(app.screen, OverviewScreen)
            assert table.region.height >= 3, f"the VM table has {table.region.height} rows on screen"
            assert app.screen.query_one("#plot").display == (size[1] >= OverviewScreen.PLOT_FROM_HEIGHT)
            await pilot.press("q")

    asyncio.run(go())


def test_screens_read_a_declared_interface_of_the_window_and_of_a_recording() -> None:
    """show/ reads a span through source.ProfileSource: the live window's view implements it (nothing forwarded
    to its Analysis) and so does a recording's analysis (RecordingSource), with the same rows; both windows are
    a source.Window, which VmprofTop reads without probing."""
    from vmprof_tui.analyse.analysis import analyse
    from vmprof_tui.analyse.source import ProfileSource, RecordingSource, Window
    from vmprof_tui.analyse.window import WindowView
    from vmprof_tui.record import recording

    golden = ROOT / "tests" / "data" / "golden" / "steal3.vmprof"
    assert "__getattr__" not in vars(WindowView)
    window = ReplayWindow(golden, window_s=100.0)
    window.start()
    view = window.poll(step_s=100.0)
    whole = RecordingSource(analyse(recording.load(golden)))
    assert isinstance(view, ProfileSource) and isinstance(whole, ProfileSource)
    assert all(hasattr(window, name) for name in Window.__annotations__)
    assert all(hasattr(LiveWindow, name) for name in ("live", "started", "damage", "at_end"))  # the rest: __init__
    assert view.vm_names() == whole.vm_names()
    vm = whole.vm_names()[0]
    assert len(view.vcpu_steal(vm)) == len(whole.vcpu_steal(vm))
    assert sorted(view.vcpu_segments(vm)) == sorted(whole.vcpu_segments(vm))
    assert view.call_paths(vm) is None and whole.call_paths(vm) is None  # recorded without -g


def _strip_one_segment_at_a_time(screen: TimelineScreen, segments: list, w0: int, span: int,
                                 width: int) -> list[int]:
    """The timeline's strip painted as it was before it was vectorised: each segment sliced in, in paint order."""
    import numpy as np

    from vmprof_tui.analyse.kinds import BlankKind
    from vmprof_tui.analyse.segments import SegmentKind

    strip = np.zeros(width, np.int8)
    for kind in screen.PAINT_ORDER:
        for seg in segments:
            if seg.kind is not kind:
                continue
            lo = min(int((seg.start_ns - w0) * width // span), width - 1)
            hi = max(int((seg.end_ns - w0) * width // span), lo + 1)
            strip[lo:hi] = (screen.BLANK_STATES[seg.blank.kind] if seg.blank is not None
                            else 1 if kind is SegmentKind.GUEST else 2)
            if seg.blank is not None and seg.blank.wakeup_ns is not None:
                wake = min(int((seg.blank.wakeup_ns - w0) * width // span), hi - 1)
                strip[wake:hi] = screen.WAKEUP_STATE
            thr = seg.blank.throttled_after_wakeup() if seg.blank is not None else None
            if thr and thr[0] < seg.end_ns and thr[1] > seg.start_ns:
                a = min(max(int((thr[0] - w0) * width // span), lo), hi - 1)
                strip[a:min(max(int((thr[1] - w0) * width // span), a + 1), hi)] = screen.BLANK_STATES[
                    BlankKind.THROTTLED]
    return strip.tolist()


def test_timeline_strip_paints_as_one_segment_at_a_time() -> None:
    """The timeline paints its strips vectorised (a 64-CPU window has thousands of segments a vCPU): every column
    as painting each segment in turn gives, on a real window's segments seen through narrower and shifted spans (some
    before or after it), and on blanks woken, woken into a throttled group, and throttled."""
    import random

    from vmprof_tui.analyse.blanks import Blank
    from vmprof_tui.analyse.kinds import BlankKind
    from vmprof_tui.analyse.segments import Segment, SegmentKind

    window = ReplayWindow(ROOT / "tests" / "data" / "golden" / "steal3.vmprof", window_s=3.0)
    window.start()
    for _ in range(4):
        view = window.poll(detail=True)
    w0, w1 = view.span()
    screen = TimelineScreen("steal1")
    real = [segs for vm in view.vm_names() for segs in view.vcpu_segments(vm).values()]
    assert real and sum(len(s) for s in real) > 100
    rng = random.Random(7)
    made = []
    for _ in range(200):
        start = rng.randrange(w0 - 10**8, w1)
        end = start + rng.randrange(1, 5 * 10**8)
        kind = rng.choice(list(BlankKind))
        wakeup = rng.choice([None, rng.randrange(start, end)])
        blank = Blank(start, end, kind, 0, 0, "x", wakeup_ns=wakeup,
                      throttled_ns=rng.choice([None, rng.randrange(1, 10**8)]),
                      throttled_wakeup_ns=rng.choice([None, rng.randrange(start - 10**7, end)]))
        made.append(Segment(start, end, SegmentKind.BLANK, blank=blank))
        made.append(Segment(start, end, rng.choice([SegmentKind.GUEST, SegmentKind.VMM, SegmentKind.UNSAMPLED])))
    rng.shuffle(made)
    for segments in [*real, made, []]:
        for width in (20, 97, 148):
            for lo, span in ((w0, w1 - w0), (w0 + (w1 - w0) // 3, (w1 - w0) // 2), (w0 - 10**9, 10**9)):
                want = _strip_one_segment_at_a_time(screen, segments, lo, span, width)
                assert screen.strip(segments, lo, span, width).tolist() == want, (width, lo, span)


def test_tables_changed_refresh_by_refresh_show_what_tables_built_at_once_show() -> None:
    """A table is changed, not rebuilt, at each refresh (cells made only for the values that changed, one refresh
    of the table for all of them, its rows put in order by their keys): after each refresh of a sliding window the
    overview and the host view show, row for row and cell for cell, what the same screen opened afresh shows."""
    from vmprof_tui.show.overview_screen import OverviewScreen

    app = VmprofTop(ReplayWindow(ROOT / "tests" / "data" / "golden" / "steal3.vmprof", window_s=1.0), refresh_s=3600)

    async def go() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: app.analysis is not None and not app._polling, timeout=15)
            for screen in (OverviewScreen, HostScreen):
                if screen is HostScreen:
                    await select(pilot, app, "(host)")
                    await pilot.press("enter")
                    await until(pilot, lambda: isinstance(app.screen, HostScreen) and len(cells(app)) > 5)
                for _ in range(6):
                    app._show(*app.poll_window())
                    await pilot.pause()
                    slid = cells(app)
                    # the title and status lines are drawn anew without laying the screen out (one line each)
                    shown = html.unescape(app.export_screenshot()).replace("\xa0", " ")
                    for line in ("#title", "#status"):
                        assert str(app.screen._texts[line])[:60] in shown, (line, app.screen._texts[line])
                    fresh = screen()
                    app.push_screen(fresh)
                    await until(pilot, lambda fresh=fresh: app.screen is fresh and fresh.ready and cells(app))
                    assert cells(app) == slid
                    app.pop_screen()
                    await pilot.pause()
            await pilot.press("q")

    asyncio.run(go())


def test_live_table_updates_and_orders_as_data_table_does() -> None:
    """LiveTable.update_cells and order (the refresh's one pass over the changed cells, and its rows put in the
    order of their keys) leave the table as update_cell for each cell and sort leave a DataTable."""
    from rich.text import Text
    from textual.app import App

    from vmprof_tui.show.live_table import LiveTable

    class Two(App):
        def compose(self):  # noqa: ANN202
            yield LiveTable(id="live", cursor_type="row")
            yield DataTable(id="plain", cursor_type="row")

    def lines(table: DataTable) -> list[str]:
        return [table.render_line(y).text for y in range(table.row_count + 1)]

    async def main() -> None:
        app = Two()
        async with app.run_test(size=(80, 20)) as pilot:
            live, plain = app.query_one("#live", LiveTable), app.query_one("#plain", DataTable)
            for t in (live, plain):
                t.add_columns("name", "samples")
                for i in range(5):
                    t.add_row(Text(f"f{i}"), Text(str(i * 10), justify="right"), key=f"f{i}")
            await pilot.pause()
            changes = [("f1", Text("123456789", justify="right"), True), ("f3", Text("7", justify="right"), False)]
            live.update_cells([(k, live.ordered_columns[1].key, v, wider) for k, v, wider in changes])
            for k, v, wider in changes:
                plain.update_cell(k, plain.ordered_columns[1].key, v, update_width=wider)
            order = ["f3", "f0", "f4", "f1", "f2"]
            live.order(order)
            plain.sort(key=lambda values: order.index(str(values[0])))
            await pilot.pause()
            assert lines(live) == lines(plain)
            assert "123456789" in lines(live)[4] and [live.get_row_index(k) for k in order] == [0, 1, 2, 3, 4]

    asyncio.run(main())
