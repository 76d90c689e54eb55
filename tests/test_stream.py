"""`vmprof report` of a recording read a piece at a time (analyse/stream.py) against the same report of the
whole recording (the reference): byte for byte, at the host and guest levels, in every format made from the
summaries.  The recording is synthetic (tests/synth.py) and long enough for many pieces: vCPUs run, halt (with
wake-ups and KVM's halt-end records), are preempted by host tasks and by each other, and exit to KVM, across
piece boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import busy_recording

from vmprof_tui import arrays
from vmprof_tui.analyse import stream
from vmprof_tui.analyse.shares import RowCounts
from vmprof_tui.analyse.stream import StreamedAnalysis
from vmprof_tui.cli import main
from vmprof_tui.record.bpf_records import SCHED_DTYPE
from vmprof_tui.record.stream import scan, sort_sched
from vmprof_tui.resolve.resolver import NameCodes


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream") / "busy.vmprof", 6.0)


def report(args: list[str], piece_rows: int, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
           streamed: bool) -> str:
    """The report's text, checking that it was read a piece at a time (streamed) or whole."""
    made = []
    init = StreamedAnalysis.__init__
    monkeypatch.setattr(stream, "PIECE_ROWS", piece_rows)
    monkeypatch.setattr(StreamedAnalysis, "__init__", lambda self, *a, **k: made.append(1) or init(self, *a, **k))
    assert main(["report", *args]) == 0
    assert bool(made) == streamed
    return capsys.readouterr().out


LEVELS = [[], ["--vm", "web"], ["--vm", "db", "--vcpu", "1"]]
CASES = [[fmt, *level] for fmt in ("table", "json", "csv") for level in LEVELS] + [["table", "--level", "guest"]]
# perf's row filters: their totals and ratios are of the rows kept (each row's kernel-mode samples), or of the level
CASES += [["table", "-K"], ["table", "--vm", "web", "-U"], ["json", "--comm", "app", "--dso", "[kernel.kallsyms]"],
          ["csv", "--pid", "601,500", "--percentage", "absolute"], ["table", "--comm", "worker", "-U"]]
