"""The analysis on synthetic recordings (tests/synth.py): exact numbers, no KVM, no BPF, no root.

Every schedule is drawn in the test's docstring; the expected numbers are worked out by hand from it.
Sampling is 1 kHz with samples at whole milliseconds (0, 1, ... 99 ms in a 100 ms recording) unless
said otherwise, so a ms of something on a CPU is one sample of it.  Times are ms after the recording's
start.  Two rules of the analysis show up in many numbers:

* its window is [first record, the recording's end]: 0 to 100 ms in a 100 ms recording, though the
  last sample is at 99 ms (the end chunk says when sampling stopped);
* a vCPU's life runs from its first record to its last one (a switch out, or its last sample), and a
  blank still open at the end runs to the end of the window.

Tests marked xfail(strict=True) are findings: they state what the analysis should give and fail until
the analysis does (the reason says what it gives instead and why).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import (
    BASE_NS,
    GUEST_CR3,
    HOST_SYMBOLS,
    MS,
    VMX_EPT_VIOLATION,
    VMX_EXTERNAL_INTERRUPT,
    VMX_HLT,
    VMX_IO,
    VMX_MSR_WRITE,
    SynthRecording,
)

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.analysis import analyse as analyse_recording
from vmprof_tui.analyse.kinds import BlankKind
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.analyse.steal import attributions, steal_report, vcpu_steal
from vmprof_tui.analyse.timeline import VcpuTimeline
from vmprof_tui.record.bpf_records import (
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HOST_KERNEL,
    SAMPLE_VCPU,
    SCHED_NEXT_VCPU,
    SCHED_PREV_HALTED,
    SCHED_PREV_LOADED,
    SCHED_PREV_RUNNABLE,
    SCHED_PREV_VCPU,
)
from vmprof_tui.record.recording import CHUNK_HEADER, END, MAGIC, META, SAMPLES, SCHED, SNAPSHOT, load

approx = pytest.approx


# -- helpers ---------------------------------------------------------------------------------------


def analyse(b: SynthRecording, tmp_path: Path, **kw: object) -> Analysis:
    """Write the recording with the real Writer, read it back with the real loader, analyse it."""
    return analyse_recording(load(b.write(tmp_path / "synth.vmprof")), **kw)  # type: ignore[arg-type]


def rows(p: Profile) -> dict[tuple[str, str, str | None], float]:
    """(function, module, process) -> samples."""
    out: dict[tuple[str, str, str | None], float] = {}
    for r in p.rows:
        out[(r.function, r.module, r.process)] = out.get((r.function, r.module, r.process), 0.0) + r.samples
    return out


def ms(t_ns: float) -> float:
    """An absolute time of the recording as ms after its start."""
    return (t_ns - BASE_NS) / MS


def timeline(an: Analysis, vm: str, vcpu: int) -> VcpuTimeline:
    (tl,) = an.vm_timelines(vm, vcpu)
    return tl


def blanks(tl: VcpuTimeline) -> list[tuple]:
    """(start ms, end ms, kind, exit reason, pCPU, first holder) of each blank."""
    return [(ms(b.start_ns), ms(b.end_ns), b.kind, b.exit_reason, b.cpu, b.first_holder) for b in tl.blanks]


def in_ms(d: dict) -> dict:
    return {k: v / MS for k, v in d.items()}


# -- scenarios -------------------------------------------------------------------------------------


def host_mix() -> SynthRecording:
    """Two CPUs, 100 ms, two 1-vCPU VMs (db: pid 200, VM1; web: pid 100, VM2 — VMs are numbered by name):

        CPU0  app (user) 0-20 | kworker/0:1 (kernel) 20-30 | idle 30-50 | db guest 50-70 | idle 70-90
              (db halted 70-90) | db guest 90-100
        CPU1  web guest user 0-40 | web KVM handles an I/O exit 40-50 | web guest kernel 50-60 | idle 60-80
              (web halted 60-80) | web guest user 80-100
    """
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    db = b.vm("db", pid=200, vcpus={0: 201})
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=20 * MS)
    b.host_task(40, "kworker/0:1", cpu=0, start_ns=20 * MS, end_ns=30 * MS, kernel=True)
    b.run(db, 0, cpu=0, start_ns=50 * MS, end_ns=70 * MS)
    b.halt(db, 0, 70 * MS, 90 * MS)
    b.run(db, 0, cpu=0, start_ns=90 * MS, end_ns=100 * MS)
    b.run(web, 0, cpu=1, start_ns=0, end_ns=40 * MS)
    b.vmm_work(web, 0, cpu=1, start_ns=40 * MS, end_ns=50 * MS, exit_reason=VMX_IO)
    b.run(web, 0, cpu=1, start_ns=50 * MS, end_ns=60 * MS, kernel=True)
    b.halt(web, 0, 60 * MS, 80 * MS)
    b.run(web, 0, cpu=1, start_ns=80 * MS, end_ns=100 * MS)
    return b


def steal_mix(web1_from_start: bool = False) -> SynthRecording:
    """Two CPUs, 100 ms; web (pid 100) has vCPUs 0 (tid 101) and 1 (tid 102), db (pid 200) one (tid 201):

        CPU0  web0 0-20 | kworker/0:1 20-30 | db0 30-40 | web1 40-48 | web1 in VMM user space 48-50
              | web0 50-100                       (web0 preempted 20-50: 10 ms each by a host task,
                                                    another VM, its sibling vCPU)
        CPU1  idle 0-5 | web1 5-30 | idle 30-45 | db0 45-100
        web1 halted 30-40 (left CPU1, back on CPU0), blocks at 50 for good (the VMM stops it)
        db0 first seen switching in at 30, halted 40-45 (left CPU0, back on CPU1)

    web1_from_start: web1 runs on CPU1 from 0 instead of 5 (it was running when the recording began).
    """
    b = SynthRecording(frequency=1000, cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101, 1: 102})
    db = b.vm("db", pid=200, vcpus={0: 201})
    b.run(web, 0, cpu=0, start_ns=0, end_ns=20 * MS)
    b.preempt(web, 0, 20 * MS, 50 * MS)
    b.host_task(40, "kworker/0:1", cpu=0, start_ns=20 * MS, end_ns=30 * MS, kernel=True)
    b.run(db, 0, cpu=0, start_ns=30 * MS, end_ns=40 * MS)
    b.run(web, 1, cpu=0, start_ns=40 * MS, end_ns=48 * MS)
    b.vmm_work(web, 1, cpu=0, start_ns=48 * MS, end_ns=50 * MS, exit_reason=VMX_IO, in_kernel=False)
    b.run(web, 0, cpu=0, start_ns=50 * MS, end_ns=100 * MS)
    b.run(web, 1, cpu=1, start_ns=0 if web1_from_start else 5 * MS, end_ns=30 * MS)
    b.halt(web, 1, 30 * MS, 40 * MS)
    b.halt(db, 0, 40 * MS, 45 * MS)
    b.run(db, 0, cpu=1, start_ns=45 * MS, end_ns=100 * MS)
    return b


COMPUTE_A, COMPUTE_B = 0xFFFFFFFF81010000, 0xFFFFFFFF81020000  # guest kernel functions
WORKER_CR3, OTHER_CR3 = 0x2000, 0x3000


def attribution_mix() -> SynthRecording:
    """One CPU, 100 ms; VM app (pid 300, vCPU 0 = tid 301) with a guest bundle: process worker (cr3 0x2000)
    runs the guest kernel functions compute_a (A) and compute_b (B), process other (cr3 0x3000) user code (O);
    a host task noisy (pid 600) preempts the vCPU:

        0-10 A | 10-20 noisy | 20-30 A | 30-35 noisy | 35-45 B | 45-50 noisy | 50-60 B | 60-70 halted (idle)
        | 70-75 O | 75-78 B | 78-80 VMM user space (I/O exit) | 80-85 VMM blocked (idle) | 85-95 B
        | the vCPU stops at 95 (blocked), noisy 95-100
    """
    b = SynthRecording(frequency=1000, cpus=1)
    app = b.vm("app", pid=300, vcpus={0: 301})
    b.guest_process(app, 7, "worker", WORKER_CR3)
    b.guest_process(app, 8, "other", OTHER_CR3)
    b.guest_kernel_symbols(app, {"compute_a": COMPUTE_A, "compute_b": COMPUTE_B})

    def run(start: int, end: int, func: int | None) -> None:
        if func is None:
            b.run(app, 0, cpu=0, start_ns=start * MS, end_ns=end * MS, guest_cr3=OTHER_CR3)
        else:
            b.run(app, 0, cpu=0, start_ns=start * MS, end_ns=end * MS, guest_ip=func + 0x10,
                  guest_cr3=WORKER_CR3, kernel=True)

    def noisy(start: int, end: int) -> None:
        b.host_task(600, "noisy", cpu=0, start_ns=start * MS, end_ns=end * MS, preempted=True)

    run(0, 10, COMPUTE_A)
    noisy(10, 20)
    run(20, 30, COMPUTE_A)
    noisy(30, 35)
    run(35, 45, COMPUTE_B)
    noisy(45, 50)
    run(50, 60, COMPUTE_B)
    b.halt(app, 0, 60 * MS, 70 * MS)
    run(70, 75, None)
    run(75, 78, COMPUTE_B)
    b.vmm_work(app, 0, cpu=0, start_ns=78 * MS, end_ns=80 * MS, exit_reason=VMX_IO, in_kernel=False)
    b.block(app, 0, 80 * MS, 85 * MS)
    run(85, 95, COMPUTE_B)
    noisy(95, 100)
    return b


# -- the builder writes what the BPF programs would ------------------------------------------------


def test_recording_round_trip(tmp_path: Path) -> None:
    rec = load(host_mix().write(tmp_path / "x.vmprof"))
    assert rec.complete and rec.problems == []
    assert (rec.meta["frequency"], rec.meta["cpus"], rec.meta["backend"]) == (1000, 2, "vmx")
    assert len(rec.samples) == 200 and rec.end is not None and rec.end["samples"] == 200
    assert rec.end["guest_samples"] == 70 + 30  # web: 40 + 10 + 20 in guest mode; db: 20 + 10
    assert rec.duration_s == 0.1 and rec.lost_samples == 0
    assert [(v["name"], v["pid"], v["vcpu_threads"]) for v in rec.snapshot["vms"]] == [
        ("web", 100, {"101": 0}), ("db", 200, {"201": 0})]
    assert sorted(k for k in rec.snapshot if k.startswith("process:")) == [
        "process:100", "process:200", "process:40", "process:500"]
    assert rec.snapshot["process:40"]["maps"] == "" and "/opt/synth/bin/app" in rec.snapshot["process:500"]["maps"]
    assert "default_idle" in rec.snapshot["kallsyms"]
    assert rec.bundles == {}


def test_sched_events_mirror_sched_bpf(tmp_path: Path) -> None:
    """Exactly the switches bpf/sched.bpf.c records for steal_mix(), with its flags, comms, exit reasons."""
    rec = load(steal_mix().write(tmp_path / "x.vmprof"))
    got = [(ms(e["time_ns"]), int(e["cpu"]), int(e["prev_pid"]), int(e["prev_tid"]), int(e["next_pid"]),
            int(e["next_tid"]), int(e["prev_exit_reason"]), int(e["prev_vcpu_id"]), int(e["flags"]),
            e["next_comm"].decode()) for e in rec.sched]
    prev_vcpu_loaded = SCHED_PREV_VCPU | SCHED_PREV_LOADED
    assert got == [
        (5.0, 1, 0, 0, 100, 102, 0, 0, SCHED_PREV_RUNNABLE | SCHED_NEXT_VCPU, "CPU 1/KVM"),  # idle -> web1
        # web0 preempted in guest mode (host tick: external interrupt exit), still loaded
        (20.0, 0, 100, 101, 40, 40, VMX_EXTERNAL_INTERRUPT, 0, prev_vcpu_loaded | SCHED_PREV_RUNNABLE,
         "kworker/0:1"),
        (30.0, 0, 40, 40, 200, 201, 0, 0, SCHED_NEXT_VCPU, "CPU 0/KVM"),  # the kworker slept
        (30.0, 1, 100, 102, 0, 0, VMX_HLT, 1, prev_vcpu_loaded | SCHED_PREV_HALTED, "swapper/1"),  # web1 halts
        (40.0, 0, 200, 201, 100, 102, VMX_HLT, 0, prev_vcpu_loaded | SCHED_PREV_HALTED | SCHED_NEXT_VCPU,
         "CPU 1/KVM"),
        (45.0, 1, 0, 0, 200, 201, 0, 0, SCHED_PREV_RUNNABLE | SCHED_NEXT_VCPU, "CPU 0/KVM"),
        # web1 blocks in VMM user space: not loaded, not runnable, no exit reason
        (50.0, 0, 100, 102, 100, 101, 0, 0, SCHED_PREV_VCPU | SCHED_NEXT_VCPU, "CPU 0/KVM"),
    ]
    assert all(not e["pad"].any() for e in rec.sched)


def test_samples_mirror_sampler_bpf(tmp_path: Path) -> None:
    rec = load(host_mix().write(tmp_path / "x.vmprof"))
    s = rec.samples

    def at(cpu: int, t_ms: int) -> tuple:
        (r,) = s[(s["cpu"] == cpu) & (s["time_ns"] == BASE_NS + t_ms * MS)]
        return (int(r["pid"]), int(r["tid"]), int(r["flags"]), int(r["exit_reason"]), int(r["vcpu_id"]),
                int(r["guest_cr3"]), int(r["stack_id"]))

    assert at(0, 5) == (500, 500, 0, 0, 0, 0, -1)  # host user
    assert at(0, 25) == (40, 40, SAMPLE_HOST_KERNEL, 0, 0, 0, -1)  # host kernel thread
    assert at(0, 35) == (0, 0, SAMPLE_HOST_KERNEL, 0, 0, 0, -1)  # idle
    guest = SAMPLE_HOST_KERNEL | SAMPLE_VCPU | SAMPLE_GUEST
    assert at(1, 5) == (100, 101, guest, VMX_EXTERNAL_INTERRUPT, 0, GUEST_CR3, -1)  # guest user
    assert at(1, 55) == (100, 101, guest | SAMPLE_GUEST_KERNEL, VMX_EXTERNAL_INTERRUPT, 0, GUEST_CR3, -1)
    assert at(1, 45) == (100, 101, SAMPLE_HOST_KERNEL | SAMPLE_VCPU, VMX_IO, 0, 0, -1)  # KVM handles the exit
    assert int(s[(s["cpu"] == 0) & (s["time_ns"] == BASE_NS + 35 * MS)]["host_ip"][0]) == HOST_SYMBOLS["default_idle"]


# -- host level ------------------------------------------------------------------------------------


def test_host_level_ratios_and_vm_rows(tmp_path: Path) -> None:
    p = analyse(host_mix(), tmp_path).host_profile()
    # 200 samples; the 40 idle samples are replaced by the idle time from switches: CPU0 30-50 and 70-90,
    # CPU1 60-80 = 60 ms = 60 samples at 1 kHz
    assert p.total_samples == 200
    assert p.ratios == approx({"os": 100 * 10 / 200, "user": 100 * 20 / 200, "idle": 100 * 60 / 200,
                               "vm": 100 * (80 + 30) / 200})
    assert rows(p) == {
        ("[unknown]", "app", "app"): 20,  # maps snapshot names the module; no ELF: no function
        ("worker_thread", "[kernel.kallsyms]", "kworker/0:1"): 10,
        ("[idle]", "(cpu idle)", None): 60,
        # guest code and KVM's work for its vCPU; the VMM's process names the row (issue 16: JSON had pid, no name)
        ("[web]", "(VM2)", "qemu-system-x86"): 40 + 10 + 10 + 20,
        ("[db]", "(VM1)", "qemu-system-x86"): 20 + 10,
    }
    assert [(r.pid, r.vm) for r in p.rows if r.function == "[web]"] == [(100, "web")]
    # unresolved: app's 20 (no symbols) and, though they show as VM rows here, the 100 guest samples (no bundle)
    assert p.duration_s == 0.1 and p.lost_samples == 0 and p.unresolved_samples == 20 + 100


def test_host_level_per_cpu(tmp_path: Path) -> None:
    an = analyse(host_mix(), tmp_path)
    cpu0, cpu1 = an.host_profile(cpu=0), an.host_profile(cpu=1)
    assert cpu0.total_samples == 100 and cpu1.total_samples == 100
    assert cpu0.ratios == approx({"os": 10.0, "user": 20.0, "idle": 40.0, "vm": 30.0})
    assert cpu1.ratios == approx({"os": 0.0, "user": 0.0, "idle": 20.0, "vm": 80.0})
    assert "CPU 1 only" in cpu1.notes


def test_idle_comes_from_idle_task_switches(tmp_path: Path) -> None:
    """An idle CPU that takes no sampling interrupts (CPU 1 on the PVM machines) is measured all the same."""
    b = host_mix()
    b.silent_idle_cpus = {1}
    an = analyse(b, tmp_path)
    assert len(an.samples) == 200 - 20  # no samples on CPU1 while it idles 60-80
    assert an.cpu_idle_ns() == {0: 40 * MS, 1: 20 * MS}
    p = an.host_profile()
    assert p.total_samples == 200 and p.ratios["idle"] == approx(30.0)
    assert an.host_profile(cpu=1).ratios == approx({"os": 0.0, "user": 0.0, "idle": 20.0, "vm": 80.0})


# -- vCPU timelines and blanks ---------------------------------------------------------------------


def test_timeline_run_intervals_and_halt_blank(tmp_path: Path) -> None:
    an = analyse(host_mix(), tmp_path)
    web = timeline(an, "web", 0)
    # life: first record (sample at 0) to last record (sample at 99); on CPU 0-60 and 80-99
    assert (web.pid, web.tid, ms(web.start_ns), ms(web.end_ns), web.on_cpu_ns) == (100, 101, 0, 99, 79 * MS)
    assert blanks(web) == [(60, 80, BlankKind.IDLE, VMX_HLT, 1, "idle")]
    db = timeline(an, "db", 0)
    # db first appears switching in at 50
    assert (ms(db.start_ns), ms(db.end_ns), db.on_cpu_ns) == (50, 99, (20 + 9) * MS)
    assert blanks(db) == [(70, 90, BlankKind.IDLE, VMX_HLT, 0, "idle")]


def test_preemption_split_by_who_held_the_pcpu(tmp_path: Path) -> None:
    an = analyse(steal_mix(), tmp_path)
    web0 = timeline(an, "web", 0)
    assert blanks(web0) == [(20, 50, BlankKind.PREEMPTED, VMX_EXTERNAL_INTERRUPT, 0, "kworker/0:1")]
    (b,) = web0.blanks
    assert in_ms(b.same_vm_ns) == {1: 10}  # web1 on CPU0 40-50
    assert in_ms(b.other_vm_ns) == {"db": 10}  # db0 on CPU0 30-40
    assert in_ms(b.holders()) == {"vcpu1": 10, "db": 10, "kworker/0:1": 10}
    assert (ms(web0.start_ns), ms(web0.end_ns), web0.on_cpu_ns) == (0, 99, (20 + 49) * MS)
    web1 = timeline(an, "web", 1)
    # first record: switched in at 5; last: blocked at 50 (a blank that never ends is not counted)
    assert (ms(web1.start_ns), ms(web1.end_ns), web1.on_cpu_ns) == (5, 50, (25 + 10) * MS)
    assert blanks(web1) == [(30, 40, BlankKind.IDLE, VMX_HLT, 1, "idle")]
    db0 = timeline(an, "db", 0)
    assert blanks(db0) == [(40, 45, BlankKind.IDLE, VMX_HLT, 0, "web (VMM)")]  # web's vCPU 1 took CPU0


def test_guest_level_steal_outside_and_on_sibling(tmp_path: Path) -> None:
    an = analyse(steal_mix(), tmp_path)
    v0 = an.guest_profile("web", vcpu=0)
    # 70 real samples + the 30 ms blank as 30 virtual samples: 10 on vcpu1, 20 outside (db, kworker)
    assert rows(v0) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 70, ("[steal]", "(on vcpu1)", None): 10,
                        ("[steal]", "(outside)", None): 20}
    assert v0.total_samples == 100
    assert v0.ratios == approx({"os": 0.0, "user": 70.0, "idle": 0.0, "steal": 30.0})
    v1 = an.guest_profile("web", vcpu=1)
    # 25 + 8 guest samples, 2 in VMM user space (type 2), halted 10 ms
    assert rows(v1) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 33, ("[steal]", "(vmm)", None): 2,
                        ("[idle]", "(halt_exit)", None): 10}
    whole = an.guest_profile("web")
    assert whole.total_samples == 100 + 45
    assert whole.ratios == approx({"os": 0.0, "user": 100 * 103 / 145, "idle": 100 * 10 / 145,
                                   "steal": 100 * 32 / 145})


def test_steal_table_type1_by_holder_type2_by_exit(tmp_path: Path) -> None:
    v0, v1 = vcpu_steal(analyse(steal_mix(), tmp_path), "web")
    assert (v0["vcpu"], v0["tid"], v0["wall_s"], v0["guest_s"], v0["idle_s"]) == (0, 101, 0.099, 0.07, 0.0)
    assert v0["steal_type1_s"] == approx(0.03) and v0["steal_type2_s"] == 0.0
    assert v0["type1_by_holder_s"] == approx({"vcpu1": 0.01, "db": 0.01, "kworker/0:1": 0.01})
    assert v0["host_reported_steal_s"] == approx(0.03)
    assert (v1["vcpu"], v1["wall_s"], v1["on_cpu_s"], v1["idle_s"]) == (1, 0.045, 0.035, 0.01)
    assert v1["guest_s"] == approx(0.033)
    assert v1["type2_by_exit_s"] == approx({"vmm user space": 0.002}) and v1["type1_by_holder_s"] == {}
    assert v1["ratios"]["idle"] == approx(100 * 10 / 45)


def test_vmm_work_is_type2_steal_by_exit_category(tmp_path: Path) -> None:
    """One vCPU on one CPU: guest 0-10 | KVM: I/O 10-20, WRMSR 20-25, EPT violation 25-28 | VMM user space
    28-30 | guest 30-38 | VMM user space 38-40 | VMM blocked 40-50 (CPU idle) | guest 50-60 | stops; noisy 60-70."""
    b = SynthRecording(frequency=1000, cpus=1)
    vm = b.vm("io", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=10 * MS)
    b.vmm_work(vm, 0, cpu=0, start_ns=10 * MS, end_ns=20 * MS, exit_reason=VMX_IO)
    b.vmm_work(vm, 0, cpu=0, start_ns=20 * MS, end_ns=25 * MS, exit_reason=VMX_MSR_WRITE)
    b.vmm_work(vm, 0, cpu=0, start_ns=25 * MS, end_ns=28 * MS, exit_reason=VMX_EPT_VIOLATION)
    b.vmm_work(vm, 0, cpu=0, start_ns=28 * MS, end_ns=30 * MS, exit_reason=VMX_IO, in_kernel=False)
    b.run(vm, 0, cpu=0, start_ns=30 * MS, end_ns=38 * MS)
    b.vmm_work(vm, 0, cpu=0, start_ns=38 * MS, end_ns=40 * MS, exit_reason=VMX_IO, in_kernel=False)
    b.block(vm, 0, 40 * MS, 50 * MS)
    b.run(vm, 0, cpu=0, start_ns=50 * MS, end_ns=60 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=60 * MS, end_ns=70 * MS)
    an = analyse(b, tmp_path)
    tl = timeline(an, "io", 0)
    assert blanks(tl) == [(40, 50, BlankKind.BLOCKED, 0, 0, "idle")]  # blocked in user space: no vCPU loaded
    assert (ms(tl.start_ns), ms(tl.end_ns), tl.on_cpu_ns) == (0, 60, 50 * MS)
    (v,) = vcpu_steal(an, "io")
    assert v["type2_by_exit_s"] == approx({"io": 0.010, "vmm blocked": 0.010, "msr": 0.005, "ept": 0.003,
                                           "vmm user space": 0.004})
    assert v["steal_type2_s"] == approx(0.032) and v["steal_type1_s"] == 0.0 and v["guest_s"] == approx(0.028)
    g = an.guest_profile("io")
    assert rows(g) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 28, ("[steal]", "(vmm)", None): 10 + 5 + 3 + 4,
                       ("[steal]", "(vmm blocked)", None): 10}
    assert g.total_samples == 60 and g.ratios["steal"] == approx(100 * 32 / 60)


def test_exit_categories_follow_the_recordings_backend(tmp_path: Path) -> None:
    """AMD SVM numbering, one CPU: guest 0-10 | KVM: IOIO 10-15, MSR 15-17 | guest 17-30 | halted 30-40 | guest
    40-50 | stops; noisy 50-60."""
    b = SynthRecording(frequency=1000, cpus=1, backend="svm")
    vm = b.vm("amd", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=10 * MS)
    b.vmm_work(vm, 0, cpu=0, start_ns=10 * MS, end_ns=15 * MS, exit_reason=0x7B)
    b.vmm_work(vm, 0, cpu=0, start_ns=15 * MS, end_ns=17 * MS, exit_reason=0x7C)
    b.run(vm, 0, cpu=0, start_ns=17 * MS, end_ns=30 * MS)
    b.halt(vm, 0, 30 * MS, 40 * MS)
    b.run(vm, 0, cpu=0, start_ns=40 * MS, end_ns=50 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=50 * MS, end_ns=60 * MS)
    an = analyse(b, tmp_path)
    assert an.backend == "svm"
    assert blanks(timeline(an, "amd", 0)) == [(30, 40, BlankKind.IDLE, 0x78, 0, "idle")]  # SVM_EXIT_HLT
    (v,) = vcpu_steal(an, "amd")
    assert v["type2_by_exit_s"] == approx({"io": 0.005, "msr": 0.002})
    assert (v["guest_s"], v["idle_s"]) == approx((0.033, 0.010))


# -- guest level -----------------------------------------------------------------------------------


def test_guest_level_ratios(tmp_path: Path) -> None:
    p = analyse(host_mix(), tmp_path).guest_profile("web")
    # 60 guest user + 10 guest kernel samples, 10 KVM samples (type 2), halted 60-80: 20 virtual samples
    assert p.total_samples == 100
    assert rows(p) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 60,
                       ("[unknown]", "[guest.kallsyms]", "[cr3 0x1000]"): 10,
                       ("[idle]", "(halt_exit)", None): 20, ("[steal]", "(vmm)", None): 10}
    assert p.ratios == approx({"os": 10.0, "user": 60.0, "idle": 20.0, "steal": 10.0})
    assert p.unresolved_samples == 70 and any("no guest bundle for VM web" in n for n in p.notes)
    assert p.to_json()["rows"][0] == {"samples": 60, "ratio": 60.0, "function": "[unknown]", "symbol": "[unknown]",
                                      "module": "[unknown]", "process": "[cr3 0x1000]", "pid": None, "vm": "web"}


# real: the sampling grid k / frequency in the vCPU's run intervals 0-20, 30-40, 50-60 (250 Hz: 0, 4, ... 16;
# 32, 36; 52, 56)
@pytest.mark.parametrize(("frequency", "real", "virtual"), [(1000, 40, 10.0), (4000, 160, 40.0), (250, 9, 2.5),
                                                            (100, 4, 1.0)])
def test_a_10ms_blank_is_duration_times_frequency_virtual_samples(tmp_path: Path, frequency: int, real: int,
                                                                  virtual: float) -> None:
    """One CPU: vCPU 0-20 | halted 20-30 | 30-40 | preempted 40-50 by a host task | 50-60 | blocked for good."""
    b = SynthRecording(frequency=frequency, cpus=1)
    vm = b.vm("v", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=20 * MS)
    b.halt(vm, 0, 20 * MS, 30 * MS)
    b.run(vm, 0, cpu=0, start_ns=30 * MS, end_ns=40 * MS)
    b.preempt(vm, 0, 40 * MS, 50 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=40 * MS, end_ns=50 * MS)
    b.run(vm, 0, cpu=0, start_ns=50 * MS, end_ns=60 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=60 * MS, end_ns=70 * MS)
    p = analyse(b, tmp_path).guest_profile("v")
    assert rows(p) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): real, ("[idle]", "(halt_exit)", None): virtual,
                       ("[steal]", "(outside)", None): virtual}
    assert p.total_samples == real + 2 * virtual
    assert p.ratios == approx({"os": 0.0, "user": 100 * real / p.total_samples,
                               "idle": 100 * virtual / p.total_samples, "steal": 100 * virtual / p.total_samples})


class LateSamples(SynthRecording):
    """Every 10th sample of vCPU thread 101 never comes (a cpu-clock timer that fires late skips a period)."""

    def samples(self):  # type: ignore[no-untyped-def]
        s = super().samples()
        vcpu = s["tid"] == 101
        return s[~vcpu | (np.cumsum(vcpu) % 10 != 0)]


def test_guest_shares_are_exact_times_when_samples_come_late(tmp_path: Path) -> None:
    """One CPU at 1 kHz: vCPU 0-400 | preempted 400-600 | 600-800 | halted 800-1000: on the CPU 60%, idle 20%,
    steal 20%. Priced at the nominal period, 540 real samples beside 400 ms of blanks would give 57.4%."""
    b = LateSamples(frequency=1000, cpus=1)
    vm = b.vm("v", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=400 * MS)
    b.preempt(vm, 0, 400 * MS, 600 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=400 * MS, end_ns=600 * MS)
    b.run(vm, 0, cpu=0, start_ns=600 * MS, end_ns=800 * MS)
    b.halt(vm, 0, 800 * MS, 1000 * MS)
    an = analyse(b, tmp_path)
    assert an.guest_profile("v").ratios == approx({"os": 0.0, "user": 60.0, "idle": 20.0, "steal": 20.0}, abs=0.2)
    (v,) = vcpu_steal(an, "v")
    assert v["guest_s"] == approx(0.6, abs=0.002) and v["idle_s"] == approx(0.2, abs=0.002)
    assert v["ratios"]["guest"] + v["ratios"]["idle"] + v["ratios"]["steal"] == approx(100.0, abs=0.01)


def test_guest_bundle_names_processes_and_functions(tmp_path: Path) -> None:
    an = analyse(attribution_mix(), tmp_path)
    p = an.guest_profile("app")
    assert rows(p) == {
        ("compute_a", "[guest.kallsyms]", "worker"): 20,
        ("compute_b", "[guest.kallsyms]", "worker"): 10 + 10 + 3 + 10,
        ("[unknown]", "[unknown]", "other"): 5,  # user code: the bundle gives the process no maps
        ("[steal]", "(vmm)", None): 2,
        ("[steal]", "(outside)", None): 10 + 5 + 5,
        ("[idle]", "(halt_exit)", None): 10,
        ("[steal]", "(vmm blocked)", None): 5,
    }
    assert p.total_samples == 95  # life 0-95 (stopped at 95)
    assert p.ratios == approx({"os": 100 * 53 / 95, "user": 100 * 5 / 95, "idle": 100 * 10 / 95,
                               "steal": 100 * 27 / 95})
    assert [(r.pid, r.vm) for r in p.rows if r.process == "worker"] == [(7, "app"), (7, "app")]
    assert p.unresolved_samples == 5


# -- steal attribution and corrected times ---------------------------------------------------------


def test_attribution_per_function(tmp_path: Path) -> None:
    an = analyse(attribution_mix(), tmp_path)
    tl = timeline(an, "app", 0)
    assert tl.on_cpu_ns == 60 * MS  # = 60 samples of the thread: 1 ms of run time per sample
    got = [(a.process, a.function, a.module, a.vcpu, a.samples, a.run_ns / MS, a.steal_ns / MS,
            a.steal_type1_ns / MS, a.apparent_ns / MS) for a in attributions(an, "app")]
    assert got == [
        # B: preempted 45-50 between B and B (type 1), the VMM in user space 78-80 (2 samples) and blocked
        # 80-85 between B (77) and B (85) (type 2); not 60-70 (halt: idle is not steal)
        ("worker", "compute_b", "[guest.kallsyms]", 0, 33, 33.0, 5.0 + 2.0 + 5.0, 5.0, 33.0 + 12.0),
        ("worker", "compute_a", "[guest.kallsyms]", 0, 20, 20.0, 10.0, 10.0, 30.0),  # preempted 10-20
        ("other", "[unknown]", "[unknown]", 0, 5, 5.0, 0.0, 0.0, 5.0),
    ]  # 30-35 sits between A and B: nobody's


def test_attribution_per_process(tmp_path: Path) -> None:
    an = analyse(attribution_mix(), tmp_path)
    got = [(a.process, a.function, a.samples, a.run_ns / MS, a.steal_ns / MS, a.steal_type1_ns / MS)
           for a in attributions(an, "app", per_function=False)]
    # per process, 30-35 (between A and B, both worker) is worker's too
    assert got == [("worker", "", 53, 53.0, 10.0 + 5.0 + 5.0 + 2.0 + 5.0, 10.0 + 5.0 + 5.0),
                   ("other", "", 5, 5.0, 0.0, 0.0)]


def test_corrected_times_in_the_steal_report(tmp_path: Path) -> None:
    rep = steal_report(analyse(attribution_mix(), tmp_path), "app")

    def table(key: str) -> list[tuple]:
        return [(c["process"], c["function"], approx([c["apparent_s"], c["attributed_steal_s"], c["corrected_s"],
                                                       c["host_steal_corrected_s"]])) for c in rep[key]]

    # corrected = apparent - attributed steal; host-steal corrected subtracts only the type 1 part
    assert table("functions") == [("worker", "compute_b", [0.045, 0.012, 0.033, 0.040]),
                                  ("worker", "compute_a", [0.030, 0.010, 0.020, 0.020]),
                                  ("other", "[unknown]", [0.005, 0.0, 0.005, 0.005])]
    assert table("processes") == [("worker", "", [0.080, 0.027, 0.053, 0.060]),
                                  ("other", "", [0.005, 0.0, 0.005, 0.005])]


# -- time ranges -----------------------------------------------------------------------------------


def test_time_range_clips_timelines_idle_and_profiles(tmp_path: Path) -> None:
    """host_mix() from 45.5 to 85.5 ms (bounds between samples: samples 46..85, 40 per CPU)."""
    an = analyse(host_mix(), tmp_path, time_range=(0.0455, 0.0855))
    assert an.duration_s == approx(0.04)
    web = timeline(an, "web", 0)
    # within a range too, a vCPU's life runs from its first to its last record there: samples 46 and 85
    assert (ms(web.start_ns), ms(web.end_ns), web.on_cpu_ns) == (46, 85, (39 - 20) * MS)
    assert blanks(web) == [(60, 80, BlankKind.IDLE, VMX_HLT, 1, "idle")]
    db = timeline(an, "db", 0)
    assert (ms(db.start_ns), ms(db.end_ns)) == approx((50, 85.5))
    assert blanks(db) == [(70, 85.5, BlankKind.IDLE, VMX_HLT, 0, "idle")]
    assert an.cpu_idle_ns() == approx({0: 4.5 * MS + 15.5 * MS, 1: 20 * MS})
    host = an.host_profile()
    # CPU0: db 50-69; CPU1: web 46-59 and 80-85; idle 40 ms
    assert host.total_samples == approx(20 + 20 + 40)
    assert host.ratios == approx({"os": 0.0, "user": 0.0, "idle": 50.0, "vm": 50.0})
    g = an.guest_profile("web")
    assert rows(g) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 6,
                       ("[unknown]", "[guest.kallsyms]", "[cr3 0x1000]"): 10,
                       ("[idle]", "(halt_exit)", None): 20, ("[steal]", "(vmm)", None): 4}
    assert rows(an.guest_profile("db")) == approx({("[unknown]", "[unknown]", "[cr3 0x1000]"): 20,
                                                   ("[idle]", "(halt_exit)", None): 15.5})


def test_time_range_leaving_out_a_vcpu(tmp_path: Path) -> None:
    """steal_mix() from 60.5 to 90.5 ms: web1 stopped at 50, so only web0 and db0 are left."""
    an = analyse(steal_mix(), tmp_path, time_range=(0.0605, 0.0905))
    assert sorted((tl.vm, tl.vcpu) for tl in an.timelines.values()) == [("db", 0), ("web", 0)]
    assert an.guest_profile("web").total_samples == 30 and an.guest_profile("web", vcpu=1).total_samples == 0


# -- edge cases ------------------------------------------------------------------------------------


def test_recording_of_several_chunks(tmp_path: Path) -> None:
    """One CPU, 1.2 s (three 500 ms flushes): a VM runs throughout but for 700-750 ms, when a host task
    that first appears then (its process snapshot is in the second flush) preempts it."""
    b = SynthRecording(frequency=1000, cpus=1)
    vm = b.vm("long", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=700 * MS)
    b.host_task(700, "late", cpu=0, start_ns=700 * MS, end_ns=750 * MS, preempted=True)
    b.run(vm, 0, cpu=0, start_ns=750 * MS, end_ns=1200 * MS)
    path = b.write(tmp_path / "long.vmprof")
    data = path.read_bytes()
    kinds, pos = [], len(MAGIC) + 2
    while pos < len(data):
        _magic, kind, _res, length, _crc = CHUNK_HEADER.unpack_from(data, pos)
        kinds.append(kind)
        pos += CHUNK_HEADER.size + length
    # meta, vms; per flush: snapshots of the processes first sampled, then the tables; kallsyms, end
    assert kinds == [META, SNAPSHOT, SNAPSHOT, SAMPLES, SNAPSHOT, SAMPLES, SCHED, SAMPLES, SNAPSHOT, END]
    an = analyse_recording(load(path))
    assert len(an.samples) == 1200
    # the 50 ms blank at the vCPU's measured rate: 1150 samples in 1149 ms on the CPU (the first one at its start)
    assert rows(an.guest_profile("long")) == approx({("[unknown]", "[unknown]", "[cr3 0x1000]"): 700 + 450,
                                                     ("[steal]", "(outside)", None): 50}, abs=0.05)
    assert rows(an.host_profile()) == {("[long]", "(VM1)", "qemu-system-x86"): 1150, ("[unknown]", "late", "late"): 50}
    assert in_ms(timeline(an, "long", 0).blanks[0].holders()) == {"late": 50}


def test_recording_without_sched_events(tmp_path: Path) -> None:
    """Two CPUs: a VM runs on CPU1 for the whole 100 ms, CPU0 idles: nothing ever switches."""
    b = SynthRecording(frequency=1000, cpus=2)
    vm = b.vm("solo", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=1, start_ns=0, end_ns=100 * MS)
    an = analyse(b, tmp_path)
    assert len(an.sched) == 0 and an.cpu_idle_ns() == {}
    tl = timeline(an, "solo", 0)
    assert (ms(tl.start_ns), ms(tl.end_ns), tl.on_cpu_ns, tl.blanks) == (0, 99, 99 * MS, [])
    g = an.guest_profile("solo")
    assert g.total_samples == 100 and g.ratios == approx({"os": 0.0, "user": 100.0, "idle": 0.0, "steal": 0.0})
    assert "no scheduler events in this recording: idle and steal are unknown" in g.notes
    host = an.host_profile()  # idle from the idle task's samples when there are no switches
    assert host.total_samples == 200 and host.ratios == approx({"os": 0.0, "user": 0.0, "idle": 50.0, "vm": 50.0})
    assert rows(host)[("default_idle", "[kernel.kallsyms]", "swapper")] == 100


def test_recording_without_sched_events_and_silent_idle_cpu(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=2, silent_idle_cpus=(0,))
    vm = b.vm("solo", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=1, start_ns=0, end_ns=100 * MS)
    host = analyse(b, tmp_path).host_profile()
    assert host.total_samples == 100 and host.ratios == approx({"os": 0.0, "user": 0.0, "idle": 0.0, "vm": 100.0})


def test_vcpu_that_never_ran(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=1)
    vm = b.vm("two", pid=100, vcpus={0: 101, 1: 102})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=50 * MS)
    b.host_task(600, "noisy", cpu=0, start_ns=50 * MS, end_ns=60 * MS)
    an = analyse(b, tmp_path)
    assert [tl.vcpu for tl in an.vm_timelines("two")] == [0]
    assert an.vcpu_of_tid == {101: (100, 0), 102: (100, 1)}
    assert an.guest_profile("two", vcpu=1).total_samples == 0
    assert an.guest_profile("two", vcpu=1).ratios == {"os": 0.0, "user": 0.0, "idle": 0.0, "steal": 0.0}
    assert an.guest_profile("two").total_samples == 50
    assert [v["vcpu"] for v in vcpu_steal(an, "two")] == [0]


def test_blank_at_the_start_is_not_part_of_the_vcpu_life(tmp_path: Path) -> None:
    """One CPU, 100 ms: the vCPU is halted from before the recording until 20, then runs.

    The sched events cannot tell why a thread was off its CPU before its first switch in, so the guest
    level starts the vCPU's life there; the host level still sees the CPU idle from the start."""
    b = SynthRecording(frequency=1000, cpus=1)
    vm = b.vm("late", pid=100, vcpus={0: 101})
    b.halt(vm, 0, 0, 20 * MS)
    b.run(vm, 0, cpu=0, start_ns=20 * MS, end_ns=100 * MS)
    an = analyse(b, tmp_path)
    tl = timeline(an, "late", 0)
    assert (ms(tl.start_ns), ms(tl.end_ns), tl.on_cpu_ns, tl.blanks) == (20, 99, 79 * MS, [])
    assert an.guest_profile("late").total_samples == 80 and an.guest_profile("late").ratios["idle"] == 0.0
    assert an.cpu_idle_ns() == {0: 20 * MS}
    assert an.host_profile().ratios == approx({"os": 0.0, "user": 0.0, "idle": 20.0, "vm": 80.0})


