"""Reports of recordings whose records are not in the file's order, and of a range to the recording's exact end,
read a piece at a time (record/stream.py pieces, analyse/stream.py) against the whole read, byte for byte.

A CPU's ring buffer drained late puts its records into a later flush (tests/synth.py `late`): a flush late is
within the next piece, which pieces merges in; two flushes late are records of a piece given already, which no
piece can report as the whole read does, so the recording is read whole (WholeNeeded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import BASE_NS, MS, SynthRecording, busy_recording

from vmprof_tui.analyse import stream
from vmprof_tui.analyse.stream import WholeNeeded
from vmprof_tui.cli import main
from vmprof_tui.record.stream import scan

WHOLE = 1 << 30  # piece rows: every recording here is one piece, read whole


@pytest.fixture(scope="module")
def two_late(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CPU 1's records written two flushes (1 s, two pieces of 1000 rows) late."""
    return busy_recording(tmp_path_factory.mktemp("stream_late") / "two.vmprof", 4.0, late=(1, 2))


def text(cmd: str, args: list[str], rows: int, capsys: pytest.CaptureFixture,
         monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, list[str]]:
    """The command's output and errors in pieces of `rows` samples, and how each streamed read ended."""
    ended: list[str] = []
    monkeypatch.setattr(stream, "PIECE_ROWS", rows)
    for cls in {stream.StreamedAnalysis, *stream.StreamedAnalysis.__subclasses__()}:
        init = cls.__init__

        def counted(self, *a, _init=init, **k):  # type: ignore[no-untyped-def]
            try:
                _init(self, *a, **k)
            except WholeNeeded:
                ended.append("whole")
                raise
            ended.append("pieces")
        monkeypatch.setattr(cls, "__init__", counted)
    assert main([cmd, *args]) == 0
    out = capsys.readouterr()
    monkeypatch.undo()
    return out.out, out.err, ended


CASES = [["--format", "json"], ["--cpu", "1"], ["-K", "--percentage", "absolute"], ["--time-range", "1.1:2.3"],
         ["--vm", "web", "--format", "csv"], ["--format", "collapsed"], ["--format", "chrome"]]


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_report_of_records_two_pieces_late_is_the_whole_one(two_late: Path, case: list[str],
                                                                    capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the pieces left CPU 1's late records out of their piece's idle and totals (11834 samples, 2041 idle,
    against the whole read's 11991 and 2198)."""
    out, err, ended = text("report", [str(two_late), *case], WHOLE, capsys, monkeypatch)
    assert ended == [] and out
    for rows in (300, 1000, 1733):
        again = text("report", [str(two_late), *case], rows, capsys, monkeypatch)
        assert again[:2] == (out, err), rows
        if rows < 1500:  # a flush or less a piece: the late records are of a piece given already, read whole
            assert again[2] and set(again[2]) == {"whole"}, rows


def test_pieces_refuse_records_of_a_piece_given_already(two_late: Path) -> None:
    scanned = scan(two_late)
    assert scanned is not None
    with pytest.raises(WholeNeeded, match="more than a piece"):
        for _piece in stream.pieces(scanned, 1000, lambda first, last: last):
            pass


@pytest.mark.parametrize("cpu", [0, 2])
def test_streamed_report_of_records_a_flush_late_is_the_whole_one_in_pieces(
        tmp_path: Path, cpu: int, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush late, the records are within the next piece (or before the first one is given): still read in
    pieces, and the same text."""
    rec = busy_recording(tmp_path / "one.vmprof", 3.0, late=(cpu, 1))
    for case in (["--format", "json"], ["--time-range", "0:1.2"], ["--cpu", str(cpu)]):
        out, err, _ended = text("report", [str(rec), *case], WHOLE, capsys, monkeypatch)
        for rows in (1000, 1733):
            again = text("report", [str(rec), *case], rows, capsys, monkeypatch)
            assert again[:2] == (out, err) and again[2] == ["pieces"], (case, rows)


def test_streamed_time_range_to_the_exact_end_keeps_the_record_at_the_end(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range whose end is the recording's end, where its last record is, the first of a group of its own: the
    whole read keeps that record, and the pieces read on to it (they stopped at the piece ending there before)."""
    b = SynthRecording(cpus=1, duration_ns=3000 * MS)
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=1400 * MS)  # idle between: the pieces stop after a range
    b.host_task(501, "app", cpu=0, start_ns=1500 * MS, end_ns=3000 * MS)
    samples = b.samples()
    assert int(samples["time_ns"].min()) == BASE_NS  # the range counts from here: 3 s is the end
    tail = samples[-1:].copy()
    tail["time_ns"] = BASE_NS + 3000 * MS
    rec = b.write(tmp_path / "end.vmprof", tail=tail)
    for case in (["--time-range", "1:3"], ["--time-range", "2.5:3", "--format", "json"]):
        out, err, _ended = text("report", [str(rec), *case], WHOLE, capsys, monkeypatch)
        assert "Total samples: " in out or '"total_samples": ' in out
        for rows in (400, 700):
            again = text("report", [str(rec), *case], rows, capsys, monkeypatch)
            assert again[:2] == (out, err) and again[2] == ["pieces"], (case, rows)
    whole = text("report", [str(rec), "--time-range", "2.5:3"], WHOLE, capsys, monkeypatch)[0]
    assert np.count_nonzero(samples["time_ns"] >= BASE_NS + 2500 * MS) + 1 == int(
        whole.split("Total samples: ")[1].split()[0])
