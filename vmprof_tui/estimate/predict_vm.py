"""A demo VM as a prediction target (`vmprof predict costs --vm`, `predict measure --vm`).

The cost loops run as a real static program (demo/workloads/costs.c) inside a demo VM on the demo guest
kernel, so every system call in them is what a system call costs there (a VM exit, the VMM serving it, the
return).  The guest kernel maps memory eagerly and has no page cache: what a native minor fault becomes there is a
fresh page of guest memory mapped by mmap and first written (the host backs it and KVM maps it at that
touch), and a major fault a file page read in at mmap.  It has no fork, exec or second process, so
those costs are listed as unsupported with the reason.  A program counted inside a VM is counted from the
VMM's served-call truth (calls and bytes by name) and the vCPU thread's CPU time in KVM_RUN.

The target's steal share is its vCPU thread's run-queue wait over the program's life (schedstat, read by the
VMM), measured while the costs are: a target VM beside a neighbour on its pCPU gives its steal.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from vmprof_tui.estimate import predict_costs
from vmprof_tui.estimate.predict import (
    COMPUTE_USER_CPU,
    COST_NAMES,
    OPTIONAL_COSTS,
    Costs,
    CostStat,
    Counts,
    PredictError,
    SyscallCount,
)
from vmprof_tui.estimate.syscall_names import syscall_names

NEIGHBOUR = "neighbour"  # the busy VM beside the target on its pCPU (the demo's compute program)
MAX_OUTPUT_LINES = 64


def costs_program() -> Path:
    """demo/workloads/costs.c built as a static program (cached like the workloads)."""
    from vmprof_tui.demo import builds, workloads

    src = Path(__file__).resolve().parent.parent / "demo" / "workloads"
    try:
        return builds.compiled(src / "costs.c", workloads.CFLAGS, "costs", "the cost program",
                                 headers=(src / "common.h",))
    except builds.BuildError as e:
        raise PredictError(f"predict costs --vm: {e}") from None


def run_in_vm(path: Path, argv: list[str], directory: Path, neighbour: bool, what: str,
              timeout_s: float = 600.0) -> tuple[dict, str]:
    """Run the static program `path` with `argv` in a demo VM pinned to the demo's shared pCPU (beside a
    neighbour VM running the compute program if asked) until it ends.  Returns its process truth and what it
    wrote to stdout; PredictError with one line if it cannot start, faults or exits non-zero."""
    from vmprof_tui.demo import builds, runner, scenarios

    custom = scenarios.Custom(exec=str(path), args=tuple(argv[1:]), dir=str(directory), pin=scenarios.SHARED_CPU)
    specs = [scenarios.real_vm("target", custom)]
    specs[0]["vcpus"][0]["processes"][0]["argv"][0] = argv[0]
    if neighbour:
        specs.append(scenarios.build("alone")[0] | {"name": NEIGHBOUR})
    try:
        demo = runner.DemoRun(specs)
        demo.start()
    except (runner.DemoError, OSError, builds.BuildError) as e:
        raise PredictError(f"{what}: cannot start the demo VM: {e}") from None
    try:
        demo.procs[0].wait(timeout_s)  # the target's VMM exits when its program has ended
    except subprocess.TimeoutExpired:
        pass
    finally:
        truth = demo.stop()
    out = "".join(e["text"] for e in demo.output if e.get("vm") == "target" and e["event"] == "output" and e["fd"] == 1)
    err = [e["text"] for e in demo.output if e.get("vm") == "target" and e["event"] == "output" and e["fd"] == 2]
    faults = [f for f in demo.faults if f.get("vm") == "target"]
    if faults:
        raise PredictError(f"{what}: {argv[0]} faulted inside the VM: {faults[0]['what']}")
    vm = truth.get("target")
    if vm is None or not vm.get("processes"):
        raise PredictError(f"{what}: the demo VM ended without its ground truth (timeout {timeout_s:.0f} s?)")
    proc = vm["processes"][0]
    if proc.get("exit_code") != 0 or not proc.get("wall_ns"):
        why = "".join(err).strip().splitlines()
        raise PredictError(f"{what}: {argv[0]} failed inside the VM (exit status {proc.get('exit_code')})"
                           + (f": {why[-1][:200]}" if why else ""))
    return proc, out


def _host_loop(cpu: int, repeat: int, memory: bool = False) -> list[float]:
    """The compute (or memory) loop timed on the host in CPU time, pinned to the target VM's pCPU (the reference,
    interleaved with the VM's run)."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpu, (os.cpu_count() or 1) - 1)})
    try:
        stat = (predict_costs.time_memory_loop(repeat=repeat, min_time=0.05, cpu_time=True) if memory else
                predict_costs.time_compute_loop(repeat=repeat, min_time=0.05, cpu_time=True))
    finally:
        os.sched_setaffinity(0, old)
    return [stat.median, stat.min, stat.max]