def test_blank_at_the_end_runs_to_the_recording_end(tmp_path: Path) -> None:
    """One CPU, 100 ms: the vCPU runs 0-80, then halts until the recording ends (the CPU idles)."""
    b = SynthRecording(frequency=1000, cpus=1)
    vm = b.vm("early", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=80 * MS)
    b.halt(vm, 0, 80 * MS, 100 * MS)
    an = analyse(b, tmp_path)
    tl = timeline(an, "early", 0)
    # the window ends at the recording's end (100 ms), not at its last record (the idle task's sample at 99 ms)
    assert (ms(tl.start_ns), ms(tl.end_ns), tl.on_cpu_ns) == (0, 100, 80 * MS)
    assert blanks(tl) == [(80, 100, BlankKind.IDLE, VMX_HLT, 0, "idle")]
    g = an.guest_profile("early")
    assert rows(g) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 80, ("[idle]", "(halt_exit)", None): 20}
    assert an.cpu_idle_ns() == {0: 20 * MS}


# -- findings: bugs these tests found (each was xfail until fixed; the commits give before/after) --


def test_finding_first_interval_of_a_migrating_vcpu(tmp_path: Path) -> None:
    """steal_mix() with web1 on CPU1 from 0: its first interval is 0-30 on CPU1, not CPU0."""
    an = analyse(steal_mix(web1_from_start=True), tmp_path)
    (b,) = timeline(an, "web", 0).blanks
    assert in_ms(b.holders()) == {"vcpu1": 10, "db": 10, "kworker/0:1": 10}
    assert rows(an.guest_profile("web", vcpu=0))[("[steal]", "(on vcpu1)", None)] == 10


