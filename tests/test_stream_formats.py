"""The stack formats of `vmprof report` without call stacks (collapsed, pprof, speedscope, svg) of a recording
read a piece at a time (analyse/stream_stacks.py) against the same output of the whole recording: byte for byte,
at the host level (each VM's row split into its vCPU threads' rows), one VM's, every VM's, with row filters; on
a synthetic recording (tests/synth.py) and on the stored demo recording of three VMs (tests/data/golden)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import busy_recording

from vmprof_tui.analyse import stream
from vmprof_tui.analyse.stream import StreamedAnalysis
from vmprof_tui.analyse.stream_stacks import StreamedStacks
from vmprof_tui.cli import main

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream_formats") / "busy.vmprof", 6.0)


def report(rec: Path, args: list[str], piece_rows: int, out: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The report's bytes (-o out), and which analysis made them: streamed for stack formats (StreamedStacks)
    or whole."""
    made: list[type] = []
    init = StreamedAnalysis.__init__
    monkeypatch.setattr(stream, "PIECE_ROWS", piece_rows)
    monkeypatch.setattr(StreamedAnalysis, "__init__", lambda self, *a, **k: made.append(type(self)) or init(
        self, *a, **k))
    assert main(["report", str(rec), *args, "-o", str(out)]) == 0
    assert made == ([] if piece_rows >= 1 << 30 else [StreamedStacks])
    return out.read_bytes()


LEVELS = [[], ["--vm", "web"], ["--vm", "db", "--vcpu", "1"], ["-K"], ["--comm", "app"], ["--level", "guest"]]
CASES = [[fmt, *level] for fmt in ("collapsed", "pprof", "speedscope", "svg") for level in LEVELS
         if not (fmt in ("pprof", "svg") and level == ["--level", "guest"])]  # one profile per file


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_stack_format_is_the_whole_one(recording: Path, case: list[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--format", *case]
    whole = report(recording, args, 1 << 30, tmp_path / "whole", monkeypatch)
    assert len(whole) > 100
    assert report(recording, args, 1000, tmp_path / "streamed", monkeypatch) == whole
    assert report(recording, args, 1733, tmp_path / "streamed", monkeypatch) == whole


@pytest.mark.parametrize("fmt", ["collapsed", "pprof", "speedscope", "svg"])
@pytest.mark.parametrize("level", [[], ["--vm", "steal1"], ["-U"]], ids=" ".join)
def test_streamed_stack_format_of_the_demo_recording_is_the_whole_one(fmt: str, level: list[str], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--format", fmt, *level]
    whole = report(GOLDEN, args, 1 << 30, tmp_path / "whole", monkeypatch)
    for rows in (100, 1000):
        assert report(GOLDEN, args, rows, tmp_path / "streamed", monkeypatch) == whole


def test_host_vm_rows_split_from_the_sums(recording: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host level's VM rows come out as their vCPU threads' rows ([VM] -> process -> function), not one frame."""
    folded = report(recording, ["--format", "collapsed"], 1000, tmp_path / "f", monkeypatch).decode()
    assert any(line.startswith("[web];web/") for line in folded.splitlines())
    assert not any(line.startswith("[web] (VM") for line in folded.splitlines())


@pytest.mark.parametrize("case", [["table"], ["json"], ["csv", "-U"]], ids=" ".join)
@pytest.mark.parametrize("rows", [100, 300, 1000])
def test_streamed_host_report_of_the_demo_recording_is_the_whole_one(case: list[str], rows: int,
                                                                     capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU's idle in a piece is of the switches up to the piece's end: the first switches after it (of every
    thread, the idle task's too) left a switch from idle without the switch to idle before it, and the CPU
    looked idle over the whole piece (2977 samples of idle whole, 3481 in pieces of 1000)."""
    args = ["report", str(GOLDEN), "--format", *case]
    monkeypatch.setattr(stream, "PIECE_ROWS", 1 << 30)
    assert main(args) == 0
    whole = capsys.readouterr().out
    monkeypatch.setattr(stream, "PIECE_ROWS", rows)
    assert main(args) == 0
    assert capsys.readouterr().out == whole


def test_children_of_a_large_recording_without_call_stacks_fail_before_its_pieces(
        recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--children and --callers of a recording made without -g fail as they did, but before it is read."""
    made: list[type] = []
    monkeypatch.setattr(stream, "PIECE_ROWS", 1000)
    monkeypatch.setattr(StreamedAnalysis, "__init__", lambda self, *a, **k: made.append(type(self)))
    for view in (["--children"], ["--callers", "main"]):
        assert main(["report", str(recording), *view]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{recording} was recorded without call stacks" in err, err
    assert made == []
