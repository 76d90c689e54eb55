"""Demo VMs under the real KVM of this machine (issue 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, vmprof

from vmprof_tui.demo import builds, runner, scenarios

pytestmark = pytest.mark.usefixtures("kvm_available")


@pytest.fixture(scope="module")
def kvm_available() -> None:
    runner.check_kvm()  # raises with the reason when this host cannot run the demo


def run_scenario(name: str, seconds: float, custom: scenarios.Custom | None = None) -> dict[str, dict]:
    with runner.DemoRun(runner.scenario_specs(name, custom), duration_s=seconds) as run:
        run.wait(seconds + 10)
    assert not run.faults, run.faults
    return run.truth


def test_guest_runs_natively(tmp_path: Path) -> None:
    native = tmp_path / "compute-native"
    src = Path(str(builds._source_dir()))
    obj = tmp_path / "compute.o"
    subprocess.run(["gcc", "-O2", "-c", "-DVMPROF_NATIVE", "-Dmain=guest_main", f"-I{src}", "-o", str(obj),
                    str(src / "compute.c")], check=True)
    subprocess.run(["gcc", "-O2", "-o", str(native), str(obj), str(ROOT / "tests/native/harness.c")],
                   check=True)
    native_rate = max(float(subprocess.run([str(native), "300"], capture_output=True, text=True,
                                           check=True).stdout) for _ in range(3))
    truth = run_scenario("alone", 2.0)["alone"]
    proc = truth["processes"][0]
    guest_rate = proc["work"] / (proc["cpu_ns"] / 1e9)
    ratio = guest_rate / native_rate
    print(f"guest {guest_rate:.1f} rounds/s, native {native_rate:.1f} rounds/s, ratio {ratio:.3f}")
    assert ratio >= 0.5


def test_two_processes_progress_with_own_cr3() -> None:
    truth = run_scenario("two-procs", 2.0)["twoprocs"]
    a, b = truth["processes"]
    assert a["cr3"] != b["cr3"]
    assert a["work"] > 0 and b["work"] > 0
    assert a["slices"] > 50 and b["slices"] > 50  # time-sliced, not run one after the other
    share = a["run_ns"] / (a["run_ns"] + b["run_ns"])
    assert 0.4 < share < 0.6


def test_pinning_is_applied() -> None:
    with runner.DemoRun(runner.scenario_specs("steal3"), duration_s=5) as run:
        for vm in run.ready.values():
            for v in vm["vcpus"]:
                status = Path(f"/proc/{vm['pid']}/task/{v['tid']}/status").read_text()
                allowed = [ln for ln in status.splitlines() if ln.startswith("Cpus_allowed_list")][0]
                assert allowed.split()[-1] == str(scenarios.SHARED_CPU)
                assert Path(f"/proc/{vm['pid']}/task/{v['tid']}/comm").read_text().strip() == "vcpu0"
            assert Path(f"/proc/{vm['pid']}/comm").read_text().strip() == vm["vm"]


def test_duty_cycle_busy_share() -> None:
    truth = run_scenario("halt", 3.0)["halt"]
    v = truth["vcpus"][0]
    busy = v["kvm_run_ns"] / v["wall_ns"]
    halted = v["halt_ns"] / v["wall_ns"]
    print(f"busy {busy:.3f} halted {halted:.3f}")
    assert abs(busy - 1 / 3) < 0.03
    assert abs(halted - 2 / 3) < 0.03


def _children_gone(pids: list[int]) -> bool:
    for _ in range(50):
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_and_prints_truth(sig: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "demo", "-s", "steal3", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    desc = json.loads(proc.stdout.readline())
    pids = [vm["pid"] for vm in desc["vms"]]
    assert len(pids) == 3
    time.sleep(1.0)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    truth = json.loads(out.strip().splitlines()[-1])["truth"]
    assert len(truth) == 3 and all(t["vcpus"][0]["kvm_run_ns"] > 0 for t in truth)
    assert _children_gone(pids)


def test_faulting_program_is_reported(tmp_path: Path) -> None:
    elf = tmp_path / "fault"
    builds.build(ROOT / "tests/native/fault.c", elf)
    spec = {"name": "faulty", "vcpus": [{"pin": None, "processes": [{"path": str(elf), "name": "fault"}]}]}
    out = subprocess.run([sys.executable, "-m", "vmprof_tui.demo.vmm", json.dumps(spec)],
                         capture_output=True, text=True, timeout=30)
    events = [json.loads(line) for line in out.stdout.splitlines()]
    fault = [e for e in events if e["event"] == "fault"][0]
    assert fault["process"] == "fault" and fault["pid"] == 1
    assert fault["rip"] is not None
    with open(elf, "rb") as f:
        from elftools.elf.elffile import ELFFile
        sym = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name("crash_here")[0]
    assert sym["st_value"] <= fault["rip"] < sym["st_value"] + sym["st_size"]
    assert events[-1]["event"] == "exit" and out.returncode == 1


def test_bad_program_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "notelf"
    bad.write_bytes(b"#!/bin/sh\necho hi\n")
    dynamic = tmp_path / "dynamic"
    subprocess.run(["gcc", "-o", str(dynamic), "-x", "c", "-"], input="int main(){return 0;}",
                   text=True, check=True)
    for path in (bad, dynamic):
        spec = {"name": "bad", "vcpus": [{"processes": [{"path": str(path)}]}]}
        out = subprocess.run([sys.executable, "-m", "vmprof_tui.demo.vmm", json.dumps(spec)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert str(path) in lines[0]


def test_no_kvm_device_is_one_clear_line() -> None:
    out = vmprof("demo", "-d", "1", env={**os.environ, "VMPROF_KVM_DEVICE": "/nonexistent/kvm"})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "vmprof: /nonexistent/kvm does not exist: this host has no KVM, so the demo VMs cannot run "
        "(enable virtualisation or load kvm_intel/kvm_amd)"]


def test_no_permission_is_one_clear_line() -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root to drop to an unprivileged user")
    out = subprocess.run([sys.executable, "-m", "vmprof_tui", "demo", "-d", "1"], capture_output=True,
                         text=True, cwd=ROOT, user=65534, group=65534, timeout=60,
                         env={**os.environ, "HOME": "/tmp"})
    assert out.returncode == 1, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "no permission" in out.stderr


def test_bad_usage_exits_2() -> None:
    assert vmprof("demo", "--scenario", "nope").returncode == 2
    assert vmprof("frobnicate").returncode == 2


def test_every_scenario_runs() -> None:
    for name in scenarios.NAMES:
        if name in ("alone", "two-procs", "halt"):
            continue  # covered above
        truth = run_scenario(name, 1.0)
        # demo programs report work; real programs (native-vs-guest, smp2) make system calls the VMM serves
        assert truth and all(p["work"] > 0 if "syscalls" not in p else sum(c["count"] for c in p["syscalls"].values())
                             for vm in truth.values() for p in vm["processes"]), name
        assert not any(vm["faults"] for vm in truth.values()), name