def test_finding_holder_after_another_vms_vcpu(tmp_path: Path) -> None:
    """One CPU: web0 0-20 | db0 20-30 | kworker/0:1 30-40 | web0 40-100; db0 halts at 30 until the end."""
    b = SynthRecording(frequency=1000, cpus=1)
    web = b.vm("web", pid=100, vcpus={0: 101})
    db = b.vm("db", pid=200, vcpus={0: 201})
    b.run(web, 0, cpu=0, start_ns=0, end_ns=20 * MS)
    b.run(db, 0, cpu=0, start_ns=20 * MS, end_ns=30 * MS)
    b.halt(db, 0, 30 * MS, 100 * MS)
    b.host_task(40, "kworker/0:1", cpu=0, start_ns=30 * MS, end_ns=40 * MS, kernel=True)
    b.run(web, 0, cpu=0, start_ns=40 * MS, end_ns=100 * MS)
    an = analyse(b, tmp_path)
    (v,) = vcpu_steal(an, "web")
    assert rows(an.guest_profile("web"))[("[steal]", "(outside)", None)] == 20  # right either way
    assert v["type1_by_holder_s"] == approx({"db": 0.01, "kworker/0:1": 0.01})


def test_finding_time_range_cuts_a_preemption(tmp_path: Path) -> None:
    an = analyse(steal_mix(), tmp_path, time_range=(0.0, 0.0355))
    (b,) = timeline(an, "web", 0).blanks
    assert (ms(b.start_ns), ms(b.end_ns)) == (20, 35.5)
    assert in_ms(b.holders()) == approx({"kworker/0:1": 10, "db": 5.5})
    assert ("[steal]", "(on vcpu1)", None) not in rows(an.guest_profile("web", vcpu=0))


