"""The analysis on synthetic recordings (tests/synth.py) whose every number is known: host ratios, vCPU
timelines and blanks, steal by holder and by cause, idle, attribution and corrected times, time ranges.
The expected values are worked out by hand from each schedule (1 kHz: one sample per ms on a busy CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import MS, SynthRecording

from vmprof_tui.analyse.analysis import Analysis, Profile
from vmprof_tui.analyse.kinds import BlankKind, RowKind
from vmprof_tui.analyse.steal import steal_report, vcpu_steal
from vmprof_tui.record import recording


def rows(profile: Profile) -> dict[tuple[str, str], float]:
    """(function, module) -> samples of the rows with any (the steal split also lists causes at 0)."""
    return {(r.function, r.module): r.samples for r in profile.rows if r.samples}


def blanks(an: Analysis, vm: str, vcpu: int = 0) -> list[tuple[str, int, int]]:
    (tl,) = an.vm_timelines(vm, vcpu)
    return [(str(b.kind), b.start_ns // MS, b.end_ns // MS) for b in tl.blanks]


def two_vms(tmp: Path, end: bool = True) -> Path:
    """CPU 1: a runs 0-10 ms, b preempts it 10-30, b halts at 30 and a runs 30-40, a halts at 40, the CPU idles
    40-60, a host task runs 60-70, idle from 70.  CPU 0: the host task 0-40, idle from 40."""
    s = SynthRecording()
    a = s.vm("a", pid=100, vcpus={0: 101})
    b = s.vm("b", pid=200, vcpus={0: 201})
    s.host_task(300, "worker", 0, 0, 40 * MS)
    s.idle(0, 40 * MS)
    s.run(a, 0, 1, 0, 10 * MS)
    s.run(b, 0, 1, 10 * MS, 30 * MS)
    s.switch(1, 30 * MS, a.thread(0), halted=True, runnable=False)  # b halts, a (runnable) takes the CPU
    s.run(a, 0, 1, 30 * MS, 40 * MS)
    s.halt(a, 0, 1, 40 * MS)
    s.host_task(300, "worker", 1, 60 * MS, 70 * MS)
    s.idle(1, 70 * MS)
    return s.write(tmp / "two.vmprof", end=end)


@pytest.fixture()
def two(tmp_path: Path) -> Analysis:
    return Analysis(recording.load(two_vms(tmp_path)))


def test_host_level(two: Analysis) -> None:
    h = two.host_profile()
    # samples: worker 40 + 10, a 20, b 20; idle from sched events: CPU 0 40-70, CPU 1 40-60 = 50 ms
    assert h.total_samples == 140
    assert rows(h) == {("[unknown]", "[unknown]"): 50, ("[idle]", "(cpu idle)"): 50, ("[a]", "(VM1)"): 20,
                       ("[b]", "(VM2)"): 20}
    assert {k: round(v, 6) for k, v in h.ratios.items()} == {"os": 0.0, "user": round(100 * 50 / 140, 6),
                                                           "idle": round(100 * 50 / 140, 6),
                                                           "vm": round(100 * 40 / 140, 6)}
    assert {r.kind for r in h.rows} == {RowKind.UNKNOWN, RowKind.CPU_IDLE, RowKind.VM}


def test_timelines_and_blanks(two: Analysis) -> None:
    (ta,) = two.vm_timelines("a")
    assert (ta.start_ns, ta.end_ns, ta.on_cpu_ns) == (0, 70 * MS, 20 * MS)
    assert blanks(two, "a") == [("preempted", 10, 30), ("idle", 40, 70)]
    assert ta.blanks[0].holders() == {"b": 20 * MS}
    (tb,) = two.vm_timelines("b")
    assert (tb.start_ns, tb.on_cpu_ns) == (10 * MS, 20 * MS)  # b's life starts when it first runs
    assert blanks(two, "b") == [("idle", 30, 70)]


def test_guest_level_virtual_samples(two: Analysis) -> None:
    ga = two.guest_profile("a")
    # 20 real samples, a 20 ms wait for the pCPU, 30 ms halted: 1 virtual sample per ms
    assert rows(ga) == {("[unknown]", "[unknown]"): 20, ("[steal]", "(outside)"): 20, ("[idle]", "(halt_exit)"): 30}
    assert ga.total_samples == 70
    assert ga.ratios["steal"] == pytest.approx(100 * 20 / 70) and ga.ratios["idle"] == pytest.approx(100 * 30 / 70)
    gb = two.guest_profile("b")
    assert rows(gb) == {("[unknown]", "[unknown]"): 20, ("[idle]", "(halt_exit)"): 40}
    assert {r.kind for r in ga.rows} == {RowKind.UNKNOWN, RowKind.STEAL_OUTSIDE, RowKind.IDLE}


def test_steal_report(two: Analysis) -> None:
    (va,) = vcpu_steal(two, "a")
    assert (va["guest_s"], va["idle_s"], va["steal_type1_s"], va["steal_type2_s"]) == (0.020, 0.030, 0.020, 0.0)
    assert va["type1_by_holder_s"] == {"b": 0.020} and va["wall_s"] == 0.070
    assert va["ratios"]["steal"] == pytest.approx(100 * 20 / 70)


def test_siblings_steal_from_each_other(tmp_path: Path) -> None:
    """Two vCPUs of one VM on one pCPU take turns: their waits are steal `(on vcpuN)`."""
    s = SynthRecording()
    c = s.vm("c", pid=300, vcpus={0: 301, 1: 302})
    s.host_task(500, "worker", 0, 0, 60 * MS)
    s.idle(0, 60 * MS)  # the recording's last record
    s.run(c, 0, 1, 0, 10 * MS)
    s.run(c, 1, 1, 10 * MS, 20 * MS)
    s.run(c, 0, 1, 20 * MS, 30 * MS)
    s.run(c, 1, 1, 30 * MS, 40 * MS)
    s.switch(1, 40 * MS, c.thread(0), halted=True, runnable=False)  # vcpu1 halts, vcpu0 runs again
    s.run(c, 0, 1, 40 * MS, 50 * MS)
    s.halt(c, 0, 1, 50 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "c.vmprof")))
    assert blanks(an, "c", 0) == [("preempted", 10, 20), ("preempted", 30, 40), ("idle", 50, 60)]
    assert blanks(an, "c", 1) == [("preempted", 20, 30), ("idle", 40, 60)]
    g = an.guest_profile("c")
    assert rows(g) == {("[unknown]", "[unknown]"): 50, ("[steal]", "(on vcpu1)"): 20, ("[steal]", "(on vcpu0)"): 10,
                       ("[idle]", "(halt_exit)"): 30}
    assert rows(an.guest_profile("c", 1)) == {("[unknown]", "[unknown]"): 20, ("[steal]", "(on vcpu0)"): 10,
                                              ("[idle]", "(halt_exit)"): 20}
    assert {r.kind for r in g.rows if r.function == "[steal]" and r.samples} == {RowKind.STEAL_SIBLING}


def test_vmm_work_is_type2_steal_by_exit_reason(tmp_path: Path) -> None:
    """KVM handles an exit 10-15 ms (reason 14, #PF: the EPT category on PVM), the VMM in user space 15-20."""
    s = SynthRecording()
    d = s.vm("d", pid=400, vcpus={0: 401})
    s.host_task(500, "worker", 0, 0, 40 * MS)
    s.idle(0, 40 * MS)
    s.run(d, 0, 1, 0, 10 * MS)
    s.vmm_work(d, 0, 1, 10 * MS, 15 * MS, exit_reason=14)
    s.vmm_work(d, 0, 1, 15 * MS, 20 * MS, exit_reason=14, in_kvm=False)
    s.run(d, 0, 1, 20 * MS, 30 * MS)
    s.halt(d, 0, 1, 30 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "d.vmprof")))
    g = an.guest_profile("d")
    assert rows(g) == {("[unknown]", "[unknown]"): 20, ("[steal]", "(vmm)"): 10, ("[idle]", "(halt_exit)"): 10}
    (v,) = vcpu_steal(an, "d")
    assert v["type2_by_exit_s"] == {"ept": 0.005, "vmm user space": 0.005}
    assert (v["steal_type1_s"], v["steal_type2_s"]) == (0.0, 0.010)


