"""`vmprof steal` of a recording whose samples are read a piece at a time (analyse/stream_steal.py) against the same
report of the whole recording (the reference): byte for byte, as table and JSON, for every VM.  The recordings are
a synthetic one with every kind of blank (halts woken or not, halt polling, preemptions by host tasks and by a
sibling vCPU with the pCPU's IRQs, throttling, the VMM blocked), some of them open across several pieces, and the
stored demo recording of three VMs (tests/data/golden)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synth import BASE_NS, GUEST_CR3, MS, VMX_EPT_VIOLATION, VMX_IO, VMX_MSR_WRITE, SynthRecording, busy_recording

from vmprof_tui.analyse import stream
from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.stream_steal import StreamedSteal
from vmprof_tui.cli import main
from vmprof_tui.record.bpf_records import SCHED_HALT_END, SCHED_NOT_SWITCH, SCHED_PREV_RUNNABLE
from vmprof_tui.record.recording import load
from vmprof_tui.record.stream import pieces, scan
from vmprof_tui.resolve.prepare import prepare, recording_end, recording_span

SLOT = 7 * MS  # not a multiple of the period: runs and blanks end between samples
GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"


def varied_recording(path: Path, seconds: float, unrecorded: tuple[float, float] | None = None) -> Path:
    """2 VMs of 2 vCPUs on 3 CPUs (web's two share CPU 1: a sibling holds the pCPU; db's share CPU 2), guest
    processes by CR3, and off each CPU every kind of blank.  Three are long, across several pieces (500 ms each):
    web's vCPU 0 preempted over [30%, 55%) with IRQs on its CPU, db's vCPU 0 halted over [60%, 80%) and woken near
    the end, db's vCPU 1 throttled over [40%, 52%) with the kernel's throttled time recorded when it runs again.
    unrecorded: over this part of the recording (shares of it) the switches out of web's vCPU 0 and into its vCPU 1
    are lost (a switch-in after a switch-in, a switch-out after a switch-out)."""
    rng = np.random.default_rng(11)
    b = SynthRecording(frequency=1000, cpus=3)
    web = b.vm("web", pid=100, vcpus={0: 101, 1: 102})
    if unrecorded is not None:
        sched, (lost_from, lost_to) = b.sched, (BASE_NS + int(seconds * 1e9 * x) for x in unrecorded)

        def lost() -> np.ndarray:
            t = sched()
            gone = ((t["time_ns"] >= lost_from) & (t["time_ns"] < lost_to) & ((t["flags"] & SCHED_NOT_SWITCH) == 0)
                    & ((t["prev_tid"] == 101) | (t["next_tid"] == 102)))
            return t[~gone]

        b.sched = lost
    db = b.vm("db", pid=200, vcpus={0: 201, 1: 202})
    cr3s = [GUEST_CR3, 0x2000, 0x3000]
    for vm in (web, db):
        for pid, name, cr3 in zip((1, 50, 60), ("init", "nginx", "postgres"), cr3s, strict=True):
            b.guest_process(vm, pid, name, cr3)
    vcpus = [(web, 0, 1), (web, 1, 1), (db, 0, 2), (db, 1, 2)]  # (VM, vCPU, its CPU)
    slots = int(seconds * 1e9) // SLOT
    long_off = {0: (30, 55), 2: (60, 80), 3: (40, 52)}  # vCPU index -> % of the recording it stays off its CPU
    off = {i: range(slots * a // 100, slots * z // 100) for i, (a, z) in long_off.items()}
    runs = np.zeros((len(vcpus), slots), bool)
    in_user = np.zeros((len(vcpus), slots), bool)  # ran in VMM user space at the end of the slot
    for slot in range(slots):
        t0, t1 = slot * SLOT, (slot + 1) * SLOT
        b.host_task(500 + slot % 3, "app", cpu=0, start_ns=t0, end_ns=t1, kernel=bool(slot % 2))
        for cpu in (1, 2):
            mine = [i for i, v in enumerate(vcpus) if v[2] == cpu and slot not in off.get(i, ())]
            choice = int(rng.integers(0, 4))
            if choice >= len(mine):
                if choice == 3:
                    b.host_task(600 + cpu, "worker", cpu=cpu, start_ns=t0, end_ns=t1)
                continue
            vm, vcpu, _cpu = vcpus[mine[choice]]
            runs[mine[choice], slot] = True
            split = t0 + int(rng.integers(1, SLOT // MS)) * MS
            b.run(vm, vcpu, cpu=cpu, start_ns=t0, end_ns=split, kernel=bool(rng.integers(0, 2)),
                  guest_cr3=cr3s[int(rng.integers(0, 3))])
            in_user[mine[choice], slot] = not rng.integers(0, 3)
            b.vmm_work(vm, vcpu, cpu=cpu, start_ns=split, end_ns=t1,
                       exit_reason=(VMX_IO, VMX_MSR_WRITE, VMX_EPT_VIOLATION)[int(rng.integers(0, 3))],
                       in_kernel=not in_user[mine[choice], slot])
            if rng.random() < 0.2:  # a short halt that polling ended while the thread ran
                b.halt_end(vm, vcpu, split - MS // 2, 50_000, polled=True)
    for cpu in (1, 2):  # the pCPUs' interrupts, now and then
        for t in rng.integers(0, slots * SLOT - MS, 300).tolist():
            b.irq(cpu, t, t + int(rng.integers(5_000, 80_000)))
    for i, (vm, vcpu, _cpu) in enumerate(vcpus):  # each stretch off the CPU
        edges = np.flatnonzero(np.diff(np.concatenate([[1], runs[i].astype(int), [1]])))
        for a, z in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            lo, hi = a * SLOT, z * SLOT
            last = z >= slots
            r = 0.0 if last else rng.random()
            if i in off and a <= off[i].start < z:  # the long ones
                r = {0: 0.6, 2: 0.0, 3: 0.8}[i]
            if r < 0.45 and a > 0 and in_user[i, a - 1]:  # a halt leaves from KVM, not from VMM user space
                r = 0.95
            if r < 0.35:
                wake = hi - MS // 2 if i == 2 else lo + int(rng.integers(0, hi - lo))
                b.halt(vm, vcpu, start_ns=lo, end_ns=hi, wakeup_ns=None if last else wake)
                if not last:
                    b.halt_end(vm, vcpu, wake, wake - lo, polled=False)
            elif r < 0.45:
                b.halt(vm, vcpu, start_ns=lo, end_ns=hi)
                b.throttled_wakeup(vm, vcpu, lo + (hi - lo) // 3, hi, (hi - lo) // 4)
            elif r < 0.75:
                b.preempt(vm, vcpu, start_ns=lo, end_ns=hi)
            elif r < 0.9:
                b.preempt(vm, vcpu, start_ns=lo, end_ns=hi, throttled=True, throttled_ns=(hi - lo) // 2)
            else:
                b.block(vm, vcpu, start_ns=lo, end_ns=hi)
    return b.write(path)


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return varied_recording(tmp_path_factory.mktemp("stream_steal") / "varied.vmprof", 6.0)


def steal(args: list[str], piece_rows: int, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
          streamed: bool) -> str:
    """`vmprof steal`'s output, checking that it was read a piece at a time to the end (streamed) or whole."""
    made = []
    init = StreamedSteal.__init__
    monkeypatch.setattr(stream, "PIECE_ROWS", piece_rows)
    monkeypatch.setattr(StreamedSteal, "__init__", lambda self, *a, **k: init(self, *a, **k) or made.append(1))
    assert main(["steal", *args]) == 0
    assert bool(made) == streamed
    return capsys.readouterr().out