def test_finding_time_range_before_a_blank_open_at_the_end(tmp_path: Path) -> None:
    """One CPU, 100 ms: web0 0-30 | kworker/0:1 30-40 (web0 preempted) | web0 40-80 | web0 halted 80-100 (the CPU
    idles), analysed from 0 to 50.5 ms.  The halt still open at the end began after the range: nothing of it is in
    the range, and the preemption is the only blank.  (It was kept, ending at the range's end before it began, and
    stopped the cut of every blank after the range: reports of a time range on a long recording showed negative
    steal and guest time over 100%.)"""
    b = SynthRecording(frequency=1000, cpus=1)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=0, start_ns=0, end_ns=30 * MS)
    b.preempt(web, 0, 30 * MS, 40 * MS)
    b.host_task(40, "kworker/0:1", cpu=0, start_ns=30 * MS, end_ns=40 * MS, kernel=True)
    b.run(web, 0, cpu=0, start_ns=40 * MS, end_ns=80 * MS)
    b.halt(web, 0, 80 * MS, 100 * MS)
    an = analyse(b, tmp_path, time_range=(0.0, 0.0505))
    tl = timeline(an, "web", 0)
    assert blanks(tl) == [(30, 40, BlankKind.PREEMPTED, VMX_EXTERNAL_INTERRUPT, 0, "kworker/0:1")]
    assert (ms(tl.start_ns), ms(tl.end_ns), tl.on_cpu_ns) == (0, 50.5, 40.5 * MS)
    # samples 0-29 and 40-50, and the preemption at the nominal period (too few samples to measure a rate)
    assert rows(an.guest_profile("web")) == {("[unknown]", "[unknown]", "[cr3 0x1000]"): 41,
                                             ("[steal]", "(outside)", None): 10}


