"""`vmprof report` of a recording with call stacks (`record -g`) read a piece at a time (analyse/stream_callgraph.py)
against the same report of the whole recording, byte for byte: every stack format, the tables with their stack
notes, --children and --callers, at the host level, one VM, one vCPU and every VM, with -K/-U and row filters,
in pieces of several sizes.  The recordings are of real demo VMs: the `stacks` scenario by frame pointers, and a
program without frame pointers by call-frame information (user-stack copies)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import Recorded, record_scenario

from vmprof_tui.analyse import stream
from vmprof_tui.analyse.stream import StreamedAnalysis, WholeNeeded
from vmprof_tui.analyse.stream_callgraph import StreamedCallGraph
from vmprof_tui.cli import main
from vmprof_tui.cli import report as report_module
from vmprof_tui.record.bpf_records import SAMPLE_GUEST, stack_rows
from vmprof_tui.record.recording import STACKS, USTACKS, load
from vmprof_tui.record.stream import pieces, scan
from vmprof_tui.resolve import stacks as resolve_stacks
from vmprof_tui.resolve import unwind
from vmprof_tui.resolve.stacks import SampleStacks

WHOLE = 1 << 30  # PIECE_ROWS above any recording here: read whole


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stacks scenario (chain, recurse, clobber in one VM) recorded with -g --call-graph fp at 4 kHz."""
    rec: Recorded = record_scenario(tmp_path_factory.mktemp("fp"), "stacks", 3.0, frequency=4000, stacks=True)
    return rec.rec.path


@pytest.fixture(scope="module")
def cfi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Programs without frame pointers (stacks-nofp) recorded with --call-graph cfi: user-stack copies."""
    rec: Recorded = record_scenario(tmp_path_factory.mktemp("cfi"), "stacks-nofp", 3.0, frequency=2000, stacks=True,
                                    call_graph="cfi")
    return rec.rec.path


def report(rec: Path, args: list[str], piece_rows: int, out: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The report's bytes (-o out), checking which analysis made them: StreamedCallGraph in pieces, else whole.
    A stream that gives up (WholeNeeded: a note first met after the first piece, such as a host process with a
    file this machine cannot open starting mid-recording) is read whole: said on stdout."""
    made: list[type] = []
    init = StreamedAnalysis.__init__
    monkeypatch.setattr(stream, "PIECE_ROWS", piece_rows)
    monkeypatch.setattr(StreamedAnalysis, "__init__", lambda self, *a, **k: made.append(type(self)) or init(
        self, *a, **k))
    whole = report_module.load_analysis
    monkeypatch.setattr(report_module, "load_analysis", lambda args: made.append("whole") or whole(args))
    assert main(["report", str(rec), *args, "-o", str(out)]) == 0
    if piece_rows == WHOLE:
        assert made == ["whole"], made
    else:
        assert made[0] is StreamedCallGraph, made
        if made[1:]:
            print(f"{args} in pieces of {piece_rows}: read whole")
    return out.read_bytes()


