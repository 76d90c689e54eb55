"""The VMX (and SVM) backend paths that cannot run here, tested with generated data and bcc's verifier
(issue 8).  These machines are PVM; loading helper_kmod and reading a real VMCS is not verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require_root

from vmprof_tui.analyse import exits
from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.steal import steal_report
from vmprof_tui.collect import backends
from vmprof_tui.collect import bpf as collect
from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import (
    SAMPLE_DTYPE,
    SAMPLE_GUEST,
    SAMPLE_GUEST_UNKNOWN,
    SAMPLE_VCPU,
    SCHED_DTYPE,
    SCHED_NEXT_VCPU,
    SCHED_PREV_HALTED,
    SCHED_PREV_LOADED,
    SCHED_PREV_VCPU,
)

# kvm_vcpu/vcpu_vmx offsets as a VMX kernel's BTF would give them (values only need to be plausible here)
FAKE = {"TASK_PREEMPT_NOTIFIERS": 768, "TASK_PID": 1264, "TASK_TGID": 1268, "TASK_COMM": 1752, "PN_OPS": 16,
        "OPS_SCHED_IN": 0, "VCPU_PREEMPT_NOTIFIER": 8, "VCPU_VCPU_ID": 36, "VCPU_RIP": 432, "VCPU_CR3": 472,
        "VCPU_MP_STATE": 612, "VCPU_INTR_FROM_GUEST": 2746}


def test_exit_categories() -> None:
    c = exits.exit_category
    assert (c("vmx", 12), c("vmx", 1), c("vmx", 30), c("vmx", 48), c("vmx", 49), c("vmx", 32)) == (
        "halt", "external_interrupt", "io", "ept", "mmio", "msr")
    assert c("vmx", 0x8000_0021) == c("vmx", 0x21)  # failed-entry bit and friends are masked
    assert c("svm", 0x78) == "halt" and c("svm", 0x7B) == "io" and c("svm", 0x400) == "ept"
    assert c("pvm", 14) == "ept" and c("pvm", 0xEC) == "external_interrupt" and c("pvm", 1024) == "hypercall"
    assert c("vmx", 999) == "vmx exit 0x3e7"
    # PVM: the host-interrupt reason measured on the development machines, hypercalls from the BTF enum
    assert c("pvm", 0x2000) == "external_interrupt" and c("pvm", 0x1009) == "halt" and c("pvm", 0x1003) == "hypercall"
    n = exits.exit_name
    assert (n("pvm", 14), n("pvm", 0x2000), n("pvm", 0x1003), n("pvm", 0xEC)) == (
        "#PF", "host interrupt", "hypercall PVM_HC_WRMSR", "host interrupt vector 0xec")
    assert (n("vmx", 12), n("svm", 0x78), n("svm", 0x4E), n("pvm", 0x3000)) == (
        "HLT", "HLT", "exception #PF", "pvm exit 0x3000")


def test_helper_parameters_reach_the_bpf_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = tmp_path / "parameters"
    params.mkdir()
    (params / "records").write_text("0xffff888012340000\n")
    (params / "nr_records").write_text("2\n")
    monkeypatch.setattr(backends, "VMX_HELPER_PARAMS", params)
    b = backends.Backend("vmx", kvm_sched_in=0xFFFFFFFF81000000, offsets={**FAKE, "VMX_VCPU": 0,
                                                                          "VMX_EXIT_REASON": 9000},
                         vmx_helper=backends._read_vmx_helper())
    flags = b.cflags()
    assert "-DBACKEND_VMX" in flags and "-DVMX_REC_BASE=0xffff888012340000ULL" in flags
    assert "-DVMX_NR_REC=2" in flags


@pytest.mark.parametrize("name,extra,helper", [
    ("vmx", {"VMX_VCPU": 0, "VMX_EXIT_REASON": 9000}, {"records": 0xFFFF888012340000, "nr_records": 2}),
    ("vmx", {"VMX_VCPU": 0, "VMX_EXIT_REASON": 9000}, None),
    ("svm", {"SVM_VCPU": 0, "SVM_VMCB": 8000, "VMCB_SAVE_CR3": 1360, "VMCB_SAVE_CPL": 1227,
             "VMCB_EXIT_CODE": 112}, None),
])
def test_backend_programs_pass_the_verifier(name: str, extra: dict, helper: dict | None) -> None:
    """The VMX and SVM variants of the sampler compile and load into this kernel (never attached)."""
    require_root()
    import bcc

    b = backends.Backend(name, kvm_sched_in=0xFFFFFFFF81000000, offsets={**FAKE, **extra}, vmx_helper=helper)
    cflags = [f"-I{collect.BPF_DIR}", "-DSAMPLE_RING_PAGES=16", "-DSCHED_RING_PAGES=16",
              "-DEXPECTED_HANDLING=1", "-DSAMPLE_PERIOD_NS=1000000", *b.cflags()]
    text = collect.bpf_source().replace("RAW_TRACEPOINT_PROBE(sched_switch)", "int sched_switch_unattached(void *x)")
    text = text.replace("bool preempt = (bool)ctx->args[0];", "struct bpf_raw_tracepoint_args *ctx = x;\n"
                        "\tbool preempt = (bool)ctx->args[0];")
    bpf = bcc.BPF(text=text, cflags=cflags)
    try:
        bpf.load_func("on_sample", bcc.BPF.PERF_EVENT)
    finally:
        bpf.cleanup()


def _vmx_recording(tmp_path: Path) -> recording.Recording:
    """A VMX host without helper_kmod: guest samples carry the vCPU and exit reason, RIP/CR3 unknown."""
    pid, tid, t0, period = 4000, 4001, 10**12, 1_000_000
    s = np.zeros(3000, SAMPLE_DTYPE)
    s["time_ns"] = t0 + np.arange(3000) * period
    s["pid"], s["tid"], s["cpu"] = pid, tid, 1
    s["flags"] = SAMPLE_VCPU | SAMPLE_GUEST | SAMPLE_GUEST_UNKNOWN
    s["exit_reason"] = 1
    kvm = slice(1000, 1100)  # KVM handling I/O and EPT exits for the vCPU
    s["flags"][kvm] = SAMPLE_VCPU
    s["exit_reason"][1000:1050], s["exit_reason"][1050:1100] = 30, 48
    e = np.zeros(2, SCHED_DTYPE)  # halted for 1 s between samples 1999 and 2000
    e["time_ns"] = t0 + 1999 * period + 500_000, t0 + 2999 * period + 500_000
    e["prev_tid"], e["prev_pid"] = (tid, 0), (pid, 0)
    e["next_tid"], e["next_pid"] = (0, tid), (0, pid)
    e["flags"] = (SCHED_PREV_VCPU | SCHED_PREV_LOADED | SCHED_PREV_HALTED, SCHED_NEXT_VCPU)
    e["prev_exit_reason"][0] = 12
    s["time_ns"][2000:] += 1000 * period  # no samples while halted: the vCPU is back after 1 s
    meta = {"backend": "vmx", "frequency": 1000, "event": "cpu-clock"}
    snapshot = recording.snapshot(vms=[{"name": "web1", "pid": pid, "kind": "qemu", "vcpu_threads": {str(tid): 0}}])
    rec = recording.Recording(tmp_path / "vmx.vmprof", meta, s, e, snapshot)
    rec.end = {"duration_s": 4.0, "lost": {"samples": [0, 0], "sched": [0, 0]}, recording.VMS_KEY: rec.vms()}
    return rec


def test_vmx_without_helper_is_reported_not_dropped(tmp_path: Path) -> None:
    an = analyse(_vmx_recording(tmp_path))
    g = an.guest_profile("web1")
    unknown = [r for r in g.rows if r.module == "(guest RIP unknown)"]
    assert unknown and sum(r.samples for r in unknown) == 2900
    assert g.unresolved_samples == 2900
    idle = sum(r.samples for r in g.rows if r.function == "[idle]")
    assert abs(idle - 1000) <= 2  # the halt between the two sched events, in samples at 1 kHz
    rep = steal_report(an, "web1")
    by_exit = rep["vcpus"][0]["type2_by_exit_s"]
    # 50 samples each, at the vCPU's measured rate (3000 samples in 2999 ms on the CPU)
    assert by_exit == pytest.approx({"io": 0.05, "ept": 0.05}, rel=1e-3)


@pytest.mark.parametrize(("handling", "recovers"), [(1, True), (2, False)], ids=["cpu-clock", "cycles"])
def test_missed_switch_ins_are_recovered_only_with_the_cpu_clock_sampler(handling: int, recovers: bool) -> None:
    """A cycles NMI can land between the sched_switch tracepoint and the switch itself and sample the thread
    leaving: with it the sampler must not take that thread for one that arrived (bpf/sched.bpf.c seen_running)."""
    require_root()
    import bcc

    b = backends.Backend("svm", kvm_sched_in=0xFFFFFFFF81000000, offsets={
        **FAKE, "SVM_VCPU": 0, "SVM_VMCB": 8000, "VMCB_SAVE_CR3": 1360, "VMCB_SAVE_CPL": 1227, "VMCB_EXIT_CODE": 112})
    cflags = [f"-I{collect.BPF_DIR}", "-DSAMPLE_RING_PAGES=16", "-DSCHED_RING_PAGES=16",
              f"-DEXPECTED_HANDLING={handling}", "-DSAMPLE_PERIOD_NS=1000000", *b.cflags()]
    bpf = bcc.BPF(text=collect.bpf_source(), cflags=cflags)
    try:
        bpf.load_func("on_sample", bcc.BPF.PERF_EVENT)
        try:
            bpf["cpu_threads"]
            present = True
        except KeyError:
            present = False
        assert present == recovers
    finally:
        bpf.cleanup()
