"""The demo scenarios: VM layouts that mirror the papers' experiments.

A scenario is a list of VM specs (the JSON the demo VMM takes).  Programs are
named here and resolved to built ELF paths by the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

# The pCPU that pinned scenarios share.  CPU 0 is left to the host, the
# profiler and the VMMs' main threads.
SHARED_CPU = 1
THROTTLE_QUOTA_US = (30_000, 100_000)  # the throttled scenario's cpu.max: 30 ms of CPU every 100 ms


REAL_MEM_MB = 512  # guest memory of a VM running a real program (--mem)
REAL_PROGRAMS = ("shor", "gzip", "xz", "sqlite", "lua")  # built from Debian's static libraries (workloads.py)


@dataclass
class Custom:
    """The custom form: any mix of VMs, vCPUs, programs, pinning and duty cycle."""
    vms: int = 1
    vcpus: int = 1
    programs: tuple[str, ...] = ("compute",)
    pin: int | None = None
    busy_ms: int = 10
    idle_ms: int = 20
    exec: str | None = None  # a static x86-64 program of the user's, run by the guest kernel
    args: tuple[str, ...] = ()
    dir: str | None = None  # the host directory the program's files are confined to
    mem_mb: int = REAL_MEM_MB


def _proc(program: str, *args: int) -> dict:
    return {"program": program, "args": list(args)}


def _vm(name: str, *vcpus: dict) -> dict:
    return {"name": name, "vcpus": list(vcpus)}


def _vcpu(pin: int | None, *processes: dict) -> dict:
    return {"pin": pin, "processes": list(processes)}


BLINK_BUSY_US, BLINK_IDLE_US = 300, 100


def duty(busy_ms: int, idle_ms: int) -> dict:
    # The TSC rate is filled in by the runner (it calibrates the host TSC).
    return _proc("duty", busy_ms, idle_ms, 0)


def build(name: str, custom: Custom | None = None) -> list[dict]:
    cpu = SHARED_CPU
    if name == "alone":
        return [_vm("alone", _vcpu(cpu, _proc("compute")))]
    if name == "two-procs":
        return [_vm("twoprocs", _vcpu(cpu, _proc("compute"), _proc("compute")))]
    if name == "steal3":
        return [_vm(f"steal{i}", _vcpu(cpu, _proc("compute"))) for i in (1, 2, 3)]
    if name == "halt":
        return [_vm("halt", _vcpu(cpu, duty(10, 20)))]
    if name == "vcpu2-on-1":
        return [_vm("vcpu2", _vcpu(cpu, _proc("compute")), _vcpu(cpu, _proc("jacobi")))]
    if name == "correction":
        return [_vm("measured", _vcpu(cpu, _proc("compute"))),
                _vm("disturb1", _vcpu(cpu, duty(4, 4))),
                _vm("disturb2", _vcpu(cpu, _proc("jacobi")))]
    if name == "stacks":
        return [_vm("stacks", _vcpu(cpu, _proc("chain"), _proc("recurse"), _proc("clobber")))]
    if name == "stacks-nofp":  # frame-pointer-less programs: their chains only by call-frame information
        return [_vm("nofp", _vcpu(cpu, _proc("compute"), _proc("jacobi"), _proc("chain-nofp"),
                                  _proc("recurse-nofp")))]
    if name == "wakeup":  # the halting VM's wake-ups wait for the busy VM to give up the pCPU
        return [_vm("halting", _vcpu(cpu, duty(2, 8))), _vm("busy", _vcpu(cpu, _proc("compute")))]
    if name == "throttled":
        return [{**_vm("throttled", _vcpu(cpu, _proc("compute"))), "cpu_max": list(THROTTLE_QUOTA_US)}]
    if name == "skew":
        return [_vm("skew", _vcpu(cpu, _proc("compute")), _vcpu(cpu, _proc("jacobi"))),
                _vm("busy", _vcpu(cpu, _proc("compute")))]
    if name == "halt-poll":  # halts of ~100 us: KVM's halt polling (halt_poll_ns, 200 us here) ends them
        return [_vm("blink", _vcpu(cpu, _proc("blink", BLINK_BUSY_US, BLINK_IDLE_US, 0)))]
    if name == "native-vs-guest":  # 002 Tables 3-4: shor in a VM, the same binary natively beside it (runner)
        vm = real_vm("guest", Custom(programs=("shor",), pin=cpu))
        vm["vcpus"][0]["processes"][0]["native_pin"] = 0
        return [vm]
    if name == "smp2":  # 002 Tables 10-11: one VM, 2 vCPUs on 2 pCPUs, a real program on each
        return [real_vm("smp2", Custom(programs=("shor", "gzip")), pins=(0, cpu))]
    if name == "custom":
        c = custom or Custom()
        if c.exec is not None or any(p in REAL_PROGRAMS for p in c.programs):
            return [real_vm(f"vm{i}", c) for i in range(1, c.vms + 1)]
        vms = []
        for i in range(1, c.vms + 1):
            vcpus = []
            for _j in range(c.vcpus):
                procs = [duty(c.busy_ms, c.idle_ms) if p == "duty" else _proc(p) for p in c.programs]
                vcpus.append(_vcpu(c.pin, *procs))
            vms.append(_vm(f"vm{i}", *vcpus))
        return vms
    raise KeyError(name)


def real(program: str | None, exec_path: str | None, args: tuple[str, ...], directory: str | None) -> dict:
    """A real program's process: a workload by name, or the user's ELF file."""
    proc: dict = {"argv": [program or exec_path.rsplit("/", 1)[-1], *args], "dir": directory}  # type: ignore[union-attr]
    if exec_path is not None:
        proc["exec"] = exec_path
    else:
        proc["program"] = program
    return proc


def real_vm(name: str, c: Custom, pins: tuple[int, ...] = ()) -> dict:
    """One VM whose vCPUs (one per real program) each run a real program alone, on the guest kernel; vCPU i is
    pinned to pins[i] if given, else to c.pin."""
    procs = [real(None, c.exec, c.args, c.dir)] if c.exec else [real(p, None, c.args, c.dir) for p in c.programs]
    vcpus = (_vcpu(pins[i] if i < len(pins) else c.pin, p) for i, p in enumerate(procs))
    return {**_vm(name, *vcpus), "mem_mb": c.mem_mb}


NAMES = ("alone", "two-procs", "steal3", "halt", "vcpu2-on-1", "correction", "stacks", "stacks-nofp", "wakeup",
         "throttled", "skew", "halt-poll", "native-vs-guest", "smp2", "custom")
SCENARIOS = (*NAMES, "lbr")  # and the one without VMs (cli/demo.py runs it)

DESCRIPTIONS = {
    "alone": "1 VM, 1 vCPU, the compute program (compute_a 80% / compute_b 20%)",
    "two-procs": "two copies of compute in one VM, one vCPU, time-sliced",
    "steal3": f"three 1-vCPU VMs running compute, all pinned to CPU {SHARED_CPU}",
    "halt": "1 VM busy 10 ms, idle 20 ms (busy 1/3, idle 2/3)",
    "vcpu2-on-1": f"one VM with 2 vCPUs (compute, jacobi) both on CPU {SHARED_CPU}",
    "correction": f"measured VM (compute) + two disturbance VMs, all on CPU {SHARED_CPU}",
    "stacks": "call stacks: chain (main→solve→sweep→kernel_a 60%, main→solve→copy 30%, main→report 10%), "
              "recurse (depth 1..4: 10/20/30/40%), clobber (a broken frame-pointer chain), on one vCPU",
    "stacks-nofp": "call stacks without frame pointers (record --call-graph cfi): compute, jacobi, chain-nofp, "
                   "recurse-nofp on one vCPU",
    "wakeup": f"a VM halting 8 ms in 10 beside a busy VM, both on CPU {SHARED_CPU} (wake-up wait)",
    "throttled": "a busy VM whose vCPU thread has a cpu.max quota of 30 ms per 100 ms (throttling)",
    "skew": f"a 2-vCPU VM (compute, jacobi) and a busy VM, all on CPU {SHARED_CPU} (co-stop)",
    "halt-poll": f"a VM busy {BLINK_BUSY_US} us, halted {BLINK_IDLE_US} us, on CPU {SHARED_CPU} (KVM polls its halts)",
    "native-vs-guest": f"shor (libquantum) on the guest kernel in a VM on CPU {SHARED_CPU}, the same binary natively "
                       "on CPU 0 (002 Tables 3-4)",
    "smp2": f"one VM, 2 vCPUs pinned to CPUs 0 and {SHARED_CPU}, shor and gzip on the guest kernel (002 Tables 10-11)",
    "custom": "any mix: --vms, --vcpus, --program, --pin, --busy-ms/--idle-ms; or a real program: "
              "--exec PATH [--arg A]... [--dir D] [--mem SIZE], --program shor|gzip|xz|sqlite|lua",
    "lbr": "no VM: a host program single-stepped into simulated LBR records (top --lbr=simulate), live in "
           "the block view of its hot function hash_step",
}