def same_both_ways(rec: Path, args: list[str], rows: tuple[int, ...], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> bytes:
    whole = report(rec, args, WHOLE, tmp_path / "whole", monkeypatch)
    for n in rows:
        assert report(rec, args, n, tmp_path / f"streamed{n}", monkeypatch) == whole, (args, n)
    return whole


LEVELS = [[], ["--vm", "stacks"], ["--vm", "stacks", "--vcpu", "0"], ["-K"], ["-U"],
          ["--vm", "stacks", "--comm", "chain"], ["--level", "guest"]]
CASES = [["--format", fmt, *level] for fmt in ("collapsed", "pprof", "speedscope", "svg", "table", "json", "csv")
         for level in LEVELS if not (fmt in ("pprof", "svg") and level == ["--level", "guest"])]


def test_the_recordings_have_stacks_and_are_read_in_pieces(fp: Path, cfi: Path) -> None:
    for rec in (fp, cfi):
        scanned = scan(rec, stacks=True)
        assert scanned is not None and scanned.rec.stacks is not None and scanned.samples > 10_000
        assert scan(rec) is None, "read whole where call stacks are not asked for (steal, the fleet)"
    assert scan(cfi, stacks=True).rec.meta.get("stack_copy_bytes")


def test_stack_records_and_copies_go_with_their_samples_piece_by_piece(fp: Path, cfi: Path) -> None:
    """record.stream.pieces cuts the stack records and copies by time as the samples: every sample joins its
    records in its own piece as in the whole recording."""
    for rec in (fp, cfi):
        whole = load(rec)
        tables = [(STACKS, whole.stacks)] + ([(USTACKS, whole.ustacks)] if whole.ustacks is not None else [])
        joined = {kind: int(np.count_nonzero(stack_rows(whole.samples, t) >= 0)) for kind, t in tables}
        assert joined[STACKS] > 10_000
        scanned = scan(rec, stacks=True)
        assert scanned is not None
        in_pieces = dict.fromkeys(joined, 0)
        n = 0
        for piece in pieces(scanned, 1000, lambda _first, last: last):
            n += 1
            for kind in joined:
                in_pieces[kind] += int(np.count_nonzero(stack_rows(piece.samples, piece.stacks[kind]) >= 0))
        assert n > 5 and in_pieces == joined


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_call_stack_report_is_the_whole_one(fp: Path, case: list[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    whole = same_both_ways(fp, case, (8000, 14283), tmp_path, monkeypatch)
    if "collapsed" in case and "-U" not in case:  # call paths, not rows: main's callees under _start
        assert b"_start;main;solve;" in whole


@pytest.mark.parametrize("view", [["--children"], ["--callers", "solve"], ["--callers", "descend"]], ids=" ".join)
@pytest.mark.parametrize("level", [[], ["--vm", "stacks"], ["--level", "guest"], ["--vm", "stacks", "-K"]],
                         ids=" ".join)
def test_streamed_children_and_callers_are_the_whole_ones(fp: Path, view: list[str], level: list[str],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    same_both_ways(fp, [*view, *level], (8000, 14283), tmp_path, monkeypatch)


@pytest.mark.parametrize("case", [["--format", "collapsed"], ["--format", "collapsed", "--vm", "nofp"],
                                  ["--format", "pprof", "--vm", "nofp"], ["--format", "json"],
                                  ["--children", "--vm", "nofp"]], ids=" ".join)
def test_streamed_report_of_stack_copies_is_the_whole_one(cfi: Path, case: list[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies unwound by call-frame information, piece by piece (their notes summed)."""
    same_both_ways(cfi, case, (4000, 9001), tmp_path, monkeypatch)


CUTS = [["--cpu", "0"], ["--cpu", "1", "-K"], ["--time-range", "0.7:2.1"], ["--time-range", "1.5:9"],
        ["--time-range", "0.3:1.9", "--vm", "stacks"], ["--time-range", "1:2.5", "--vm", "stacks", "--vcpu", "0"],
        ["--time-range", "0.5:2", "--cpu", "1"]]


# the VM's CPU is the host's choice: on the other one no call path has `solve` (--callers of one CPU: the test
# after, on the CPU where it ran)
CUT_CASES = [[*fmt, *cut] for fmt in (["--format", "collapsed"], ["--format", "json"], ["--children"],
                                      ["--callers", "solve"]) for cut in CUTS
             if not ("--callers" in fmt and "--cpu" in cut)]


@pytest.mark.parametrize("case", CUT_CASES, ids=" ".join)
def test_streamed_cut_call_stack_report_is_the_whole_one(fp: Path, case: list[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--cpu and --time-range of a recording with call stacks, read a piece at a time: its paths and stack notes
    are cut as its samples, byte for byte the whole read's."""
    same_both_ways(fp, case, (8000, 14283), tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def solve_cpu(fp: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CPU with the most samples whose call path has `solve` (where the host ran the demo VM's vCPU)."""
    out = tmp_path_factory.mktemp("solve_cpu") / "collapsed"
    solves = {}
    for cpu in np.unique(load(fp).samples["cpu"]).tolist():
        assert main(["report", str(fp), "--format", "collapsed", "--cpu", str(cpu), "-o", str(out)]) == 0
        paths = (line.rsplit(b" ", 1) for line in out.read_bytes().splitlines())
        solves[str(cpu)] = sum(int(n) for path, n in paths if b"solve" in path.split(b";"))
    cpu = max(solves, key=solves.get)
    assert solves[cpu] > 100, solves
    return cpu


@pytest.mark.parametrize("cut", [[], ["-K"], ["--time-range", "0.5:2"], ["--time-range", "1:2.5", "-K"]], ids=" ".join)
def test_streamed_callers_of_the_cpu_that_ran_solve_are_the_whole_ones(fp: Path, solve_cpu: str, cut: list[str],
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--callers solve --cpu of the CPU where solve ran the most (taken from the recording): paths cut by CPU."""
    whole = same_both_ways(fp, ["--callers", "solve", "--cpu", solve_cpu, *cut], (8000, 14283), tmp_path,
                           monkeypatch)
    assert b"solve" in whole


def test_streamed_cut_report_of_stack_copies_is_the_whole_one(cfi: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for cut in (["--cpu", "1"], ["--time-range", "0.8:2.2", "--vm", "nofp"]):
        same_both_ways(cfi, ["--format", "collapsed", *cut], (4000, 9001), tmp_path, monkeypatch)


def test_notes_that_pieces_do_not_add_up_give_up_the_stream(fp: Path) -> None:
    """A note without a count (a table that could not be read) or a count of distinct chains: read whole."""
    scanned = scan(fp, stacks=True)
    assert scanned is not None
    an = StreamedCallGraph(scanned, piece_rows=WHOLE)
    for note in ("libfoo.so: bad .eh_frame: its frames unwind by frame pointers",
                 "3 host stack ids had no stored chain (the stack map was read after they were replaced or the "
                 "recording was cut): those chains are left out"):
        with pytest.raises(WholeNeeded):
            an._add_notes(SampleStacks(an.rec.samples["cpu"][:0], notes=[note]))
    an._add_notes(SampleStacks(an.rec.samples["cpu"][:0], notes=["2 host user-mode samples have no user chain"]))
    an._add_notes(SampleStacks(an.rec.samples["cpu"][:0], notes=["3 host user-mode samples have no user chain"]))
    assert "5 host user-mode samples have no user chain" in an._notes("host")


def test_a_note_counting_what_resolve_stacks_does_not_write_gives_up_the_stream(fp: Path) -> None:
    """A counted note that no rank knows would be summed and put at the end: read whole instead."""
    scanned = scan(fp, stacks=True)
    assert scanned is not None
    an = StreamedCallGraph(scanned, piece_rows=WHOLE)
    for note in ("7 guest chains met something new", "2 guest chains unwound by call-frame information end "
                 "[partial]: a reason unwind.REASONS does not have"):
        with pytest.raises(WholeNeeded):
            an._add_notes(SampleStacks(an.rec.samples["cpu"][:0], notes=[note]))
    an._add_notes(SampleStacks(an.rec.samples["cpu"][:0], level_notes={"guest": [
        "2 guest chains unwound by call-frame information end [partial]: a return address in no mapped object"]}))
    assert "2 guest chains unwound by call-frame information end [partial]: a return address in no mapped " \
        "object" in an._notes("guest")


def guest_only(s: np.ndarray) -> np.ndarray:
    """The guest samples (as -K keeps a mode's): no host process is resolved, so none of their notes, which a
    stream meets as the host's processes come and go on this shared machine, gives up a stream built here."""
    return (s["flags"] & SAMPLE_GUEST) != 0


def streamed(rec: Path, piece_rows: int, **kw: object) -> StreamedCallGraph:
    scanned = scan(rec, stacks=True)
    assert scanned is not None
    return StreamedCallGraph(scanned, piece_rows=piece_rows, keep=guest_only, **kw)  # type: ignore[arg-type]


def test_stack_copies_in_pieces_read_each_call_frame_table_once(cfi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One set of unwind rules serves every piece (resolve.stacks.Unwinding): each object's and each guest
    kernel's call-frame table is read once, not once a piece, and the paths are those of one piece."""
    whole = streamed(cfi, WHOLE, level="guest", vm="nofp")
    reads: Counter = Counter()
    for module in (unwind, resolve_stacks):
        real = module.read_cfi
        monkeypatch.setattr(module, "read_cfi", lambda path, *a, real=real: reads.update([str(path)]) or real(path, *a))
    pieces_of = streamed(cfi, 2000, level="guest", vm="nofp")
    assert whole.pieces == 1 and pieces_of.pieces > 3
    assert reads and set(reads.values()) == {1}, reads
    for vcpu in (None, 0):
        a, b = whole.weighted("guest", "nofp", vcpu), pieces_of.weighted("guest", "nofp", vcpu)
        assert (a.paths, a.counts.tolist(), a.first, a.notes()) == (b.paths, b.counts.tolist(), b.first, b.notes())
        assert len(a.paths) > 1


def test_stack_notes_are_summed_without_making_the_paths(fp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's stack notes (cli/report.py with_stack_notes) are the counts of the paths', not made of the paths
    sorted and merged (weighted), with paths and without, the same as weighted's notes."""
    with_paths, counts_only = (streamed(fp, 8000, level=level, paths=paths)
                               for level, paths in (("host", True), ("host", False)))
    guest = streamed(fp, 8000, level="guest", paths=True)
    cases = [(with_paths, "host", None, None), (counts_only, "host", None, None), (guest, "guest", "stacks", None),
             (guest, "guest", "stacks", 0)]
    expected = [an.weighted(level, vm, vcpu).notes() for an, level, vm, vcpu in cases]
    assert any("partial" in note for notes in expected for note in notes)  # the clobber program's stacks
    assert expected[0] == expected[1]
    monkeypatch.setattr(StreamedCallGraph, "_merged", lambda *a: pytest.fail("paths made for notes"))
    assert [an.stack_notes_of(level, vm, vcpu) for an, level, vm, vcpu in cases] == expected


def test_tables_of_a_stack_recording_sum_no_vcpu_thread_rows(fp: Path) -> None:
    """Table, JSON and CSV (paths=False) read no host-level VM row split into its vCPU threads' rows: not summed."""
    assert streamed(fp, 8000, level="host", paths=True).vm_parts
    assert not streamed(fp, 8000, level="host", paths=False).vm_parts