def test_finding_time_range_bounds_count_twice(tmp_path: Path) -> None:
    rec = load(host_mix().write(tmp_path / "x.vmprof"))
    first, second = analyse_recording(rec, time_range=(0.0, 0.05)), analyse_recording(rec, time_range=(0.05, 0.1))
    assert first.host_profile().total_samples == 100
    assert len(first.samples) + len(second.samples) == len(rec.samples)


def test_time_range_to_the_end_keeps_the_last_record(tmp_path: Path) -> None:
    """Without an end chunk (a cut recording) the window ends at the last record, the samples at 99 ms."""
    rec = load(host_mix().write(tmp_path / "x.vmprof"))
    rec.end = None
    assert analyse_recording(rec).span()[1] == BASE_NS + 99 * MS
    assert len(analyse_recording(rec, time_range=(0.05, 0.099)).samples) == 2 * 50


def test_finding_cpu_idle_the_whole_recording(tmp_path: Path) -> None:
    """Two CPUs: CPU0 app 0-80, idle 80-90, app 90-100; CPU1 idle throughout (taking samples)."""
    b = SynthRecording(frequency=1000, cpus=2)
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=80 * MS)
    b.host_task(500, "app", cpu=0, start_ns=90 * MS, end_ns=100 * MS)
    p = analyse(b, tmp_path).host_profile()
    assert p.total_samples == 200
    assert p.ratios == approx({"os": 0.0, "user": 45.0, "idle": 55.0, "vm": 0.0})