def parse_costs(text: str) -> tuple[dict[str, CostStat], dict[str, CostStat], dict[str, str]]:
    """The cost program's lines: 'cost NAME v...' (wall), 'cpu NAME v...' (the vCPU thread's CPU time) and
    'unsupported NAME why'; PredictError for anything else."""
    stats: dict[str, dict[str, CostStat]] = {"cost": {}, "cpu": {}}
    unsupported: dict[str, str] = {}
    for line in text.splitlines()[:MAX_OUTPUT_LINES]:
        kind, _, rest = line.partition(" ")
        name, _, tail = rest.partition(" ")
        if name not in COST_NAMES and name not in OPTIONAL_COSTS:
            raise PredictError(f"predict costs --vm: unexpected line from the cost program: {line[:100]!r}")
        if kind == "unsupported":
            unsupported[name] = tail[:200]
            continue
        try:
            values = [float(v) for v in tail.split()]
        except ValueError:
            values = []
        if kind not in stats or not values or min(values) <= 0:
            raise PredictError(f"predict costs --vm: unexpected line from the cost program: {line[:100]!r}")
        stats[kind][name] = CostStat(median=statistics.median(values), min=min(values), max=max(values),
                                     repeat=len(values))
    return stats["cost"], stats["cpu"], unsupported


def measure_costs_vm(name: str | None, repeat: int, min_time: float, neighbour: bool,
                     progress: Callable[[str, CostStat], None] | None = None) -> Costs:
    """The costs of a demo VM (beside a neighbour VM on its pCPU if asked), with the host's compute loop
    timed on the same pCPU before and after it (the reference, interleaved) and the VM's steal share."""
    from vmprof_tui.demo import scenarios
    from vmprof_tui.estimate.predict_measure import machine_description

    program = costs_program()
    host, host_mem = _host_loop(scenarios.SHARED_CPU, repeat), _host_loop(scenarios.SHARED_CPU, repeat, True)
    with tempfile.TemporaryDirectory(prefix="vmprof-vm-costs-", dir="/var/tmp") as d:
        proc, out = run_in_vm(program, ["costs", str(repeat), str(int(min_time * 1000))], Path(d), neighbour,
                              "predict costs --vm")
    host += _host_loop(scenarios.SHARED_CPU, repeat)
    host_mem += _host_loop(scenarios.SHARED_CPU, repeat, True)
    wall, costs, unsupported = parse_costs(out)
    missing = [n for n in COST_NAMES if n not in costs and n not in unsupported]
    if missing:
        raise PredictError(f"predict costs --vm: the cost program gave no {', '.join(missing)}")
    for key, stat in costs.items():
        if progress:
            progress(key, stat)
    steal = proc["run_delay_ns"] / proc["wall_ns"] if proc.get("run_delay_ns") is not None else 0.0
    if "write_sync" in wall:  # it waits for the disk, which is neither CPU time nor steal: wall less the steal
        w = wall["write_sync"]
        costs["write_sync"] = CostStat(w.median * (1 - steal), w.min * (1 - steal), w.max * (1 - steal), w.repeat)
    loop, ref = costs["compute_loop"], statistics.median(host[0::3])
    target = {"name": name or ("demo-vm+neighbour" if neighbour else "demo-vm"), **machine_description(),
              "vm": {"pcpu": scenarios.SHARED_CPU, "neighbour": neighbour, "guest_kernel": "vmprof demo"},
              "unsupported": unsupported, "steal_share": steal, "costs_exclude_steal": True,
              "wall_median_s": {k: v.median for k, v in wall.items()},
              "reference_compute_loop_s": ref,
              "reference_compute_loop_spread": [min(host), max(host)],
              "compute_ratio_spread": [loop.min / ref, loop.max / ref],
              "reference_memory_loop_s": statistics.median(host_mem[0::3]),
              "reference_memory_loop_spread": [min(host_mem), max(host_mem)],
              "repeat": repeat, "min_time_s": min_time}
    notes = [f"measured inside a demo VM on the demo guest kernel (pCPU {scenarios.SHARED_CPU}"
             + (", beside a busy neighbour VM" if neighbour else ", alone")
             + f"): steal {100 * steal:.1f}% of its time; the costs are the vCPU thread's CPU time (without "
             "steal), an estimate divides their sum by 1 - the steal share",
             "minor_fault is a fresh page of guest memory mapped by mmap (the guest kernel maps eagerly) and first "
             "written (the host backs it then); major_fault a file page mapped (read in at mmap: no page cache)"]
    return Costs(target=target, costs=costs, notes=notes)


