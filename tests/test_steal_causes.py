"""Steal and idle by cause against the demo VMM's exact accounting (issue 15): the wait after a halted
vCPU's wake-up, cpu.max throttling, and co-stop (a vCPU waiting while its sibling runs)."""

from __future__ import annotations

from pathlib import Path

from conftest import record_scenario

from vmprof_tui.analyse.analysis import Analysis, analyse
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.steal import steal_report


def share(an: Analysis, vm: str, kind: RowKind, vcpu: int | None = None) -> float:
    g = an.guest_profile(vm, vcpu)
    return 100.0 * sum(r.samples for r in g.rows if r.kind is kind) / g.total_samples


def test_wakeup_wait(tmp_path: Path) -> None:
    r = record_scenario(tmp_path, "wakeup", 6.0)
    an = analyse(r.rec)
    truth = r.truth["halting"]["vcpus"][0]
    wall = truth["wall_ns"]
    # the VMM's truth is the kernel's: each halted KVM_RUN's wall time minus the thread's CPU time and run-queue
    # wait (schedstat) is the time asleep; the run-queue wait after its wake-up timer fired is the wake-up wait
    want_idle, want_wait = 100 * truth["pure_halt_ns"] / wall, 100 * truth["wakeup_wait_ns"] / wall
    v = steal_report(an, "halting")["vcpus"][0]  # vmprof steal: exact times over the vCPU's life
    idle, wait = share(an, "halting", RowKind.IDLE), share(an, "halting", RowKind.STEAL_WAKEUP)
    print(f"halting: vmprof steal: idle {v['ratios']['idle']:.2f}%, wake-up wait {v['ratios']['steal_wakeup']:.2f}%; "
          f"VMM: asleep {want_idle:.2f}%, runnable after the wake-up {want_wait:.2f}%; profile rows: [idle] "
          f"{idle:.2f}%, [steal] (wakeup) {wait:.2f}%, [halt poll] {share(an, 'halting', RowKind.HALT_POLL):.2f}%")
    # the busy VM makes the halting one wait for its pCPU after each wake-up: 0.07-1.5% of the time on a quiet
    # host (the kernel's run-queue wait after the timer; the scheduler lets the woken vCPU preempt the busy one
    # at once), 5-27% on a loaded one.  There is a wait (its exactness is tested where it is controlled, in
    # test_steal_causes_synthetic.py):
    assert want_wait > 0
    # within 0.1 point in runs (a few ms in 6 s)
    assert abs(v["ratios"]["steal_wakeup"] - want_wait) <= 1 and abs(v["ratios"]["idle"] - want_idle) <= 1
    # The profile's rows are shares of its samples: exact virtual samples beside the vCPU's real ones, whose
    # count varies here by up to 15% around its on-CPU time (1,070-1,240 samples for 1.06-1.08 s at 1 kHz),
    # which moves a 64% row by up to 1.5 points.
    assert abs(idle - want_idle) <= 2
    assert abs(wait - want_wait) <= 1
    # beside the host's own run-queue delay (schedstat) over the span between the session's readings of it
    h = v["host_run_delay"]
    print(f"halting: host run-queue delay {h['host_s']:.3f}s, vmprof's type 1 "
          f"{sum(h['vmprof_type1_by_cause_s'].values()):.3f}s over {h['span_s']:.3f}s")
    # the two agree to 0.2-1.4% of the span in runs (the span's ends are two /proc reads, not
    # switches: a wait in progress at either read is cut differently)
    assert abs(h["difference_s"]) <= 0.02 * h["span_s"]


