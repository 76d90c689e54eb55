"""`vmprof report` cut to one CPU (--cpu), to a span (--time-range), or filtered to one mode with percentages of
the whole level (-K/-U --percentage absolute), of a recording read a piece at a time (analyse/stream.py) against
the same report of the whole recording: byte for byte, in the formats made from the summaries.  Synthetic
recordings (tests/synth.py: pieces of 500 ms at 1000 rows) with ranges that start and end inside pieces, on piece
edges and past the end, and the stored demo recording of three VMs (tests/data/golden)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import MS, SynthRecording, busy_recording
from test_stream import report

from vmprof_tui.analyse import stream
from vmprof_tui.cli import main

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"
WHOLE = 1 << 30  # piece rows: every recording here is one piece, read whole


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream_cut") / "busy.vmprof", 6.0)


@pytest.fixture(scope="module")
def late_cpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream_cut") / "late.vmprof", 6.0, late_cpu=True)


def same_report(rec: Path, args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                rows: tuple[int, ...] = (1000, 1733)) -> str:
    """The report read whole, once it is the same text read in pieces of each of `rows` samples."""
    whole = report([str(rec), *args], WHOLE, capsys, monkeypatch, streamed=False)
    for n in rows:
        assert report([str(rec), *args], n, capsys, monkeypatch, streamed=True) == whole, n
    return whole


FORMATS = ["table", "json", "csv", "collapsed"]
CPUS = [["--cpu", "0"], ["--cpu", "1", "-K"], ["--cpu", "2", "--comm", "worker"], ["--cpu", "2", "--sort", "pid"]]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cut", CPUS, ids=" ".join)
def test_streamed_report_of_one_cpu_is_the_whole_one(recording: Path, fmt: str, cut: list[str],
                                                     capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if fmt == "collapsed" and "--sort" in cut:
        return  # --sort orders table, JSON and CSV only
    whole = same_report(recording, ["--format", fmt, *cut], capsys, monkeypatch)
    assert f"CPU {cut[1]} only" in whole or fmt in ("csv", "collapsed")


@pytest.mark.parametrize("cut", [["--cpu", "3"], ["--cpu", "0"], ["--cpu", "3", "-U"]], ids=" ".join)
def test_streamed_report_of_a_cpu_idle_at_first_is_the_whole_one(late_cpu: Path, cut: list[str],
                                                                 capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU whose idle samples the sched events replace only from its first switch, pieces after the first."""
    same_report(late_cpu, ["--format", "table", *cut], capsys, monkeypatch)


@pytest.mark.parametrize(("cut", "says"), [(["--cpu", "9"], "--cpu 9 matches nothing"),
                                           (["--time-range", "7:8"], "starts after the end"),
                                           (["--time-range", "1e300:2e300"], "starts after the end")], ids=str)
def test_streamed_report_of_a_cut_the_recording_lacks_fails_as_the_whole(
        recording: Path, cut: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = []
    for rows in (WHOLE, 1000):
        monkeypatch.setattr(stream, "PIECE_ROWS", rows)
        assert main(["report", str(recording), *cut]) == 1
        lines.append(capsys.readouterr().err)
    assert lines[0] == lines[1] and lines[0].count("\n") == 1 and says in lines[0]


# 500 ms pieces: inside pieces, on their edges, one piece's inside, to the end and past it, from the start
RANGES = ["1.25:3.7", "1:2", "0.3:0.31", "2.6:6", "4.2:100", "0:0.75", "5.9:6.5", "3:1e300"]


@pytest.mark.parametrize("span", RANGES)
@pytest.mark.parametrize("case", [["table"], ["json", "--vm", "web"], ["csv", "--level", "guest"],
                                  ["collapsed"], ["table", "-U"], ["table", "--vm", "db", "--vcpu", "1"]],
                         ids=" ".join)
def test_streamed_report_of_a_time_range_is_the_whole_one(recording: Path, span: str, case: list[str],
                                                          capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    same_report(recording, ["--format", *case, "--time-range", span], capsys, monkeypatch)


@pytest.mark.parametrize("span", ["1.1:2.9", "0:2.2", "3:100"])
def test_streamed_report_of_a_time_range_with_a_cpu_idle_at_first_is_the_whole_one(
        late_cpu: Path, span: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    same_report(late_cpu, ["--time-range", span], capsys, monkeypatch)
    same_report(late_cpu, ["--time-range", span, "--cpu", "3"], capsys, monkeypatch)


ABSOLUTE = [["table", "-K"], ["json", "-U"], ["csv", "--vm", "web", "-K"], ["table", "--level", "guest", "-U"],
            ["collapsed", "-K"], ["table", "-U", "--comm", "app"], ["table", "-K", "--cpu", "1"]]


@pytest.mark.parametrize("case", ABSOLUTE, ids=" ".join)
def test_streamed_absolute_percentages_of_a_mode_are_the_whole_ones(recording: Path, case: list[str],
                                                                    capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    whole = same_report(recording, ["--format", *case, "--percentage", "absolute"], capsys, monkeypatch)
    assert "absolute" in whole or case[0] in ("csv", "collapsed")


DEMO = [["--cpu", "1"], ["--time-range", "0.5:1.5"], ["--vm", "steal2", "--time-range", "1:2"],
        ["-U", "--percentage", "absolute"], ["--format", "collapsed", "--cpu", "0"]]


@pytest.mark.parametrize("case", DEMO, ids=" ".join)
def test_streamed_cut_report_of_the_demo_recording_is_the_whole_one(case: list[str], capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    same_report(GOLDEN, case, capsys, monkeypatch, rows=(100, 1000))


def test_streamed_notes_about_missing_files_are_in_the_whole_reads_order(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole read notes the files it cannot open as it resolves every sample, by process (pid) and mapping;
    a process of a lower pid that first runs after the first piece (`late`) is noted before `early` there too."""
    b = SynthRecording(cpus=2)
    b.host_task(700, "early", cpu=0, start_ns=0, end_ns=6000 * MS)
    b.host_task(650, "middle", cpu=1, start_ns=0, end_ns=1000 * MS)
    b.host_task(300, "late", cpu=1, start_ns=3000 * MS, end_ns=6000 * MS)
    rec = b.write(tmp_path / "late.vmprof")
    for fmt in ("table", "json", "collapsed"):
        whole = same_report(rec, ["--format", fmt], capsys, monkeypatch)
        if fmt != "collapsed":
            at = [whole.index(f"{name}: cannot open") for name in ("late", "middle", "early")]
            assert at == sorted(at), whole


def test_streamed_time_range_stops_reading_after_the_range(recording: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pieces before the range are read for the switches they leave open, those after it not at all (but the
    one starting where the range ends, whose first record would be in it were it the recording's end); a range to
    the end reads every piece."""
    from vmprof_tui.record.stream import scan

    read = []
    pieces = stream.pieces

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        for piece in pieces(*args, **kwargs):
            read.append(piece.lo)
            yield piece

    monkeypatch.setattr(stream, "pieces", counted)
    an = stream.StreamedAnalysis(scan(recording), piece_rows=1000, time_range=(1.0, 2.0))
    assert an.pieces == 2 and len(read) == 5  # 500 ms pieces: two before, two in the range, the one at its end
    assert an.duration_s == 1.0
    read.clear()
    an = stream.StreamedAnalysis(scan(recording), piece_rows=1000, time_range=(1.0, 1.9))
    assert an.pieces == 2 and len(read) == 4
    read.clear()
    an = stream.StreamedAnalysis(scan(recording), piece_rows=1000, time_range=(4.2, 100.0))
    assert len(read) == 12 and an.pieces == 4