CASES = [["--format", "json"], ["--format", "table"], ["--vm", "db", "--format", "json"]]


@pytest.mark.parametrize("case", CASES, ids=" ".join)
@pytest.mark.parametrize("piece_rows", [1000, 1733, 4000])
def test_streamed_steal_is_the_whole_steal(varied: Path, case: list[str], piece_rows: int,
                                           capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(varied), *case]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert steal(args, piece_rows, capsys, monkeypatch, streamed=True) == whole


def test_varied_recording_has_blanks_open_across_pieces(varied: Path) -> None:
    """What the byte-for-byte test stands on: many pieces, blanks of every cause, and blanks open across a piece
    edge (a halt woken in a later piece, a preemption with IRQ time, a throttled wait ended by the kernel's count
    in a later piece)."""
    scanned = scan(varied)
    edges = [p.hi for p in pieces(scanned, 1000, lambda a, z: recording_end(a, z, scanned.rec.end))][:-1]
    assert len(edges) >= 10
    an = StreamedSteal(scanned, piece_rows=1000)
    assert an.pieces == len(edges) + 1
    whole = Analysis(prepare(load(varied))).timelines.values()  # the streamed let their blanks go once read
    crossing = {tl.vm: [b for b in tl.blanks if any(b.start_ns < e < b.end_ns for e in edges)] for tl in whole}
    long = {(tl.vm, tl.vcpu): max((b.duration_ns for b in tl.blanks), default=0) for tl in whole}
    assert long[("web", 0)] > 1_000 * MS and long[("db", 0)] > 1_000 * MS and long[("db", 1)] > 500 * MS
    kinds = {b.kind.name for blanks in crossing.values() for b in blanks}
    assert {"IDLE", "PREEMPTED", "THROTTLED"} <= kinds
    report = an.steal_report("web")
    v0 = report["vcpus"][0]
    assert v0["type1_by_cause_s"]["irq"] > 0 and v0["type1_by_cause_s"]["throttled"] > 0
    assert "vcpu1" in v0["type1_by_holder_s"] and v0["skew_s"] > 0 and v0["halts"] > 0
    assert any(a["attributed_steal_s"] > 0 for a in report["functions"])
    assert len({a["process"] for a in report["processes"]}) >= 3