def test_throttled(tmp_path: Path) -> None:
    # 8 s: about 1 run in 6 the cgroup counts one whole period (~70 ms) that vmprof does not, and rightly: the
    # vCPU thread ran through it unthrottled (6.18 stops a throttled task only on its way to user space, and a
    # vCPU may stay in KVM_RUN; docs/analysis.md). Over 8 s that is under 0.9 points; the causes are printed.
    r = record_scenario(tmp_path, "throttled", 8.0)
    an = analyse(r.rec)
    print(f"throttled: type 1 by cause {steal_report(an, 'throttled')['vcpus'][0]['type1_by_cause_s']}")
    truth = r.truth["throttled"]
    wall = truth["vcpus"][0]["wall_ns"]
    want = 100 * truth["throttled_ns"] / wall
    got = share(an, "throttled", RowKind.STEAL_THROTTLED)
    seconds = steal_report(an, "throttled")["vcpus"][0]["type1_by_cause_s"]["throttled"]
    print(f"throttled: [steal] (throttled) {got:.2f}%, vmprof steal {seconds:.4f}s = {100 * seconds * 1e9 / wall:.2f}% "
          f"(the cgroup's cpu.stat throttled time: {truth['throttled_ns'] / 1e9:.4f}s = {want:.2f}%)")
    assert want > 1  # (30 ms a period when alone on its pCPU: about 70%; less when other tasks share it)
    assert abs(100 * seconds * 1e9 / wall - want) <= 1  # vmprof steal: the kernel's own count, per blank
    # the guest row is a share of real + virtual samples: the real ones (a third of the vCPU's life here) carry
    # the sampling error of a cpu-clock that misses ticks under load
    assert abs(got - want) <= 2


def test_skew(tmp_path: Path) -> None:
    r = record_scenario(tmp_path, "skew", 3.0)
    an = analyse(r.rec)
    vcpus = {v["vcpu"]: v for v in steal_report(an, "skew")["vcpus"]}
    truth = {v["vcpu"]: v for v in r.truth["skew"]["vcpus"]}
    for vcpu, other in ((0, 1), (1, 0)):
        # both vCPUs always runnable on one pCPU (or blocked on the VMM, whose Python threads share one lock):
        # while one waits, the other's every on-CPU moment is co-stop
        want = 100 * truth[other]["thread_cpu_ns"] / truth[vcpu]["wall_ns"]
        got = vcpus[vcpu]["ratios"]["skew"]
        print(f"skew vcpu{vcpu}: co-stop {got:.2f}% (vcpu{other}'s on-CPU time: {want:.2f}%)")
        assert want > 3
        assert abs(got - want) <= 1


def test_halt_polling(tmp_path: Path) -> None:
    """Halts of ~100 us, which KVM polls out (halt_poll_ns 200 us): vmprof's halt polling from kvm_vcpu_wakeup
    against KVM's own counters of the vCPU (its binary stats, read by the VMM at the vCPU's end)."""
    r = record_scenario(tmp_path, "halt-poll", 3.0)
    an = analyse(r.rec)
    truth = r.truth["blink"]["vcpus"][0]
    kvm, wall = truth["kvm"], truth["wall_ns"]
    assert kvm, "this kernel gave no KVM binary stats (KVM_GET_STATS_FD)"
    v = steal_report(an, "blink")["vcpus"][0]
    want_s = (kvm["halt_poll_success_ns"] + kvm["halt_poll_fail_ns"]) / 1e9
    print(f"blink: halt polling {v['halt_poll_s']:.4f}s = {100 * v['halt_poll_s'] * 1e9 / wall:.2f}% "
          f"(KVM: {want_s:.4f}s = {100 * want_s * 1e9 / wall:.2f}%), halts {v['halts']} "
          f"(KVM: {kvm['halt_attempted_poll']} polled), ended by polling {v['halts_ended_by_polling']} "
          f"(KVM: {kvm['halt_successful_poll']}); KVM stats {kvm}")
    row = share(an, "blink", RowKind.HALT_POLL)
    kvm_share = 100 * want_s * 1e9 / wall
    print(f"blink: [halt poll] (kvm) row {row:.2f}% of the guest level (KVM: {kvm_share:.2f}%)")
    r.require_quiet_pcpu("KVM polls a halt out only while nothing else is runnable on the pCPU")
    assert kvm["halt_successful_poll"] > 100  # the scenario really has KVM polling its halts out
    assert abs(v["halt_poll_s"] - want_s) * 1e9 <= 0.01 * wall
    assert abs(v["halts_ended_by_polling"] - kvm["halt_successful_poll"]) <= 0.01 * kvm["halt_successful_poll"]
    # The guest row is the polled stretches' exact time. Counted from samples it read 1.5-3.2 points above KVM's
    # share: this guest's ~490 us busy/halt cycle beats with the 1 ms sampling period (aliasing).
    assert abs(row - kvm_share) <= 1
    assert row > 0
