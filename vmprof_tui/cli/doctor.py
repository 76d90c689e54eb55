"""`vmprof doctor`: what this host can do, each item with how to fix it."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from vmprof_tui.collect import backends
from vmprof_tui.collect import bpf as collect
from vmprof_tui.collect.btf import BTF_DIR
from vmprof_tui.lbr.capability import LBR_DEPTH_FILE
from vmprof_tui.resolve.memo import keytable_problem


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    essential: bool = True  # recording is impossible without it


def _privileges() -> Check:
    try:
        collect.check_privileges()
        return Check("privileges", True, "root" if os.geteuid() == 0 else "CAP_BPF + CAP_PERFMON")
    except collect.CollectError as e:
        return Check("privileges", False, str(e), "run as root, or setcap cap_bpf,cap_perfmon+ep on the python binary")


def key_table() -> Check:
    """The compiled table of streamed reports' memo (resolve/memo.py): missing or stale, they run slower."""
    problem = keytable_problem()
    return Check("key table", problem is None, "resolve/_keytable built, of this version" if problem is None
                 else f"resolve/_keytable {problem}: streamed reports run without their memo (slower, the same "
                 "output)", "bash tools/bootstrap.sh", essential=False)


def run_checks() -> list[Check]:
    checks = [_privileges()]
    vmlinux = BTF_DIR / "vmlinux"
    btf = vmlinux.exists()
    checks.append(Check("BTF", btf, str(vmlinux) if btf else f"no {vmlinux}",
                        "use a kernel built with CONFIG_DEBUG_INFO_BTF=y"))
    try:
        collect._import_bcc()
        checks.append(Check("bcc", True, "python3-bpfcc importable"))
        bcc_ok = True
    except collect.CollectError as e:
        checks.append(Check("bcc", False, str(e), "bash tools/bootstrap.sh"))
        bcc_ok = False
    build = collect.kernel_build_dir()
    detail = f"{build} missing"
    if build.exists():
        target = os.path.realpath(build)
        detail = f"{build} -> {target}"
        release = os.uname().release
        if release not in target:
            detail += (f" (headers of another kernel than {release}: fine, the BPF programs use UAPI headers only "
                       "and take kernel structure offsets from this kernel's BTF)")
    checks.append(Check("kernel headers", build.exists(), detail,
                        "bash tools/bootstrap.sh (links Debian's linux-headers there)"))
    name = backends.detect_backend()
    kvm_dev = Path("/dev/kvm").exists()
    checks.append(Check("KVM", name != backends.NONE,
                        f"backend {name}" + (", /dev/kvm present" if kvm_dev else ", no /dev/kvm"),
                        "no KVM module loaded: vmprof will profile the host alone", essential=False))
    backend = None
    try:
        backend = backends.load_backend()
        detail = f"{len(backend.offsets)} kernel offsets from BTF"
        if backend.kvm_sched_in:
            detail += f", kvm_sched_in at {backend.kvm_sched_in:#x}"
        checks.append(Check("vCPU state offsets", True, detail))
    except backends.BackendError as e:
        checks.append(Check("vCPU state offsets", False, str(e), "see the message"))
    pmu = collect.pmu_available()
    checks.append(Check("hardware PMU", pmu, "cycles events available" if pmu else
                        "none (perf's cpu PMU is not registered): sampling uses cpu-clock (hrtimer, not NMI)",
                        "run on bare metal or a VM with a virtual PMU for cycles/NMI sampling", essential=False))
    lbr = pmu and Path(LBR_DEPTH_FILE).exists()
    checks.append(Check("LBR", lbr, "branch stack available" if lbr else "no branch stack: `vmprof blocks` can "
                        "only import `perf script` data recorded elsewhere", "an Intel CPU with LBR, on bare metal",
                        essential=False))
    if name == backends.VMX:
        helper = backends.VMX_HELPER_PARAMS.exists()
        checks.append(Check("helper_kmod", helper, "vmprof_vmx loaded" if helper else
                            "not loaded: guest RIP/CR3 will be unknown on VMX",
                            "make -C helper_kmod && sudo helper_kmod/load.sh", essential=False))
    else:
        checks.append(Check("helper_kmod", True, f"not needed on the {name} backend", essential=False))
    checks.append(key_table())
    event = "cycles (NMI)" if pmu else "cpu-clock (hrtimer)"
    if bcc_ok and backend is not None:
        c = collect.Collector(backend, frequency=100, ring_pages=16)
        try:
            c.start()
            checks.append(Check("BPF programs", True, f"sampler and sched programs load and attach; event {event}"))
        except collect.CollectError as e:
            checks.append(Check("BPF programs", False, str(e), "see the message"))
        finally:
            c.close()
    return checks


HELP = "check this host: privileges, BTF, bcc, KVM, PMU, LBR, helper, key table"
EXAMPLES = """examples:
  vmprof doctor        what this host can do, and how to fix the rest"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    checks = run_checks()
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{'ok ' if c.ok else 'NO '} {c.name:{width}}  {c.detail}")
        if not c.ok and c.fix:
            print(f"    {'':{width}}  fix: {c.fix}")
    essential_ok = all(c.ok for c in checks if c.essential)
    print("vmprof can record on this host." if essential_ok else "vmprof cannot record here yet: see 'fix' above.")
    return 0 if essential_ok else 1