@pytest.mark.parametrize("case", [["--format", "json"], ["--format", "table"]], ids=" ".join)
@pytest.mark.parametrize("piece_rows", [100, 500])
def test_streamed_steal_of_the_demo_recording_is_the_whole_steal(case: list[str], piece_rows: int,
                                                                 capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Three demo VMs (a real recording: guest names from bundles, halt polling, exits to the VMM)."""
    args = [str(GOLDEN), *case]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert steal(args, piece_rows, capsys, monkeypatch, streamed=True) == whole


@pytest.mark.parametrize("case", [["--format", "json"], ["--format", "table"]], ids=" ".join)
def test_streamed_steal_with_a_cpu_idle_before_its_first_switch(tmp_path: Path, case: list[str],
                                                                 capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4th CPU idle, with no switch on it, over the first pieces (its first switch leaves idle)."""
    args = [str(busy_recording(tmp_path / "late.vmprof", 6.0, late_cpu=True)), *case]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert steal(args, 1000, capsys, monkeypatch, streamed=True) == whole


def test_steal_of_a_vcpu_thread_the_vm_list_misses_is_read_whole(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A VM that only its samples name is known to the whole recording from all of them: read whole."""
    args = [str(busy_recording(tmp_path / "unlisted.vmprof", 6.0, unlisted_vm=True)), "--format", "json"]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert "vm-300" in whole
    assert steal(args, 1000, capsys, monkeypatch, streamed=False) == whole  # tried, given up


def test_streamed_steal_holds_no_samples(varied: Path) -> None:
    """What is kept across pieces is per vCPU thread and per key, not per sample: per key, arrays of integers (its
    sums and the string ids of its names), no Python objects."""
    an = StreamedSteal(scan(varied), piece_rows=1000)
    samples = scan(varied).samples
    for t in an.threads.values():
        assert len(t.by_function.keys) <= 10 and len(t.by_process.keys) <= 4
        for keyed in (t.by_function, t.by_process):
            assert keyed.sums.shape == (4, len(keyed.keys)) and keyed.names.shape == (3, len(keyed.keys))
            assert keyed.sums.dtype.kind == keyed.names.dtype.kind == "i"
            assert int(keyed.sums[0].sum()) == t.counts.guest
        assert t.counts.samples < samples
    assert not hasattr(an, "samples")


MANY_ROWS = [{"vm": "a", "functions": [{"function": f"f{i}", "s": i / 3, "n": None} for i in range(5000)]},
             {"vm": "b", "functions": [], "notes": ["a\nb"]}]


@pytest.mark.parametrize("reports", [[{"vm": "a", "x": [1, {"y": "two\nlines"}]}, {"vm": "b", "z": {}}],
                                     [{"vm": "a", "x": []}], MANY_ROWS, MANY_ROWS[:1]],
                         ids=["two VMs", "one VM", "rows in many blocks", "one VM in many blocks"])
def test_steal_json_written_a_vm_at_a_time_is_json_dumps(reports: list[dict]) -> None:
    """cli/steal.py writes each VM's report as it is made, a block of its text at a time: the same text as
    json.dumps of them all."""
    from vmprof_tui.cli.steal import _json

    many = len(reports) > 1
    parts = list(_json(iter(reports), many))
    assert "".join(parts) == json.dumps(reports if many else reports[0], indent=1) + "\n"
    assert max(map(len, parts)) < 1 << 17


def test_streamed_steal_inflates_each_sched_chunk_once_as_the_pieces_go(
        varied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sched events are read a chunk at a time beside the pieces of samples (record/stream.SchedReader), each
    chunk inflated once, and no timeline is built of all of them."""
    from vmprof_tui.analyse.timeline import Schedule
    from vmprof_tui.record import recording as fmt
    from vmprof_tui.record import stream as record_stream

    built, read = [], []
    timelines, read_tables = Schedule.timelines, record_stream._read_tables
    monkeypatch.setattr(Schedule, "timelines", lambda self, *a: built.append(1) or timelines(self, *a))
    monkeypatch.setattr(record_stream, "_read_tables",
                        lambda fd, group, dtypes: read.extend(group) or read_tables(fd, group, dtypes))
    scanned = scan(varied)
    an = StreamedSteal(scanned, piece_rows=1000)
    assert an.pieces >= 10 and not built
    sched = [c.offset for c in scanned.chunks if c.kind == fmt.SCHED]
    assert sched and sorted(c.offset for c in read if c.kind == fmt.SCHED) == sorted(sched)  # each once


def test_streamed_steal_keeps_what_it_reads_of_the_blanks_not_the_blanks(varied: Path) -> None:
    """Each blank is read once, as nothing later changes it (the steal blanks for the samples, the holders and the
    host's span for the report), and let go: no table, no Blank objects, no steal blank whose samples around it
    are known, no switch a preempted blank no longer needs."""
    an = StreamedSteal(scan(varied), piece_rows=1000)
    assert an.timelines and all(tl.table is None and tl._blanks is None for tl in an.timelines.values())
    assert all(len(t.starts) <= 1 for t in an.threads.values())
    assert not len(an.sched.pending) and not len(an.sched.holders.so_far[0])
    for vm in an.vm_names():
        assert an.steal_report(vm)["vcpus"]


def test_streamed_steal_carries_what_is_open_at_a_piece_edge_not_the_pieces_before(
        varied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is carried from piece to piece is bounded by what is open at the edge, not by the pieces before: at
    most one pending blank per vCPU thread; per open preempted blank, what held its CPU summed by holder; per
    thread, the steal blanks waiting for their samples and the polling stretches of its recent halts."""
    from vmprof_tui.analyse.stream_sched import SchedStream

    sizes = []
    advance = SchedStream.advance

    def watched(self: SchedStream, *a: object) -> object:
        step = advance(self, *a)
        sizes.append((len(self.pending), len(self.holders.so_far[0]), max(len(iv) for iv in self.poll_iv)))
        return step

    monkeypatch.setattr(SchedStream, "advance", watched)
    an = StreamedSteal(scan(varied), piece_rows=1000)
    threads = len(an.sched.tids)
    assert len(sizes) >= 10
    assert max(p for p, _h, _v in sizes) <= threads
    # the long preemption (web's vCPU 0 over a quarter of the recording), the short ones open at an edge: a sum
    # per holder of each one's CPU, not its switches
    assert 0 < max(h for _p, h, _v in sizes) <= 2 * threads
    assert max(v for _p, _h, v in sizes) < int(an.sched.halts.sum()) / 4


@pytest.mark.parametrize("recording", ["varied", "golden"])
def test_holders_found_a_few_cpus_at_a_time_are_those_of_every_cpu_at_once(
        recording: str, varied: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schedule._pcpu_holders sets a few CPUs' switches against their waits at a time (timeline.HOLDER_CPUS): one
    CPU at a time, the report (holders, co-stop, steal by cause) is that of every CPU at once."""
    from vmprof_tui.analyse import timeline

    args = [str(varied if recording == "varied" else GOLDEN), "--format", "json"]
    monkeypatch.setattr(timeline, "HOLDER_CPUS", 1 << 10)
    at_once = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    monkeypatch.setattr(timeline, "HOLDER_CPUS", 1)
    assert steal(args, 1 << 30, capsys, monkeypatch, streamed=False) == at_once
    assert '"vcpu1"' in at_once or recording == "golden"


def test_streamed_steal_with_unrecorded_switches_is_the_whole_steal(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Switches lost over a part of the recording: a switch-in after a switch-in of web's vCPU 0, a switch-out after
    a switch-out of its vCPU 1.  A stretch open at a piece's edge that counted in co-stop as a run or a wait and
    turns out to be none makes the pieces give up (read whole); else they go on: the report is the whole
    read's either way."""
    from vmprof_tui.analyse.stream_sched import SchedStream

    rec = varied_recording(tmp_path / "unrecorded.vmprof", 6.0, unrecorded=(0.2, 0.25))
    args = [str(rec), "--format", "json"]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    gave_up = []
    records = SchedStream._records

    def watched(self: SchedStream, *a: object) -> object:
        try:
            return records(self, *a)
        except stream.WholeNeeded:
            gave_up.append(1)
            raise

    monkeypatch.setattr(SchedStream, "_records", watched)
    outcomes = set()
    for rows in (1000, 1733, 4000):
        gave_up.clear()
        monkeypatch.setattr(stream, "PIECE_ROWS", rows)
        assert main(["steal", *args]) == 0
        assert capsys.readouterr().out == whole
        outcomes.add(bool(gave_up))
    assert outcomes == {True, False}  # with these edges: given up, and gone on past the lost switches


def test_steal_split_of_blanks_in_parts_carried_on_is_that_of_all_at_once(varied: Path) -> None:
    """blanks.steal_split of a table cut into parts, each part's split added on to the split so far (carried),
    is the split of the whole table: the same causes in the same order, each sum the same float."""
    from vmprof_tui.analyse.blanks import steal_split
    from vmprof_tui.analyse.stream_sched import select_rows

    an = Analysis(prepare(load(varied)))
    table = next(iter(an.timelines.values())).table
    units = np.ones(len(an.timelines))
    whole = steal_split(table, units)
    # parts cut by time: each timeline's blanks go into the parts in their order
    edges = np.quantile(table.start, [0.2, 0.45, 0.7]).astype(np.int64).tolist()
    bounds = [np.iinfo(np.int64).min, *edges, np.iinfo(np.int64).max]
    carried = None
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        rows = np.flatnonzero((table.start >= lo) & (table.start < hi))
        carried = steal_split(select_rows(table, rows), units, carried)
    assert [list(d.items()) for d in carried] == [list(d.items()) for d in whole]
    assert any(len(d) > 3 for d in whole) and len(table.held_blank)


# 500 ms pieces at 1000 rows: inside pieces, on their edges, one piece's inside, to the end and past it, from the
# start; on slot edges (7 ms: switches and samples at the range's very start and end)
RANGES = ["1.25:3.7", "1:2", "0.3:0.31", "2.6:6", "4.2:100", "0:0.75", "5.9:6.5", "0.7:2.1", "1.75:3.5", "3:1e300"]


@pytest.mark.parametrize("case", CASES, ids=" ".join)
@pytest.mark.parametrize("span", RANGES)
def test_streamed_steal_of_a_time_range_is_the_whole_steal(varied: Path, span: str, case: list[str],
                                                           capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--time-range cuts the samples and the timelines as the whole read cuts them (the long blanks of
    varied_recording open across the ranges' edges: test_time_ranges_cut_blanks_open_across_their_edges)."""
    args = [str(varied), "--time-range", span, *case]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    for rows in (1000, 1733, 4000):
        assert steal(args, rows, capsys, monkeypatch, streamed=True) == whole, rows


def test_time_ranges_cut_blanks_open_across_their_edges(varied: Path) -> None:
    """What the time-range test stands on: long blanks (web's vCPU 0 preempted over [1.8, 3.3) s, db's vCPU 1
    throttled over [2.4, 3.12) s, db's vCPU 0 halted over [3.6, 4.8) s) are open across range edges, and a range
    edge falls on a piece edge (1000 rows: 500 ms pieces)."""
    scanned = scan(varied)
    edges = [p.hi for p in pieces(scanned, 1000, lambda a, z: recording_end(a, z, scanned.rec.end))][:-1]
    rec = load(varied)
    first = recording_span(rec)[0]
    whole = Analysis(prepare(rec)).timelines.values()
    cuts = {float(x) for span in RANGES for x in span.split(":") if float(x) < 100}
    crossing = {cut for cut in cuts for tl in whole for b in tl.blanks
                if b.duration_ns > 300 * MS and b.start_ns < first + cut * 1e9 < b.end_ns}
    assert {2.0, 2.6, 3.7, 4.2} <= crossing
    assert any(abs(e - (first + cut * 1e9)) < MS for cut in cuts for e in edges)
    at = {cut for cut in cuts if first + round(cut * 1e9) in set(rec.sched["time_ns"].tolist())}
    assert {0.7, 1.75, 3.5} <= at  # a switch at the range's start or end


@pytest.mark.parametrize("span", ["7:8", "6.5:9", "1e300:2e300"])
def test_streamed_steal_of_a_range_after_the_end_fails_as_the_whole(varied: Path, span: str,
                                                                    capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lines = []
    for rows in (1 << 30, 1000):
        monkeypatch.setattr(stream, "PIECE_ROWS", rows)
        assert main(["steal", str(varied), "--time-range", span]) == 1
        lines.append(capsys.readouterr().err)
    assert lines[0] == lines[1] and lines[0].count("\n") == 1 and "starts after the end" in lines[0]


@pytest.mark.parametrize("case", [["--format", "json"], ["--format", "table", "--vm", "steal2"]], ids=" ".join)
@pytest.mark.parametrize("span", ["0.5:1.5", "0:0.3", "1.2:5"])
def test_streamed_steal_of_a_time_range_of_the_demo_recording_is_the_whole_steal(
        span: str, case: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(GOLDEN), "--time-range", span, *case]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    for rows in (100, 500):
        assert steal(args, rows, capsys, monkeypatch, streamed=True) == whole, rows


def test_streamed_steal_of_a_time_range_reads_no_samples_after_it(varied: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a piece reaches past the range's end no more pieces of samples are read, but every sched event is (the
    timelines' ends need the switches after it); a range to the end reads every piece."""
    from vmprof_tui.analyse import stream_steal
    from vmprof_tui.record import recording as fmt
    from vmprof_tui.record import stream as record_stream

    read, inflated = [], []
    pieces_of, read_tables = stream_steal.pieces, record_stream._read_tables

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        for piece in pieces_of(*args, **kwargs):
            read.append(piece.lo)
            yield piece

    monkeypatch.setattr(stream_steal, "pieces", counted)
    monkeypatch.setattr(record_stream, "_read_tables",
                        lambda fd, group, dtypes: inflated.extend(group) or read_tables(fd, group, dtypes))
    scanned = scan(varied)
    whole = StreamedSteal(scanned, piece_rows=1000)
    all_pieces = len(read)
    read.clear()
    inflated.clear()
    an = StreamedSteal(scanned, piece_rows=1000, time_range=(1.0, 2.0))
    # 500 ms pieces: two before, two in the range, the one past its end (which shows it ends) and the one read ahead
    assert len(read) == 6 < all_pieces
    sched = [c.offset for c in scanned.chunks if c.kind == fmt.SCHED]
    assert sorted(c.offset for c in inflated if c.kind == fmt.SCHED) == sorted(sched)
    assert [v["halts"] for v in an.steal_report("db")["vcpus"]] < [v["halts"] for v in whole.steal_report("db")[
        "vcpus"]]
    read.clear()
    StreamedSteal(scanned, piece_rows=1000, time_range=(4.2, 100.0))
    assert len(read) == all_pieces


@pytest.mark.parametrize("span", ["1:2", "0.5:4", "1.3:1.6"])
def test_streamed_steal_of_a_time_range_with_unrecorded_switches_is_the_whole_steal(
        tmp_path: Path, span: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switches lost over [1.2, 1.5) s (varied_recording's `unrecorded`): read in pieces or given up and read
    whole, the range's report is the whole read's."""
    rec = varied_recording(tmp_path / "unrecorded.vmprof", 6.0, unrecorded=(0.2, 0.25))
    args = [str(rec), "--format", "json", "--time-range", span]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    for rows in (1000, 1733, 4000):
        monkeypatch.setattr(stream, "PIECE_ROWS", rows)
        assert main(["steal", *args]) == 0
        assert capsys.readouterr().out == whole, rows


def test_holders_of_a_blank_never_closed_are_summed_not_kept(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted vCPU never switched back in (as a lost switch-in record leaves it) while its CPU switches
    between two host tasks and idle every 2 ms: what held it is carried as a sum per holder, not as the switches
    (which the pieces rescanned), and the report is the whole read's, the two tasks (of equal time, the one first
    on the CPU last by name) in the same order."""
    from vmprof_tui.analyse.stream_sched import SchedStream

    b = SynthRecording(cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=500 * MS)
    b.preempt(web, 0, start_ns=500 * MS, end_ns=8000 * MS)
    for k in range(500, 8000, 2):
        b.host_task(700 + (k // 2) % 2, ("hogb", "hoga")[(k // 2) % 2], cpu=1, start_ns=k * MS, end_ns=(k + 1) * MS)
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=8000 * MS)
    rec = b.write(tmp_path / "held.vmprof")
    sizes = []
    advance = SchedStream.advance

    def watched(self: SchedStream, *a: object) -> object:
        step = advance(self, *a)
        sizes.append(len(self.holders.so_far[0]))
        return step

    monkeypatch.setattr(SchedStream, "advance", watched)
    StreamedSteal(scan(rec), piece_rows=2000)
    assert len(sizes) >= 5 and max(sizes) <= 3
    for case in CASES[:2]:
        for span in ([], ["--time-range", "1:3.5"]):
            args = [str(rec), *span, *case]
            whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
            assert steal(args, 2000, capsys, monkeypatch, streamed=True) == whole
            assert "hogb" in whole and "hoga" in whole


def test_steal_of_a_time_range_counts_the_halts_and_irq_time_in_it(varied: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With --time-range, `halts` and `halts_ended_by_polling` count the halts that ended in the range [A, B], and
    `irq_while_running_s` is the runs' IRQ time inside it (a run's share in proportion, so that of two ranges that
    meet adds up to the whole's), read whole and in pieces alike; before, all three were of the whole recording."""
    rec = load(varied)
    halt_ends = rec.sched[(rec.sched["flags"] & SCHED_NOT_SWITCH) == SCHED_HALT_END]

    def vcpus(span: str | None) -> dict[int, dict]:
        args = [str(varied), "--format", "json", *(["--time-range", span] if span else [])]
        whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
        assert steal(args, 1000, capsys, monkeypatch, streamed=True) == whole
        return {v["tid"]: v for r in json.loads(whole) for v in r["vcpus"]}

    full = vcpus(None)
    parts = {span: vcpus(span) for span in ("0:2.5", "2.5:6", "1:2")}
    for span, got in parts.items():
        lo, hi = Analysis(prepare(rec, time_range=tuple(map(float, span.split(":"))))).range_ns
        for tid, v in got.items():
            t = halt_ends["time_ns"].astype(np.int64)
            mine = halt_ends[(halt_ends["prev_tid"] == tid) & (t >= lo) & (t <= hi)]
            assert v["halts"] == len(mine) < full[tid]["halts"], (span, tid)
            assert v["halts_ended_by_polling"] == int(np.count_nonzero(mine["flags"] & SCHED_PREV_RUNNABLE))
    for tid, v in full.items():
        assert parts["0:2.5"][tid]["halts"] + parts["2.5:6"][tid]["halts"] == v["halts"]
        irq = parts["0:2.5"][tid]["irq_while_running_s"] + parts["2.5:6"][tid]["irq_while_running_s"]
        assert irq == pytest.approx(v["irq_while_running_s"], rel=1e-12, abs=0), tid
        assert parts["1:2"][tid]["irq_while_running_s"] < v["irq_while_running_s"]


def test_irq_time_while_running_of_pieces_adds_up_to_the_whole(varied: Path) -> None:
    """The fleet's one pass analyses a window in pieces, each a Schedule cut to the piece's span: a run across a
    piece's edge gives each piece its part of its IRQ time (it was counted whole in both), so they add up to the
    whole read's exactly."""
    from vmprof_tui.fleet.one_pass import WindowPass

    whole = {(tl.vm, tl.vcpu): tl.irq_running_ns for tl in Analysis(prepare(load(varied))).timelines.values()}
    one = WindowPass(varied, piece_rows=1000)
    assert one.pieces > 5 and all(whole.values())
    assert {(vm, vcpu): s.irq_running_ns for (vm, vcpu, _tid), s in one.steal.items()} == whole


def far_recording(path: Path, far_ns: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """busy_recording with one more sched event, at far_ns of the host clock (a copy of the last one of the 3rd
    flush, at 1-1.5 s): a hostile timestamp far after every other record."""
    from vmprof_tui.record.writer import Writer

    add, flushes = Writer.add, []

    def one_far(self: Writer, samples: np.ndarray, sched: np.ndarray, *args: object, **kwargs: object) -> None:
        flushes.append(1)
        if len(flushes) == 3:
            far = sched[-1:].copy()
            far["time_ns"] = far_ns
            sched = np.concatenate([sched, far])
        add(self, samples, sched, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Writer, "add", one_far)
        busy_recording(path, 6.0)
    assert far_ns >= 1 << 63 or int(load(path).sched["time_ns"].max()) > BASE_NS + 10**13
    return path


@pytest.mark.parametrize("far_ns", [BASE_NS + 10**14, 1 << 62, (1 << 64) - 1])
def test_streamed_steal_of_a_time_range_skips_a_gap_with_no_sched_events(
        tmp_path: Path, far_ns: int, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the range's end the sched events are read in stretches that follow them, not the clock: a gap of
    1e14 or 2^62 ns before the last one is one stretch more than the whole recording's pieces (not gap ÷ the
    pieces' length), and the report is the whole read's.  One past 2^63 ns (the int64 clock the stretches end on)
    is left to the whole read."""
    from vmprof_tui.analyse.stream_sched import SchedStream

    rec = far_recording(tmp_path / "far.vmprof", far_ns, monkeypatch)
    stretches = []
    advance = SchedStream.advance

    def counted(self: SchedStream, *args: object, **kwargs: object) -> object:
        stretches.append(1)
        assert len(stretches) < 1000, "the stretches follow the clock"
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(SchedStream, "advance", counted)
    pieces_of_all = len(list(pieces(scan(rec), 1000, lambda a, z: z, sched=False)))
    args = [str(rec), "--time-range", "1:2", "--format", "json"]
    whole = steal(args, 1 << 30, capsys, monkeypatch, streamed=False)
    stretches.clear()
    assert steal(args, 1000, capsys, monkeypatch, streamed=far_ns < 1 << 63) == whole
    assert 0 < len(stretches) <= pieces_of_all + 1


@pytest.mark.parametrize("command", [["steal", "--format", "json"], ["report", "--format", "json"],
                                     ["steal", "--time-range", "1:2"], ["report", "--format", "chrome"]],
                         ids=" ".join)
def test_a_chunk_with_a_time_past_2_to_the_63_ns_is_skipped_with_a_note(
        tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """No host clock reads 2^63 ns: a sched chunk holding such a time (hostile or damaged) is skipped with one note
    in the whole read, and a read a piece at a time gives way to it: the same text, no traceback."""
    rec = far_recording(tmp_path / "far.vmprof", (1 << 64) - 1, monkeypatch)
    assert any("past 2^63 ns" in p for p in load(rec).problems)
    outputs = []
    for piece_rows in (1 << 30, 1000):
        monkeypatch.setattr(stream, "PIECE_ROWS", piece_rows)
        assert main([command[0], str(rec), *command[1:]]) == 0
        outputs.append(capsys.readouterr())
    assert outputs[0] == outputs[1]