def measure_in_vm(argv: list[str], path: Path, directory: Path | None) -> Counts:
    """Count one run of the static program `path` inside a demo VM alone: syscalls by name (calls and bytes)
    from the VMM's served-call truth, compute as the vCPU thread's CPU time in KVM_RUN (the guest's own
    work: a real program's kernel part is the VMM's, outside it), the guest's compute loop as its yardstick."""
    from vmprof_tui.estimate.predict_measure import machine_description

    with tempfile.TemporaryDirectory(prefix="vmprof-vm-measure-", dir="/var/tmp") as d:
        _, loop_out = run_in_vm(costs_program(), ["costs", "5", "50", "compute_loop"], Path(d), False,
                                        "predict measure --vm")
        proc, _ = run_in_vm(path, argv, directory or Path(d), False, "predict measure --vm")
    loop = parse_costs(loop_out)[1]["compute_loop"]  # in CPU time, as the counted CPU time is
    by_name = {v: k for k, v in syscall_names().items()}
    syscalls = {n: SyscallCount(nr=by_name.get(n, 0), calls=int(c["count"]), bytes=int(c.get("bytes", 0)))
                for n, c in proc.get("syscalls", {}).items()}
    wall = proc["wall_ns"] / 1e9
    return Counts(command=list(argv), exit_status=0, wall_s=wall, user_s=proc["cpu_ns"] / 1e9, system_s=0.0,
                  compute_method=COMPUTE_USER_CPU, instructions=None, syscalls=syscalls, minor_faults=0,
                  major_faults=0, voluntary_switches=0, involuntary_switches=0, processes_created=0,
                  threads_created=0,
                  reference={**machine_description(), "vm": {"steal_ns": proc.get("run_delay_ns")},
                             "compute_loop_s": loop.median, "compute_loop_min_s": loop.min,
                             "compute_loop_max_s": loop.max,
                             "runs": [{"wall_s": wall, "user_s": proc["cpu_ns"] / 1e9, "system_s": 0.0}]},
                  notes=["counted inside a demo VM: syscalls from the VMM's served calls, compute = the vCPU "
                         "thread's CPU time in KVM_RUN; the guest kernel maps eagerly (no page faults)",
                         f"steal while counted: {(proc.get('run_delay_ns') or 0) / 1e9:.3f} s"])
