"""Steal causes on synthetic recordings (tests/synth.py), exact to the nanosecond: the wake-up wait of a
halt, throttling, IRQ time on the pCPU, halt polling, and co-stop across pCPUs.  The real-VM checks are
in test_steal_causes.py; these cover what the demo VMs cannot show on every host (halt polling succeeds
only for halts shorter than halt_poll_ns, which the demo's millisecond sleeps never are)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import MS, VMX_IO, SynthRecording

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.analysis import analyse as analyse_recording
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.source import RecordingSource
from vmprof_tui.analyse.steal import vcpu_steal
from vmprof_tui.record.recording import load


def analyse(b: SynthRecording, tmp_path: Path) -> Analysis:
    return analyse_recording(load(b.write(tmp_path / "x.vmprof")))


def rows(an: Analysis, vm: str) -> dict[RowKind, float]:
    out: dict[RowKind, float] = {}
    for r in an.guest_profile(vm).rows:
        out[r.kind] = out.get(r.kind, 0.0) + r.samples
    return out


def test_wakeup_wait_is_steal_not_idle(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.halt(web, 0, start_ns=10 * MS, end_ns=40 * MS, wakeup_ns=30 * MS)  # woken at 30, ran at 40
    b.host_task(500, "busy", cpu=1, start_ns=25 * MS, end_ns=40 * MS)
    b.run(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS)
    an = analyse(b, tmp_path)
    assert rows(an, "web")[RowKind.IDLE] == pytest.approx(20)
    assert rows(an, "web")[RowKind.STEAL_WAKEUP] == pytest.approx(10)
    v = vcpu_steal(an, "web")[0]
    assert v["idle_s"] == pytest.approx(0.020)
    assert v["type1_by_cause_s"]["wakeup"] == pytest.approx(0.010)
    assert v["steal_type1_s"] == pytest.approx(0.010)
    assert an.guest_profile("web").ratios["idle"] == pytest.approx(40)


def test_chrome_trace_draws_the_wakeup_wait(tmp_path: Path) -> None:
    import json

    from vmprof_tui.show.formats import ReportInput, chrome

    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.halt(web, 0, start_ns=10 * MS, end_ns=40 * MS, wakeup_ns=30 * MS)
    b.host_task(500, "busy", cpu=1, start_ns=25 * MS, end_ns=40 * MS)
    b.run(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS)
    an = analyse(b, tmp_path)
    events = json.loads(chrome.render(ReportInput(an, [an.guest_profile("web")], vm="web")))["traceEvents"]
    on_vcpu = [e for e in events if e.get("ph") == "X" and e["tid"] == 101]
    assert [(e["name"], e["dur"]) for e in on_vcpu if e["cat"] in ("idle", "steal")] == [
        ("[idle] halt", 20_000), ("[steal] wakeup", 10_000)]


def test_halt_without_wakeup_event_stays_idle(tmp_path: Path) -> None:
    """A recording made before issue 15 (no wake-up records) gives the same idle as before."""
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.halt(web, 0, start_ns=10 * MS, end_ns=40 * MS)
    b.run(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS)
    r = rows(analyse(b, tmp_path), "web")
    assert r[RowKind.IDLE] == pytest.approx(30) and RowKind.STEAL_WAKEUP not in r


def test_throttled(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.preempt(web, 0, start_ns=10 * MS, end_ns=30 * MS, throttled=True)
    b.preempt(web, 0, start_ns=40 * MS, end_ns=45 * MS)
    b.run(web, 0, cpu=1, start_ns=30 * MS, end_ns=40 * MS)
    b.host_task(500, "other", cpu=1, start_ns=40 * MS, end_ns=45 * MS)
    b.run(web, 0, cpu=1, start_ns=45 * MS, end_ns=50 * MS)
    an = analyse(b, tmp_path)
    r = rows(an, "web")
    assert r[RowKind.STEAL_THROTTLED] == pytest.approx(20)
    assert r[RowKind.STEAL_OUTSIDE] == pytest.approx(5)
    v = vcpu_steal(an, "web")[0]
    assert v["type1_by_cause_s"] == pytest.approx({"wakeup": 0.0, "throttled": 0.020, "irq": 0.0, "preempted": 0.005})


def test_throttled_then_waiting_for_the_pcpu(tmp_path: Path) -> None:
    """The kernel kept the group throttled 12 ms of the 20 ms wait: the other 8 ms another task held the pCPU."""
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.preempt(web, 0, start_ns=10 * MS, end_ns=30 * MS, throttled=True, throttled_ns=12 * MS)
    b.host_task(500, "other", cpu=1, start_ns=22 * MS, end_ns=30 * MS)
    b.run(web, 0, cpu=1, start_ns=30 * MS, end_ns=40 * MS)
    r = rows(analyse(b, tmp_path), "web")
    assert r[RowKind.STEAL_THROTTLED] == pytest.approx(12)
    assert r[RowKind.STEAL_OUTSIDE] == pytest.approx(8)


def test_woken_into_a_throttled_group(tmp_path: Path) -> None:
    """A vCPU thread that slept as its group's quota ran out (blocked in the VMM, or halted) and was woken
    during the throttled period: asleep until the wake-up, throttled for the kernel's count, then waiting for
    its pCPU (before: the whole wait was VMM-blocked or wake-up steal, a whole throttled period missed)."""
    import json

    from vmprof_tui.show.formats import ReportInput, chrome

    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.block(web, 0, start_ns=10 * MS, end_ns=40 * MS)
    b.throttled_wakeup(web, 0, wakeup_ns=15 * MS, run_ns=40 * MS, throttled_ns=20 * MS)
    b.host_task(500, "other", cpu=1, start_ns=35 * MS, end_ns=40 * MS)
    b.run(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS)
    b.halt(web, 0, start_ns=50 * MS, end_ns=80 * MS)
    b.throttled_wakeup(web, 0, wakeup_ns=60 * MS, run_ns=80 * MS, throttled_ns=15 * MS)
    b.run(web, 0, cpu=1, start_ns=80 * MS, end_ns=90 * MS)
    an = analyse(b, tmp_path)
    r = rows(an, "web")
    assert r[RowKind.STEAL_VMM_BLOCKED] == pytest.approx(5)
    assert r[RowKind.STEAL_THROTTLED] == pytest.approx(20 + 15)
    assert r[RowKind.STEAL_OUTSIDE] == pytest.approx(5)
    assert r[RowKind.IDLE] == pytest.approx(10)
    assert r[RowKind.STEAL_WAKEUP] == pytest.approx(5)
    v = vcpu_steal(an, "web")[0]
    assert v["type1_by_cause_s"] == pytest.approx({"wakeup": 0.005, "throttled": 0.035, "irq": 0.0, "preempted": 0.005})
    events = json.loads(chrome.render(ReportInput(an, [an.guest_profile("web")], vm="web")))["traceEvents"]
    waits = [(e["name"], e["dur"]) for e in events
             if e.get("ph") == "X" and e["tid"] == 101 and e["cat"] in ("idle", "steal")]
    assert waits == [("[steal] vmm blocked", 5_000), ("[steal] throttled", 20_000), ("[steal] pCPU wait", 5_000),
                     ("[idle] halt", 10_000), ("[steal] throttled", 15_000), ("[steal] wakeup", 5_000)]


def test_irq_time_while_waiting_and_running(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.preempt(web, 0, start_ns=10 * MS, end_ns=30 * MS)
    b.host_task(500, "other", cpu=1, start_ns=10 * MS, end_ns=30 * MS)
    b.run(web, 0, cpu=1, start_ns=30 * MS, end_ns=40 * MS)
    b.irq(1, 15 * MS, 17 * MS)  # while it waited
    b.irq(1, 32 * MS, 33 * MS)  # while it ran
    b.irq(0, 12 * MS, 20 * MS)  # another CPU: not its business
    b.host_task(501, "after", cpu=1, start_ns=40 * MS, end_ns=45 * MS)  # the vCPU thread leaves at 40
    an = analyse(b, tmp_path)
    r = rows(an, "web")
    assert r[RowKind.STEAL_IRQ] == pytest.approx(2)
    assert r[RowKind.STEAL_OUTSIDE] == pytest.approx(18)
    v = vcpu_steal(an, "web")[0]
    assert v["type1_by_cause_s"]["irq"] == pytest.approx(0.002)
    assert v["irq_while_running_s"] == pytest.approx(0.001)


def test_halt_polling(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.halt(web, 0, start_ns=10 * MS, end_ns=30 * MS, wakeup_ns=29 * MS)
    b.run(web, 0, cpu=1, start_ns=30 * MS, end_ns=50 * MS)
    b.halt_end(web, 0, time_ns=30 * MS + 500_000, halt_ns=20 * MS + 700_000, polled=False)  # polled 0.2 ms
    b.halt_end(web, 0, time_ns=45 * MS, halt_ns=100_000, polled=True)  # never blocked: polled 0.1 ms
    an = analyse(b, tmp_path)
    v = vcpu_steal(an, "web")[0]
    assert v["halt_poll_s"] == pytest.approx(0.0003)
    assert (v["halts"], v["halts_ended_by_polling"]) == (2, 1)
    # the guest level's [halt poll] row: the polled time, not samples (none of them caught KVM polling here)
    (poll,) = [r for r in an.guest_profile("web").rows if r.kind is RowKind.HALT_POLL]
    assert poll.samples == pytest.approx(0.3)


def test_costop_counts_siblings_on_other_pcpus(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2)
    db = b.vm("db", pid=200, vcpus={0: 201, 1: 202})
    b.run(db, 0, cpu=0, start_ns=0, end_ns=10 * MS)
    b.preempt(db, 0, start_ns=10 * MS, end_ns=30 * MS)
    b.host_task(500, "other", cpu=0, start_ns=10 * MS, end_ns=30 * MS)
    b.run(db, 0, cpu=0, start_ns=30 * MS, end_ns=40 * MS)
    b.run(db, 1, cpu=1, start_ns=0, end_ns=20 * MS)  # its sibling ran elsewhere for half of the wait
    b.halt(db, 1, start_ns=20 * MS, end_ns=40 * MS)
    an = analyse(b, tmp_path)
    v = {x["vcpu"]: x for x in vcpu_steal(an, "db")}
    assert v[0]["skew_s"] == pytest.approx(0.010)
    assert v[1]["skew_s"] == 0
    assert RowKind.STEAL_SIBLING not in rows(an, "db")  # not on its pCPU: not '(on vcpu1)'


@pytest.mark.parametrize(("time_range", "held"), [
    (None, {"db": 33.5, "app": 5, "vcpu1": 5, "other": 6.5}),
    ((0.030, 0.080), {"db": 13.5, "app": 5, "vcpu1": 5, "other": 6.5}),  # the wait cut at the range's start
], ids=["whole", "range-cuts-the-wait"])
def test_holders_add_up_to_a_preemption_when_a_vcpu_thread_was_discovered_late(
        tmp_path: Path, time_range: tuple[float, float] | None, held: dict[str, int]) -> None:
    """A VM started just before the window: until the recorder discovers its vCPU thread (at 70 ms), the sched
    program records its switches only inside KVM_RUN, so db's thread is seen arriving at 10 ms and leaving at
    60 ms, though host tasks and other vCPUs held the pCPU in between; its return at 50 ms, into VMM user space,
    is recorded by the sampler at its first sample in KVM_RUN (52 ms), as from 51.5 ms (the middle of the
    stretch after the tick before).  Who held it while web's vCPU 0 waited
    adds up to that wait, as the store's steal_holder rows must add up to the vCPU's type-1 steal; each
    holder keeps the pCPU until the next recorded switch on it."""
    from vmprof_tui.fleet.tasks import vcpu_seconds

    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101, 1: 102})
    db = b.vm("db", pid=200, vcpus={0: 201}, discovered_ns=70 * MS)
    app = b.vm("app", pid=300, vcpus={0: 301})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=10 * MS)
    b.preempt(web, 0, start_ns=10 * MS, end_ns=60 * MS)
    b.run(db, 0, cpu=1, start_ns=10 * MS, end_ns=20 * MS)
    b.vmm_work(db, 0, cpu=1, start_ns=20 * MS, end_ns=25 * MS, exit_reason=VMX_IO, in_kernel=False)
    b.host_task(500, "busy", cpu=1, start_ns=25 * MS, end_ns=35 * MS)  # db -> busy: not recorded
    b.run(app, 0, cpu=1, start_ns=35 * MS, end_ns=40 * MS)
    b.run(web, 1, cpu=1, start_ns=40 * MS, end_ns=45 * MS)
    b.host_task(501, "other", cpu=1, start_ns=45 * MS, end_ns=50 * MS)
    b.vmm_work(db, 0, cpu=1, start_ns=50 * MS, end_ns=52 * MS, exit_reason=VMX_IO, in_kernel=False)  # not recorded
    b.run(db, 0, cpu=1, start_ns=52 * MS, end_ns=60 * MS)
    b.run(web, 0, cpu=1, start_ns=60 * MS, end_ns=80 * MS)
    an = analyse_recording(load(b.write(tmp_path / "x.vmprof")), time_range=time_range)
    wait = sum(held.values())
    (v,) = [x for x in vcpu_seconds(RecordingSource(an), "web") if x["vcpu"] == 0]
    assert v["type1_by_holder"] == pytest.approx({k: ms / 1e3 for k, ms in held.items()})
    assert sum(v["type1_by_holder"].values()) == pytest.approx(v["steal_type1"]) == pytest.approx(wait / 1e3)
    (blank,) = [x for x in an.vm_timelines("web", 0)[0].blanks if x.kind == "preempted"]
    assert sum(blank.holders().values()) == blank.duration_ns == wait * MS
    r = rows(an, "web")  # the guest profile's split: sibling and outside, not more than the wait
    assert (r[RowKind.STEAL_SIBLING], r[RowKind.STEAL_OUTSIDE]) == pytest.approx((5, wait - 5))


def test_holders_are_named_by_pid_and_comm_whether_a_pid_has_one_comm_or_several() -> None:
    """Schedule.holders_of names each (pid, comm) as holder() does, both where every pid has one comm (one name per
    pid) and where a pid's comm changed or its slot keeps an older record's bytes after the NUL."""
    from vmprof_tui.analyse.timeline import Schedule
    from vmprof_tui.record.bpf_records import SCHED_DTYPE

    sched = Schedule(np.empty(0, SCHED_DTYPE), np.empty(0, SCHED_DTYPE), {}, {300: "web"}, (0, 1), None)
    pid = np.array([7, 0, 300, 7, 9, 7], np.uint32)
    one = np.array([b"bash", b"swapper/1", b"qemu", b"bash", b"", b"bash"], "S16")
    assert sched.holders_of(pid, one).tolist() == ["bash", "idle", "web (VMM)", "bash", "9", "bash"]
    several = np.array([b"bash", b"swapper/1", b"qemu", b"make", b"", b"bash\0-91"], "S16")
    assert sched.holders_of(pid, several).tolist() == ["bash", "idle", "web (VMM)", "make", "9", "bash"]
