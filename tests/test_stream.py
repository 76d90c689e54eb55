"""`vmprof report` of a recording read a piece at a time (analyse/stream.py) against the same report of the
whole recording (the reference): byte for byte, at the host and guest levels, in every format made from the
summaries.  The recording is synthetic (tests/synth.py) and long enough for many pieces: vCPUs run, halt (with
wake-ups and KVM's halt-end records), are preempted by host tasks and by each other, and exit to KVM, across
piece boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import MS, VMX_IO, SynthRecording

from vmprof_tui.analyse import stream
from vmprof_tui.analyse.stream import StreamedAnalysis
from vmprof_tui.cli import main
from vmprof_tui.record.stream import scan

SLOT = 7 * MS  # not a multiple of the period: runs and blanks end between samples


def busy_recording(path: Path, seconds: float = 6.0) -> Path:
    """2 VMs of 2 vCPUs on 3 CPUs; in each slot a CPU runs one of its vCPUs (guest code, then KVM), a host task or
    nothing; a vCPU off its CPU is halted (woken before it runs again) or preempted."""
    rng = np.random.default_rng(7)
    b = SynthRecording(frequency=1000, cpus=3)
    web = b.vm("web", pid=100, vcpus={0: 101, 1: 102})
    db = b.vm("db", pid=200, vcpus={0: 201, 1: 202})
    vcpus = [(web, 0, 1), (web, 1, 2), (db, 0, 1), (db, 1, 2)]  # (VM, vCPU, its CPU)
    slots = int(seconds * 1e9) // SLOT
    runs = np.zeros((len(vcpus), slots), bool)
    for slot in range(slots):
        t0, t1 = slot * SLOT, (slot + 1) * SLOT
        b.host_task(500 + slot % 3, "app", cpu=0, start_ns=t0, end_ns=t1, kernel=bool(slot % 2))
        for cpu in (1, 2):
            mine = [i for i, v in enumerate(vcpus) if v[2] == cpu]
            choice = int(rng.integers(0, 4))
            if choice == 2:
                b.host_task(600 + cpu, "worker", cpu=cpu, start_ns=t0, end_ns=t1)
            elif choice < 2:
                vm, vcpu, _cpu = vcpus[mine[choice]]
                runs[mine[choice], slot] = True
                split = t0 + int(rng.integers(1, SLOT // MS)) * MS
                b.run(vm, vcpu, cpu=cpu, start_ns=t0, end_ns=split, kernel=bool(rng.integers(0, 2)))
                b.vmm_work(vm, vcpu, cpu=cpu, start_ns=split, end_ns=t1, exit_reason=VMX_IO)
    for i, (vm, vcpu, _cpu) in enumerate(vcpus):  # each stretch off the CPU: a halt or a preemption
        edges = np.flatnonzero(np.diff(np.concatenate([[1], runs[i].astype(int), [1]])))
        for a, z in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            lo, hi = a * SLOT, z * SLOT
            if rng.random() < 0.6:
                b.halt(vm, vcpu, start_ns=lo, end_ns=hi, wakeup_ns=hi - MS // 2 if z < slots else None)
                if z < slots:
                    b.halt_end(vm, vcpu, hi - MS // 2, hi - MS // 2 - lo, polled=False)
            else:
                b.preempt(vm, vcpu, start_ns=lo, end_ns=hi)
    return b.write(path)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_recording(tmp_path_factory.mktemp("stream") / "busy.vmprof")


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


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_streamed_report_is_the_whole_report(recording: Path, case: list[str], capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(recording), "--format", *case]
    whole = report(args, 1 << 30, capsys, monkeypatch, streamed=False)
    assert len(whole.splitlines()) >= 4  # rows, not only a header
    assert report(args, 1000, capsys, monkeypatch, streamed=True) == whole
    assert report(args, 1733, capsys, monkeypatch, streamed=True) == whole


def test_streamed_analysis_reads_pieces_in_bounded_memory(recording: Path) -> None:
    """The pieces follow each other in time and together hold every record once; the summaries kept across them
    are the distinct rows, not the samples."""
    scanned = scan(recording)
    an = stream.StreamedAnalysis(scanned, piece_rows=1000)  # the host level
    assert an.pieces == 12  # a piece per sample chunk (500 ms of 3 CPUs)
    total = an.host_profile().total_samples
    assert total == pytest.approx(scanned.samples, abs=1)  # idle from sched events replaces the idle samples
    assert len(an.host_rows.all.codes) < 50