def test_finding_vmm_work_between_samples_of_one_function(tmp_path: Path) -> None:
    """One CPU: vCPU runs compute_a 0-10 | KVM handles I/O exits 10-15 | compute_a 15-25 | stops; noisy 25-30."""
    b = SynthRecording(frequency=1000, cpus=1)
    app = b.vm("app", pid=300, vcpus={0: 301})
    b.guest_process(app, 7, "worker", WORKER_CR3)
    b.guest_kernel_symbols(app, {"compute_a": COMPUTE_A})
    for start, end in ((0, 10), (15, 25)):
        b.run(app, 0, cpu=0, start_ns=start * MS, end_ns=end * MS, guest_ip=COMPUTE_A + 0x10, guest_cr3=WORKER_CR3,
              kernel=True)
    b.vmm_work(app, 0, cpu=0, start_ns=10 * MS, end_ns=15 * MS, exit_reason=VMX_IO)
    b.host_task(600, "noisy", cpu=0, start_ns=25 * MS, end_ns=30 * MS)
    (c,) = steal_report(analyse(b, tmp_path), "app")["functions"]
    assert (c["function"], c["corrected_s"]) == ("compute_a", approx(0.020))  # right either way
    assert (c["apparent_s"], c["attributed_steal_s"], c["host_steal_corrected_s"]) == approx((0.025, 0.005, 0.025))