def test_attribution_and_corrected_time(tmp_path: Path) -> None:
    """Steal between two samples of the same process and function is attributed to it (thesis §3.4.2); steal
    between samples of different processes is not."""
    s = SynthRecording()
    a = s.vm("a", pid=100, vcpus={0: 101})
    b = s.vm("b", pid=200, vcpus={0: 201})
    s.run(a, 0, 1, 0, 10 * MS, guest_cr3=0x100000)
    s.run(b, 0, 1, 10 * MS, 30 * MS)
    s.switch(1, 30 * MS, a.thread(0), halted=True, runnable=False)
    s.run(a, 0, 1, 30 * MS, 40 * MS, guest_cr3=0x100000)  # the same process: the wait is its steal
    s.run(b, 0, 1, 40 * MS, 50 * MS, guest_cr3=0x200000)
    s.switch(1, 50 * MS, a.thread(0), halted=True, runnable=False)
    s.run(a, 0, 1, 50 * MS, 60 * MS, guest_cr3=0x300000)  # another process after the wait: no attribution
    s.halt(a, 0, 1, 60 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "attr.vmprof")))
    rep = steal_report(an, "a")
    procs = {p["process"]: p for p in rep["processes"]}
    first = procs["[cr3 0x100000]"]
    assert first["samples"] == 20 and first["attributed_steal_s"] == pytest.approx(0.020)
    assert first["apparent_s"] == pytest.approx(0.040) and first["corrected_s"] == pytest.approx(0.020)
    other = procs["[cr3 0x300000]"]
    assert other["attributed_steal_s"] == 0.0 and other["corrected_s"] == pytest.approx(0.010)


