"""Real, unmodified static programs in demo VMs on the demo guest kernel (issue 31): recorded by vmprof, their
guest-kernel samples are named and counted as OS time, and the VMM's served system calls are type-2 steal by
exit reason, counted as the VMM counts them."""

from __future__ import annotations

import hashlib
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, record_scenario, vmprof

from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.callgraph import PARTIAL, CallGraph
from vmprof_tui.analyse.steal import vcpu_steal
from vmprof_tui.demo import runner, scenarios, workloads

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (tools/bootstrap.sh installs it)
KERNEL_FUNCTIONS = {"syscall_entry", "do_syscall", "call_vmm", "set_fs_base", "kentry"}


def static_program(tmp: Path, name: str) -> Path:
    out = tmp / name
    subprocess.run(["gcc", "-static", "-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-o", str(out),
                    str(ROOT / "tests" / "data" / "guest" / f"{name}.c")], check=True)
    return out


def real_vm(name: str, path: Path, args: list[str], directory: Path, pin: int | None = 1) -> dict:
    c = scenarios.Custom(exec=str(path), args=tuple(args), dir=str(directory), mem_mb=256, pin=pin)
    return {**scenarios.real_vm(name, c)}


def test_syscall_heavy_program_has_named_guest_kernel_and_os_share(tmp_path: Path) -> None:
    program = static_program(tmp_path, "syscall_heavy")
    files = tmp_path / "files"
    files.mkdir()
    r = record_scenario(tmp_path, [real_vm("real", program, ["2.5"], files)], 5.0)
    truth = r.truth["real"]
    proc = truth["processes"][0]
    assert proc["state"] == "exited" and proc["exit_code"] == 0, truth["faults"]
    served = sum(c["count"] for c in proc["syscalls"].values())
    assert served == truth["vcpus"][0]["served_syscalls"] >= 3000
    assert proc["syscalls"]["pread64"]["count"] == proc["syscalls"]["pwrite64"]["count"] > 1000
    assert (files / "blocks.bin").stat().st_size == 64 * 4096  # written where the VM's directory is
    an = analyse(r.rec)
    g = an.guest_profile("real")
    kernel = {row.function: row.samples for row in g.rows if row.module == "[guest.kallsyms]"}
    user = {row.function for row in g.rows if row.module == "syscall_heavy"}
    print(f"guest kernel rows {kernel}, ratios {g.ratios}, served {served}")
    assert set(kernel) <= KERNEL_FUNCTIONS and sum(kernel.values()) > 0
    assert "checksum.constprop.0" in user or "checksum" in user
    assert g.ratios["os"] > 0
    # the served calls as type-2 steal: the VMM's user-space time by the exits it served, counted exactly
    v = vcpu_steal(an, "real")[0]
    serving_s = sum(c["ns"] for c in proc["syscalls"].values()) / 1e9
    print(f"exits to the VMM {v['exits_to_vmm']}, type 2 by exit {v['type2_by_exit_s']}, "
          f"the VMM's serving time {serving_s:.3f}s")
    assert abs(v["exits_to_vmm"]["MMIO"] - served) <= 0.01 * served
    assert v["type2_by_exit_s"]["vmm user space (MMIO)"] > 0


def test_busybox_runs_unmodified_with_files_confined(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"vmprof guest kernel\n" * 100)
    p = vmprof("demo", "--scenario", "custom", "--exec", str(BUSYBOX), "--arg", "sha256sum", "--arg", "/f.txt",
               "--arg", "../../etc/hostname", "--dir", str(tmp_path), "--no-tui", "-d", "20")
    digest = hashlib.sha256((tmp_path / "f.txt").read_bytes()).hexdigest()
    assert f"{digest}  /f.txt\n" in p.stdout
    assert "can't open '../../etc/hostname': No such file or directory" in p.stderr  # outside: not there
    p = vmprof("demo", "--scenario", "custom", "--exec", str(BUSYBOX), "--arg", "echo", "--arg", "hi", "--no-tui",
               "-d", "20")
    assert p.returncode == 0 and "hi\n" in p.stdout


def test_a_faulting_program_ends_alone(tmp_path: Path) -> None:
    crash = static_program(tmp_path, "crash")
    vm = real_vm("two", crash, [], tmp_path, pin=None)
    vm["vcpus"] += real_vm("x", BUSYBOX, ["echo", "survivor"], tmp_path, pin=None)["vcpus"]
    vm["vcpus"][1]["processes"][0]["argv"][0] = "busybox"
    with runner.DemoRun([vm], duration_s=20) as run:
        run.wait(25)
    faults = run.faults
    assert len(faults) == 1 and faults[0]["ended"] == "process"
    assert "exception 14 (page fault, error code 0x6, address 0x10)" in faults[0]["what"]
    procs = run.truth["two"]["processes"]
    assert [p["state"] for p in procs] == ["faulted", "exited"] and procs[1]["exit_code"] == 0
    assert any(e.get("text") == "survivor\n" for e in run.output)


