"""`vmprof report --format chrome` of a recording read a piece at a time (analyse/stream_trace.py) against the same
trace of the whole recording, byte for byte: synthetic recordings (tests/synth.py: pieces of 500 ms at 1000 rows)
in pieces of several sizes, whose vCPU slices cross the pieces' edges, and the stored demo recording of three VMs
(tests/data/golden)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synth import busy_recording
from test_stream import report

from vmprof_tui.analyse import stream_trace
from vmprof_tui.analyse.stream_trace import StreamedTrace

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"
WHOLE = 1 << 30  # piece rows: every recording here is one piece, read whole


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream_trace") / "busy.vmprof", 6.0)


def same_trace(rec: Path, args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
               rows: tuple[int, ...] = (1000, 1733, 257), streamed: bool = True) -> str:
    """The trace read whole, once it is the same text read in pieces of each of `rows` samples (streamed: by
    StreamedTrace; else whole again)."""
    made: list[int] = []
    init = StreamedTrace.__init__
    monkeypatch.setattr(StreamedTrace, "__init__", lambda self, *a, **k: made.append(1) or init(self, *a, **k))
    whole = report([str(rec), "--format", "chrome", *args], WHOLE, capsys, monkeypatch, streamed=False)
    assert not made
    for n in rows:
        assert report([str(rec), "--format", "chrome", *args], n, capsys, monkeypatch, streamed=streamed) == whole, n
    assert bool(made) == streamed
    return whole


CASES = [[], ["--vm", "web"], ["--vm", "db", "--vcpu", "1"], ["--level", "guest", "--vm", "web"], ["--cpu", "1"]]


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_chrome_trace_is_the_whole_one(recording: Path, case: list[str], capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = json.loads(same_trace(recording, case, capsys, monkeypatch))
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"guest", "vmm", "steal"} <= cats


def test_streamed_chrome_slices_cross_the_pieces_edges(recording: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of guest and VMM samples, and blanks, that span an edge of the 500 ms pieces: carried across it."""
    trace = json.loads(same_trace(recording, [], capsys, monkeypatch, rows=(1000,)))
    edges = range(500_000, 6_000_000, 500_000)  # microseconds from the first record
    crossing = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] < 1 << 22
                and any(e["ts"] < edge < e["ts"] + e["dur"] for edge in edges)}
    assert {"guest", "vmm"} <= crossing, crossing


@pytest.mark.parametrize("kind", ["late_cpu", "unlisted_vm"])
def test_streamed_chrome_trace_of_a_late_cpu_or_an_unlisted_vm_is_the_whole_one(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU first switched 40% in; a VM the VM list does not name (its vCPU thread gives up the stream)."""
    rec = busy_recording(tmp_path / f"{kind}.vmprof", 6.0, **{kind: True})
    same_trace(rec, [], capsys, monkeypatch, rows=(1000,))


@pytest.mark.parametrize("case", [[], ["--vm", "steal2"], ["--vm", "steal1", "--vcpu", "0"]], ids=" ".join)
def test_streamed_chrome_trace_of_the_demo_recording_is_the_whole_one(case: list[str], capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    same_trace(GOLDEN, case, capsys, monkeypatch, rows=(100, 1000, 4099))


def test_chrome_trace_of_a_time_range_is_read_whole(recording: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    same_trace(recording, ["--time-range", "1.2:3.4"], capsys, monkeypatch, rows=(1000,), streamed=False)


def test_streamed_trace_keeps_no_sample(recording: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is kept between pieces is runs (start, end, label) and each thread's open run: as many runs in pieces
    of 257 samples as in one piece."""
    from vmprof_tui.record.stream import scan
    from vmprof_tui.show.formats.chrome import slice_label

    def runs(rows: int) -> list[int]:
        an = StreamedTrace(scan(recording), slice_label, piece_rows=rows)
        assert an.pieces > 1 or rows == WHOLE
        return [sum(map(len, t.starts)) for t in an.tracks.values()]

    monkeypatch.setattr(stream_trace, "VMS_AT_ONCE", 1)
    assert runs(257) == runs(WHOLE) and sum(runs(WHOLE)) > 100


@pytest.mark.parametrize(("which", "vms"), [("busy", 2), ("golden", 3)])
def test_streamed_chrome_trace_with_timelines_built_a_vm_at_a_time_is_the_whole_one(
        which: str, vms: int, recording: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """VMS_AT_ONCE below the VM count: the timelines are built in several groups (a VM each), and the trace is the
    whole read's byte for byte."""
    groups = []
    schedule = stream_trace.Schedule
    monkeypatch.setattr(stream_trace, "VMS_AT_ONCE", 1)
    monkeypatch.setattr(stream_trace, "Schedule", lambda *a, **k: groups.append(k["only"]) or schedule(*a, **k))
    same_trace(recording if which == "busy" else GOLDEN, [], capsys, monkeypatch, rows=(1000,))
    assert len(groups) == vms and all(groups)