def test_time_range(tmp_path: Path) -> None:
    """--time-range keeps the samples inside it and clips the blanks to it."""
    an = Analysis(recording.load(two_vms(tmp_path)), time_range=(0.0155, 0.0345))
    assert an.window() == (int(15.5 * MS), int(34.5 * MS))
    assert blanks(an, "a") == [("preempted", 15, 30)] and an.vm_timelines("a")[0].blanks[0].start_ns == 15.5 * MS
    ga = an.guest_profile("a")
    # a: samples at 30..34 ms; the wait from 15.5 to 30 ms is 14.5 virtual samples
    assert rows(ga) == {("[unknown]", "[unknown]"): 5, ("[steal]", "(outside)"): 14.5}
    assert rows(an.guest_profile("b")) == {("[unknown]", "[unknown]"): 14, ("[idle]", "(halt_exit)"): 4.5}


def test_recordings_at_the_edges(tmp_path: Path) -> None:
    # host samples only, no sched event, no VM
    s = SynthRecording()
    s.host_task(300, "worker", 0, 0, 10 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "host.vmprof")))
    assert an.vm_names() == [] and rows(an.host_profile()) == {("[unknown]", "[unknown]"): 10}
    # a VM whose vCPU never ran: known from the snapshot, no timeline, an empty guest level
    s = SynthRecording()
    s.vm("quiet", pid=600, vcpus={0: 601})
    s.host_task(300, "worker", 0, 0, 10 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "quiet.vmprof")))
    assert an.vm_names() == ["quiet"] and an.vm_timelines("quiet") == []
    assert an.guest_profile("quiet").total_samples == 0
    # a vCPU still waiting for its pCPU when the recording ends: the blank runs to the end
    s = SynthRecording()
    a = s.vm("a", pid=100, vcpus={0: 101})
    s.run(a, 0, 1, 0, 10 * MS)
    s.host_task(300, "worker", 1, 10 * MS, 30 * MS)
    an = Analysis(recording.load(s.write(tmp_path / "tail.vmprof")))
    assert blanks(an, "a") == [("preempted", 10, 29)]  # the last record is the worker's sample at 29 ms
    assert an.vm_timelines("a")[0].blanks[0].holders() == {"worker": 19 * MS}


def test_a_cut_recording_is_analysed_with_a_note(tmp_path: Path) -> None:
    rec = recording.load(two_vms(tmp_path, end=False))
    assert rec.end is None and any("did not finish" in p for p in rec.problems)
    an = Analysis(rec)
    assert rows(an.guest_profile("a"))[("[steal]", "(outside)")] == 20
    assert any("did not finish" in n for n in an.notes)
    assert {b.kind for tl in an.timelines.values() for b in tl.blanks} <= set(BlankKind)
