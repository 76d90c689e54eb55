"""Unified analysis against demo VMs with known ground truth (issue 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Recorded, record_scenario, vmprof

from vmprof_tui.analyse.analysis import Analysis, analyse
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.analyse.steal import steal_report
from vmprof_tui.demo import runner


def rows(profile: Profile, **match: str) -> list:
    return [r for r in profile.rows if all(getattr(r, k) == v for k, v in match.items())]


def share(profile: Profile, **match: str) -> float:
    return 100.0 * sum(r.samples for r in rows(profile, **match)) / profile.total_samples


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recorded, Analysis]:
    r = record_scenario(tmp_path_factory.mktemp("a"), "alone", 3.0)
    return r, analyse(r.rec)


def test_alone_function_shares(alone: tuple[Recorded, Analysis]) -> None:
    recorded, an = alone
    g = an.guest_profile("alone")
    proc = sum(r.samples for r in g.rows if r.process == "compute")
    a = 100 * sum(r.samples for r in rows(g, function="compute_a")) / proc
    b = 100 * sum(r.samples for r in rows(g, function="compute_b")) / proc
    print(f"compute_a {a:.1f}%  compute_b {b:.1f}%  unresolved {g.unresolved_samples}")
    assert abs(a - 80) <= 2 and abs(b - 20) <= 2
    assert rows(g, function="compute_a")[0].module == "compute"
    # the guest level covers the vCPU's whole life on the host time axis
    v = recorded.truth["alone"]["vcpus"][0]
    assert abs(g.total_samples * an.period_ns - v["wall_ns"]) <= 0.03 * v["wall_ns"]


def test_alone_report_cli(alone: tuple[Recorded, Analysis], tmp_path: Path) -> None:
    recorded, _ = alone
    path = str(recorded.rec.path)
    out = vmprof("report", path, "--vm", "alone", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["level"] == "guest" and doc["vm"] == "alone" and doc["lost_samples"] == 0
    assert set(doc["ratios"]) == {"os", "user", "idle", "steal"}
    assert doc["rows"][0]["function"] == "compute_a" and doc["rows"][0]["process"] == "compute"
    host = json.loads(vmprof("report", path, "--format", "json").stdout)
    assert set(host["ratios"]) == {"os", "user", "idle", "vm"}
    assert any(r["function"] == "[alone]" and r["module"] == "(VM1)" for r in host["rows"])
    table = vmprof("report", path, "--vm", "alone").stdout
    assert "Total samples" in table and "OS:USER:IDLE:steal" in table and "compute_a" in table
    for fmt in ("csv", "collapsed"):
        res = vmprof("report", path, "--vm", "alone", "--format", fmt)
        assert res.returncode == 0 and "compute_a" in res.stdout, res.stderr
    assert "[alone];alone/compute [1];compute_a " in vmprof("report", path, "--vm", "alone", "--format",
                                                        "collapsed").stdout


def test_two_procs_shares(tmp_path: Path) -> None:
    r = record_scenario(tmp_path, "two-procs", 3.0)
    an = analyse(r.rec)
    g = an.guest_profile("twoprocs")
    truth = {p["pid"]: p for p in r.truth["twoprocs"]["processes"]}
    total_run = sum(p["run_ns"] for p in truth.values())
    guest_samples = sum(x.samples for x in g.rows if x.process and x.process.startswith("compute("))
    splits, counts = [], []
    for i, pid in ((1, 1), (2, 2)):
        name = f"compute({i})"
        mine = [x for x in g.rows if x.process == name]
        assert mine and all(x.pid == pid for x in mine)
        got = 100 * sum(x.samples for x in mine) / guest_samples
        want = 100 * truth[pid]["run_ns"] / total_run
        print(f"{name}: {got:.1f}% (truth {want:.1f}%)")
        assert abs(got - want) <= 3
        counts.append(sum(x.samples for x in mine))
        splits.append(100 * sum(x.samples for x in mine if x.function == "compute_a") / counts[-1])
    # the same program: its two copies' compute_a shares differ by sampling alone (two proportions of ~1,500
    # samples each differ by more than 3 points in 2% of runs): 4 standard deviations of that difference
    p = sum(splits) / 200
    bound = 400 * (p * (1 - p) * (1 / counts[0] + 1 / counts[1])) ** 0.5
    print(f"compute_a: {splits[0]:.1f}% and {splits[1]:.1f}% (bound {bound:.1f} points)")
    assert abs(splits[0] - splits[1]) <= bound


def test_steal3(tmp_path: Path) -> None:
    # 10 kHz: a share of the host's samples has a sampling error of about 0.9 points at 3000 samples on the
    # pCPU, 0.3 points at 30000, and the comparison of the host's samples with the exact type-1 steal allows 1 point
    r = record_scenario(tmp_path, "steal3", 3.0, frequency=10000)
    an = analyse(r.rec)
    # the host level over the span in which all three VMs ran, on their shared pCPU
    tls = list(an.timelines.values())
    w0 = an.span()[0]
    span = ((max(t.start_ns for t in tls) - w0) / 1e9, (min(t.end_ns for t in tls) - w0) / 1e9)
    in_span = analyse(r.rec, time_range=span)
    host = in_span.host_profile(cpu=1)
    for name, t in r.truth.items():
        v = t["vcpus"][0]
        # truth: the share of the vCPU's life in which its guest did not run (it never halts here)
        want = 100 * (1 - t["processes"][0]["cpu_ns"] / v["wall_ns"])
        got = an.guest_profile(name).ratios["steal"]
        g = in_span.guest_profile(name)
        # type 1 (the vCPU waited while others held the pCPU); type 2 (its VMM at work) is the VM's own host row
        type1 = 100 * sum(x.samples for x in g.rows if x.kind.steal_type == 1) / g.total_samples
        # the host level's view of the same thing: whatever held the pCPU while this VM's vCPU thread did not
        not_mine = 100 - share(host, function=f"[{name}]")
        others = sum(share(host, function=f"[{o}]") for o in r.truth if o != name)
        print(f"{name}: guest steal {got:.1f}% (truth {want:.1f}%); while all three ran: steal "
              f"{g.ratios['steal']:.2f}%, of it type 1 {type1:.2f}%; host share of all but this VM {not_mine:.2f}%, "
              f"of the other two VMs {others:.2f}%")
        assert abs(got - want) <= 3
        # the host's samples of everything else on the pCPU against the exact type-1 steal: with other work on
        # the pCPU (many short tasks) the two were 2.5 points apart in one loaded run, so only on a quiet one
        r.require_quiet_pcpu("the host level is compared with the exact steal on a pCPU only the three VMs use")
        assert abs(not_mine - type1) <= 1
        # the other two VMs held nearly all of it; host tasks on a busy CI machine hold the rest
        assert others >= 0.95 * type1
        assert share(an.guest_profile(name), function="[steal]", module="(outside)") > 50


def test_halt(tmp_path: Path) -> None:
    r = record_scenario(tmp_path, "halt", 3.0)
    an = analyse(r.rec)
    g = an.guest_profile("halt")
    idle = share(g, function="[idle]", module="(halt_exit)")
    tl = an.vm_timelines("halt")[0]  # the host level over the VM's life, on its pCPU
    w0 = an.span()[0]
    host_idle = analyse(r.rec, time_range=((tl.start_ns - w0) / 1e9, (tl.end_ns - w0) / 1e9)).host_profile(
        cpu=1).ratios["idle"]
    # The duty program halts 20 ms after a fixed amount of work (10 ms when undisturbed): if anything delays
    # the work the halted share drops below 2/3, so the truth is the VMM's measured halt time.
    truth = r.truth["halt"]["vcpus"][0]
    halted = 100 * truth["halt_ns"] / truth["wall_ns"]
    # [idle] ends at the wake-up; from there to the vCPU running again is [steal] (wakeup) (issue 15)
    until_wakeup = 100 * truth["pure_halt_ns"] / truth["wall_ns"]
    print(f"guest [idle] {idle:.1f}%, host idle on the VM's pCPU {host_idle:.1f}%, halted (truth) {halted:.1f}%, "
          f"until the wake-up {until_wakeup:.1f}%")
    assert abs(idle - until_wakeup) <= 3
    assert host_idle <= until_wakeup + 3  # woken, the vCPU is runnable: its pCPU is not idle then
    # the pCPU idles for all of the halt only when nothing else wants it
    r.require_quiet_pcpu("host idle equals the VM's halt only on a pCPU nothing else uses")
    assert abs(host_idle - until_wakeup) <= 3


def test_vcpu2_on_1(tmp_path: Path) -> None:
    """Two vCPUs of one VM on one pCPU: while one runs, the other waits, preempted (`[steal] (on vcpuN)`) or, a
    few dozen times a run, blocked in the VMM outside KVM_RUN as its sibling's thread runs (`[steal] (vmm
    blocked)`: the kernel's own switch says so, not runnable and no vCPU loaded).  Together they are the sibling's
    share of the wall time."""
    r = record_scenario(tmp_path, "vcpu2-on-1", 3.0)
    an = analyse(r.rec)
    for vcpu, other in ((0, 1), (1, 0)):
        g = an.guest_profile("vcpu2", vcpu=vcpu)
        on_other = share(g, function="[steal]", module=f"(on vcpu{other})")
        blocked = share(g, function="[steal]", module="(vmm blocked)")
        truth = r.truth["vcpu2"]["vcpus"][other]
        want = 100 * truth["thread_cpu_ns"] / r.truth["vcpu2"]["vcpus"][vcpu]["wall_ns"]
        print(f"vcpu{vcpu}: [steal] (on vcpu{other}) {on_other:.1f}% + (vmm blocked) {blocked:.1f}% "
              f"(other vCPU's share {want:.1f}%)")
        assert abs(on_other + blocked - want) <= 3


def _fixed_work_spec(name: str, rounds: int) -> dict:
    spec = runner.scenario_specs("alone")[0]
    spec["name"] = name
    spec["vcpus"][0]["processes"][0]["args"] = [0, rounds]
    return spec


def test_correction(tmp_path: Path) -> None:
    """Corrected time (apparent minus the steal attributed to the process) against exact accounting: the
    guest process's own on-CPU time in the same disturbed run, measured by the demo VMM.  (A separate run
    alone is no reference: on a loaded machine the same work takes a different time.)"""
    specs = runner.scenario_specs("correction")
    specs[0] = _fixed_work_spec("measured", 1500)
    disturbed = record_scenario(tmp_path, specs, 30)
    an = analyse(disturbed.rec)
    rep = steal_report(an, "measured")
    # one entry, or (seen once in CI, its cause not caught) the one process in two entries of the same name: summed
    entries = [c for c in rep["processes"] if c["process"] == "compute"]
    assert entries, rep["processes"]
    mine = {k: sum(c[k] for c in entries) for k in ("corrected_s", "host_steal_corrected_s", "apparent_s")}
    corrected, host_corr = mine["corrected_s"], mine["host_steal_corrected_s"]
    assert abs(sum(f["corrected_s"] for f in rep["functions"] if f["process"] == "compute") - corrected) < 0.01
    wall = disturbed.truth["measured"]["vcpus"][0]["wall_ns"] / 1e9
    truth = disturbed.truth["measured"]["processes"][0]["cpu_ns"] / 1e9
    print(f"on-CPU (truth) {truth:.3f}s, disturbed wall {wall:.3f}s, apparent {mine['apparent_s']:.3f}s, "
          f"corrected {corrected:.3f}s ({100 * (corrected / truth - 1):+.1f}%), host-steal corrected "
          f"{host_corr:.3f}s ({100 * (host_corr / truth - 1):+.1f}%)")
    assert wall > 1.5 * truth  # the disturbance really stole time
    assert mine["apparent_s"] > 1.3 * truth  # so the correction has something to correct
    g = an.guest_profile("measured")
    assert abs(corrected - truth) <= 0.05 * truth, (
        f"corrected {corrected:.3f}s, the process's on-CPU time in this run {truth:.3f}s; rows "
        f"{[(r.function, r.module, r.process, round(r.samples)) for r in g.rows]}; lost {disturbed.rec.end['lost']}")
    out = vmprof("steal", str(disturbed.rec.path), "--vm", "measured")
    assert out.returncode == 0 and "corrected" in out.stdout and "run-queue delay" in out.stdout


def test_truncated_recording_reports_complete_part(alone: tuple[Recorded, Analysis], tmp_path: Path) -> None:
    recorded, _ = alone
    data = recorded.rec.path.read_bytes()
    cut = tmp_path / "cut.vmprof"
    cut.write_bytes(data[: len(data) // 2])
    out = vmprof("report", str(cut))
    assert out.returncode == 0, out.stderr
    assert "note: recording cut inside" in out.stdout
    garbage = tmp_path / "garbage.vmprof"
    garbage.write_bytes(b"not a recording at all")
    bad = vmprof("report", str(garbage))
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        f"vmprof: {garbage} is not a vmprof recording (bad magic)"]
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF
    corrupt = tmp_path / "corrupt.vmprof"
    corrupt.write_bytes(bytes(flipped))
    res = vmprof("report", str(corrupt))
    assert res.returncode == 0 and "note:" in res.stdout