# the --sort orders, --limit and --width, made from the rows as columns (analyse/row_table.py)
CASES += [["table", "--sort", "process", "--width", "90"], ["json", "--sort", "function", "--limit", "7"],
          ["csv", "--sort", "pid"], ["table", "--vm", "web", "--sort", "module", "--limit", "5"],
          ["json", "--level", "guest", "--vm", "db", "--sort", "name"]]


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_report_is_the_whole_report(recording: Path, case: list[str], capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(recording), "--format", *case]
    whole = report(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert len(whole.splitlines()) >= 4  # rows, not only a header
    assert report(args, 1000, capsys, monkeypatch, streamed=True) == whole
    assert report(args, 1733, capsys, monkeypatch, streamed=True) == whole


@pytest.mark.parametrize("case", [["table"], ["csv", "-K"], ["json", "--vm", "web"]], ids=" ".join)
def test_streamed_report_with_its_sums_in_own_pages_is_the_whole_report(recording: Path, case: list[str],
                                                                         capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's sums by name code, the name tables and the names by code in pages of their own (arrays.own_pages,
    there from 1 MB on), grown in them and merged in place: the same report."""
    args = [str(recording), "--format", *case]
    whole = report(args, 1 << 30, capsys, monkeypatch, streamed=False)
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", 1)
    monkeypatch.setattr(NameCodes, "RECENT_MIN", 8)  # the names merged into the sorted table many times
    assert report(args, 1000, capsys, monkeypatch, streamed=True) == whole


@pytest.mark.parametrize("case", ["int32", "past int32", "fractions"])
def test_host_rows_summed_by_code_are_the_rows_merged_by_sorted_code(case: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """_RowsByCode (the host's: sums indexed by name code, int32 while no sum can overflow and the counts
    are whole) reads as the sorted codes merged piece by piece, rows whose counts cancel out (idle samples taken
    back) left out."""
    if case == "past int32":
        monkeypatch.setattr(stream, "INT32_MAX", 5000)  # the sums widened to float midway
    rng = np.random.default_rng(5)
    by_code, merged = stream._RowsByCode(), stream._Rows()
    for size in (5, 300, 0, 2000, 40):
        codes = np.unique(rng.integers(0, 3000, size))
        counts = rng.integers(1, 9, len(codes)).astype(float)
        if case == "fractions" and size == 2000:
            counts[::3] += 0.25
        rows = RowCounts(codes, counts, None)
        kernel = RowCounts(codes[::2], np.minimum(counts[::2], 2), None)
        for r in (by_code, merged):
            r.add(rows, kernel)
            r.settle()
            if size == 40:  # a piece's rows taken away again
                r.add(rows.negated(), kernel.negated())
    for got, want in ((by_code.all, merged.all), (by_code.kernel, merged.kernel)):
        keep = want.counts != 0
        assert got.codes.tolist() == want.codes[keep].tolist()
        assert got.counts.tolist() == want.counts[keep].tolist()
        assert got.counts.dtype == want.counts.dtype
    assert by_code._sums[0].dtype == (np.int32 if case == "int32" else float)


def test_streamed_analysis_reads_pieces_in_bounded_memory(recording: Path) -> None:
    """The pieces follow each other in time and together hold every record once; the summaries kept across them
    are the distinct rows, not the samples."""
    scanned = scan(recording)
    an = stream.StreamedAnalysis(scanned, piece_rows=1000)  # the host level
    assert an.pieces == 12  # a piece per sample chunk (500 ms of 3 CPUs)
    total = an.host_profile().total_samples
    assert total == pytest.approx(scanned.samples, abs=1)  # idle from sched events replaces the idle samples
    assert len(an.host_rows.all.codes) < 50


def test_streamed_pieces_read_the_snapshots_processes_once(recording: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece shares the recording's snapshot: its processes (thousands on a busy host) are listed once, not
    once per piece and per use."""
    from vmprof_tui.record import recording as rec_module

    scanned = scan(recording)
    keys = len(scanned.rec.snapshot)
    seen = []
    is_key = rec_module.is_process_key
    monkeypatch.setattr(rec_module, "is_process_key", lambda key: seen.append(key) or is_key(key))
    an = stream.StreamedAnalysis(scanned, piece_rows=1000)
    assert an.pieces == 12
    assert len(seen) == keys


@pytest.fixture(scope="module")
def late_cpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream") / "late.vmprof", 6.0, late_cpu=True)


@pytest.mark.parametrize("case", [["table"], ["json"], ["csv", "-K"], ["table", "--comm", "swapper/3"]], ids=" ".join)
def test_streamed_report_replaces_idle_samples_as_the_whole_report(late_cpu: Path, case: list[str],
                                                                  capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU idle (its idle task sampled) over the first pieces, with no switch on it until then: the whole report
    replaces its idle samples by its idle time from the recording's start, and so must every piece."""
    args = [str(late_cpu), "--format", *case]
    whole = report(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert report(args, 1000, capsys, monkeypatch, streamed=True) == whole
    assert report(args, 1733, capsys, monkeypatch, streamed=True) == whole


@pytest.mark.parametrize("case", [["table"], ["json", "--vm", "vm-300"], ["table", "--level", "guest"]], ids=" ".join)
def test_report_of_a_vcpu_thread_the_vm_list_misses_is_the_whole_report(tmp_path: Path, case: list[str],
                                                                       capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A vCPU thread that only its samples name is known to the whole recording in every piece (its timeline), to a
    piece only where it ran guest code: such a recording is reported whole."""
    path = busy_recording(tmp_path / "unlisted.vmprof", 6.0, unlisted_vm=True)
    args = [str(path), "--format", *case]
    whole = report(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert "vm-300" in whole
    gave_up = []
    init = StreamedAnalysis.__init__

    def watched(self: StreamedAnalysis, *a: object, **k: object) -> None:
        try:
            init(self, *a, **k)
        except stream.WholeNeeded:
            gave_up.append(1)
            raise

    monkeypatch.setattr(StreamedAnalysis, "__init__", watched)
    assert report(args, 1000, capsys, monkeypatch, streamed=True) == whole
    assert gave_up


@pytest.mark.parametrize("case", ["ties", "ties in the threads too", "wide thread ids", "one", "none"])
def test_sort_sched_is_numpys_order_of_records(case: str) -> None:
    """sort_sched (three packed sorts) against np.sort(order="time_ns"): by time, ties by every other field."""
    rng = np.random.default_rng(5)
    n = {"one": 1, "none": 0}.get(case, 20_000)
    ev = np.zeros(n, SCHED_DTYPE)
    ev["time_ns"] = 10**18 + rng.integers(0, 50, n) * 1000  # 50 instants: most events tie on time
    for side in ("prev", "next"):
        ev[f"{side}_pid"] = rng.integers(0, 1 << 22, n)
        ev[f"{side}_tid"] = rng.integers(0, 1 << 32 if case == "wide thread ids" else 1 << 22, n)
    if case == "ties in the threads too":  # the same switch twice, told apart by later fields
        ev[n // 2:][["prev_pid", "prev_tid", "next_pid", "next_tid"]] = ev[:n - n // 2][
            ["prev_pid", "prev_tid", "next_pid", "next_tid"]]
        ev["time_ns"][n // 2:] = ev["time_ns"][:n - n // 2]
    ev["cpu"] = rng.integers(0, 64, n)
    ev["flags"] = rng.integers(0, 256, n)
    assert np.sort(ev, order="time_ns", kind="stable").tobytes() == sort_sched(ev).tobytes()


def test_streamed_report_writes_its_rows_from_columns(recording: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed table's rows reach the text as columns (a RowTable), not as a Row object each (docs/scale.md,
    "Third round")."""
    from vmprof_tui.analyse.row_table import RowTable
    from vmprof_tui.show.formats import table

    seen = []
    parts = table.profile_parts
    monkeypatch.setattr(table, "profile_parts", lambda p, *a: seen.append(type(p.rows)) or parts(p, *a))
    report([str(recording)], 1000, capsys, monkeypatch, streamed=True)
    assert seen == [RowTable]


def test_streamed_pieces_are_let_go_before_the_next_is_prepared(recording: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each piece's Analysis is freed before the next piece is prepared (two alive at once set the peak), and the
    piece's rows are merged into the sums then, not beside it (docs/scale.md, "Third round")."""
    import weakref

    made: list[weakref.ref] = []
    alive, pending = [], []

    class Tracked(stream.Analysis):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    prepare = stream.prepare

    def tracked_prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        alive.append(sum(r() is not None for r in made))
        if made:
            pending.append(len(an_rows[0]._pending))
        return prepare(*args, **kwargs)

    an_rows: list = []
    init_rows = stream._RowsByCode.__init__

    def first_rows(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        init_rows(self, *args, **kwargs)
        an_rows.append(self)  # the host rows

    monkeypatch.setattr(stream, "Analysis", Tracked)
    monkeypatch.setattr(stream, "prepare", tracked_prepare)
    monkeypatch.setattr(stream._RowsByCode, "__init__", first_rows)
    an = StreamedAnalysis(scan(recording), piece_rows=1000)
    assert an.pieces == len(alive) > 1 and set(alive) == {0} and set(pending) == {0}
    assert an.host_rows is an_rows[0] and len(an.host_rows.all.codes)


def test_streamed_report_gives_free_memory_back_before_its_rows(recording: Path, capsys: pytest.CaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pieces freed is given back (malloc_trim) once they are read, before the profile's rows are made:
    the heap's holes would otherwise hold the long report's peak (docs/scale.md, "Fourth round")."""
    from vmprof_tui.cli import common

    steps = []
    monkeypatch.setattr(common, "give_back_free_memory", lambda: steps.append("given back"))
    profile = StreamedAnalysis.host_profile
    monkeypatch.setattr(StreamedAnalysis, "host_profile", lambda *a, **k: steps.append("rows") or profile(*a, **k))
    report([str(recording)], 1000, capsys, monkeypatch, streamed=True)  # 12 pieces
    assert steps == ["given back", "rows"]
    steps.clear()
    report([str(recording)], 6000, capsys, monkeypatch, streamed=True)  # 3 pieces: little was freed
    assert steps == ["rows"]