def test_finding_blank_at_the_end_on_a_silent_idle_cpu(tmp_path: Path) -> None:
    b = SynthRecording(frequency=1000, cpus=1, silent_idle_cpus=(0,))
    vm = b.vm("early", pid=100, vcpus={0: 101})
    b.run(vm, 0, cpu=0, start_ns=0, end_ns=80 * MS)
    b.halt(vm, 0, 80 * MS, 100 * MS)
    g = analyse(b, tmp_path).guest_profile("early")
    assert g.total_samples == 100 and g.ratios["idle"] == approx(20.0)


def test_resolution_is_a_stage_before_the_analysis() -> None:
    """resolve/prepare.py prepares a recording (time order, span, kept samples, VMs, names) and Analysis only
    analyses what it is given: the two stages called apart give what analyse() gives."""
    import inspect

    from conftest import ROOT

    from vmprof_tui.resolve.prepare import Prepared, prepare, recording_span

    assert list(inspect.signature(Analysis.__init__).parameters) == ["self", "prepared", "shares_only"]
    rec = load(ROOT / "tests" / "data" / "golden" / "steal3.vmprof")
    p = prepare(rec, time_range=(0.5, 1.5))
    assert isinstance(p, Prepared) and p.span == recording_span(rec)
    t = p.samples["time_ns"]
    assert np.all(t[1:] >= t[:-1]) and t[0] >= p.range_ns[0] and t[-1] < p.range_ns[1]
    assert len(p.names.func) == len(p.samples) and set(p.vms.by_pid.values()) == {"steal1", "steal2", "steal3"}
    staged, whole = Analysis(p), analyse_recording(rec, time_range=(0.5, 1.5))
    for vm in [None, "steal1", "steal2", "steal3"]:
        got = staged.host_profile() if vm is None else staged.guest_profile(vm)
        want = whole.host_profile() if vm is None else whole.guest_profile(vm)
        assert got.to_json() == want.to_json()


def test_a_per_sample_column_read_on_the_class_is_its_descriptor() -> None:
    """Analysis.func and its kin (analysis._PerSample) are made per analysis; on the class they are themselves."""
    from vmprof_tui.analyse.analysis import Analysis, _PerSample

    assert all(isinstance(getattr(Analysis, name), _PerSample) for name in ("func", "module", "process", "proc_pid"))