@pytest.mark.parametrize("path,why", [("/bin/ls", "dynamically linked"), ("/etc/passwd", "not a valid ELF file")])
def test_not_a_static_x86_64_program_is_refused_with_one_line(path: str, why: str) -> None:
    p = vmprof("demo", "--scenario", "custom", "--exec", path, "--no-tui", "-d", "1")
    assert p.returncode == 2 and p.stdout == ""
    assert why in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name,args", [("shor", ["143", "1"]), ("gzip", ["1", "1"]), ("xz", ["1", "1"]),
                                       ("sqlite", ["1"]), ("lua", ["1"])])
def test_real_workload_runs_natively_and_in_a_vm(name: str, args: list[str], tmp_path: Path) -> None:
    native = subprocess.run([str(workloads.program_path(name)), *args], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert native.returncode == 0 and native.stdout.startswith(f"{name}: "), native.stderr
    p = vmprof("demo", "--scenario", "custom", "--program", name, *(a for x in args for a in ("--arg", x)),
               "--dir", str(tmp_path), "--no-tui", "-d", "30")
    assert p.returncode == 0, p.stderr
    assert f"\n{name}: " in "\n" + p.stdout and "not served" not in p.stderr


def test_smp2_each_vcpu_profile_and_steal_against_the_vmm(tmp_path: Path) -> None:
    """002 Tables 10-11: one VM, 2 vCPUs on 2 pCPUs, shor and gzip: each vCPU's profile is its program's and its
    steal while runnable is its thread's run-queue wait as the kernel counts it (the VMM's schedstat), within 1
    point.  That is type 1 and the VMM-blocked steal: a vCPU thread that blocked outside KVM_RUN (the syscall-heavy
    gzip's VMM waits for Python's lock) is type 2 to vmprof, and its wait for the pCPU after the wake-up is in the
    kernel's run-queue wait."""
    r = record_scenario(tmp_path, "smp2", 4.0)
    truth = r.truth["smp2"]
    assert not truth["faults"]
    an = analyse(r.rec)
    steal = vcpu_steal(an, "smp2")
    for v, s, program in zip(truth["vcpus"], steal, ("shor", "gzip"), strict=True):
        g = an.guest_profile("smp2", vcpu=v["vcpu"])
        processes = {row.process for row in g.rows if row.process}
        waiting = 100 * (s["steal_type1_s"] + s["type2_by_exit_s"].get("vmm blocked", 0.0)) / s["wall_s"]
        want = 100 * v["run_delay_ns"] / v["wall_ns"]
        print(f"vcpu{v['vcpu']} ({program}, pCPU {v['pin']}): processes {processes}, type 1 + vmm blocked "
              f"{waiting:.2f}% (run-queue wait {want:.2f}%), ratios {g.ratios}")
        assert processes == {program}
        assert abs(waiting - want) <= 1


def test_native_vs_guest_runs_the_same_binary_on_the_host_beside_the_vm() -> None:
    specs = runner.scenario_specs("native-vs-guest")
    with runner.DemoRun(specs, duration_s=30) as run:
        native = run.native[0]
        assert native.poll() is None  # running on the host while the VM runs
        assert Path(f"/proc/{native.pid}/exe").resolve().name in ("taskset", "shor")
        guest = run.ready["guest"]["processes"][0]
        assert Path(guest["elf"]).name == "shor"
    assert native.poll() is not None  # stopped with the VM


def test_record_g_chains_run_from_the_guest_kernel_into_user_code(tmp_path: Path) -> None:
    """record -g of a real program: a guest-kernel sample's chain is syscall_entry → do_syscall → call_vmm below the
    user function that made the call (the kernel's entry frame links to the user RIP and RBP)."""
    program = static_program(tmp_path, "syscall_heavy")
    r = record_scenario(tmp_path, [real_vm("real", program, ["2.5"], tmp_path)], 4.0, frequency=2000, stacks=True)
    ws = CallGraph(analyse(r.rec)).weighted("guest", "real")
    chains: Counter = Counter()
    for path, ctx, n in zip(ws.paths, ws.contexts, ws.counts.tolist(), strict=True):
        frames = tuple(f for f in path[ctx:] if f != PARTIAL)
        if "call_vmm" in frames:
            chains[frames] += n
    print(chains.most_common(6))
    kernel = ("syscall_entry", "do_syscall", "call_vmm")
    into_user = sum(n for c, n in chains.items() if c[-3:] == kernel and c[-4] in ("pread64", "pwrite64",
                                                                                   "clock_gettime"))
    assert into_user >= 0.8 * sum(chains.values()) > 0


@pytest.mark.parametrize("args,why", [(["--mem", "5X"], "is not a guest memory size"),
                                      (["--mem", "1T"], "is not a guest memory size"),
                                      (["--dir", "/nonexistent-dir"], "is not a directory")])
def test_bad_real_program_options_are_one_line(args: list[str], why: str) -> None:
    p = vmprof("demo", "--scenario", "custom", "--exec", str(BUSYBOX), *args, "--no-tui", "-d", "1")
    assert p.returncode == 2 and why in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
