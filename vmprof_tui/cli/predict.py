"""`vmprof predict`: run-time prediction on a target machine (paper 004).

measure (count a run here), costs (time one of each operation on a target), estimate
(counts × costs, term by term).  Exit codes: 0 success, 2 bad usage, 1 runtime failure
with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vmprof_tui import files

HELP = "predict a program's run time on a target from counts here and costs there"

EPILOGS = {
    "predict": """examples:
  vmprof predict measure -o gzip.counts.json -- gzip -k -f big.file
  vmprof predict costs -o target.costs.json          (run on the target)
  vmprof predict estimate gzip.counts.json --costs here.costs.json \\
      --costs target.costs.json""",
    "measure": """examples:
  vmprof predict measure -o make.json -- make -j1
  vmprof predict measure -o xz.json --repeat 3 -- xz -k -T1 big.file
  vmprof predict measure -o t.json --instructions ptrace -- ./tiny
  vmprof predict measure -o s.json -- sh -c 'sort big.txt > /dev/null'
  vmprof predict measure -o g.json --vm -- gzip -3   (in a demo VM)

Counts the command and every child: syscalls by name (BPF, needs
root), page faults, context switches, processes, wall and CPU time.
The compute term is the PMU's instructions where one exists, exact
single-stepping with --instructions ptrace (slow: small programs), or
the user CPU time.""",
    "costs": """examples:
  vmprof predict costs -o here.json
  vmprof predict costs -o slow.json --name slow-vm --repeat 7
  cgexec -g cpu:half vmprof predict costs -o half.json
  vmprof predict costs -o vm.json --vm               (inside a demo VM)
  vmprof predict costs -o vmn.json --vm --neighbour  (beside a busy VM)

Run it on (or inside) the target: each cost is the wall time of one
operation there, in loops long enough that a CPU quota or a busy
neighbour shows up in it.""",
    "estimate": """examples:
  vmprof predict estimate gzip.json --costs here.json
  vmprof predict estimate gzip.json --costs a.json --costs b.json
  vmprof predict estimate gzip.json --costs a.json --format json
  vmprof predict estimate gzip.json --costs target.json --reference here.json""",
}


def _fail(message: str) -> int:
    print(f"vmprof: {message}", file=sys.stderr)
    return 1


def _usage(message: str) -> int:
    print(f"vmprof: {message}", file=sys.stderr)
    return 2


def cmd_measure(args: argparse.Namespace) -> int:
    from vmprof_tui.estimate.predict import PredictError, write_json
    from vmprof_tui.estimate.predict_measure import measure

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _usage("predict measure: no command: put it after --, e.g. vmprof predict measure -o c.json -- ls")
    if args.max_steps <= 0:
        return _usage("predict measure: --max-steps must be positive")
    if not 1 <= args.repeat <= 100:
        return _usage("predict measure: --repeat must be between 1 and 100")
    if (why := files.check_writable(Path(args.output))) is not None:  # before the run, not after it
        return _usage(f"predict measure: -o {args.output}: {why}")
    if args.vm and (args.instructions not in ("auto", "user-cpu") or args.repeat != 1 or args.no_syscalls
                    or args.memory_probe):
        return _usage("predict measure --vm: --instructions, --repeat, --no-syscalls and --memory-probe are for host "
                      "runs (inside "
                      "the VM the compute term is the vCPU's CPU time, the syscalls the VMM's served calls)")
    if args.dir and not args.vm:
        return _usage("predict measure: --dir goes with --vm (the directory the program's files are confined to)")
    try:
        if args.vm:
            program = _vm_program(command[0], args.dir)
            if isinstance(program, str):
                return _usage(program)
            from vmprof_tui.estimate.predict_vm import measure_in_vm

            counts = measure_in_vm(command, program, Path(args.dir) if args.dir else None)
        else:
            counts = measure(command, instructions=args.instructions, max_steps=args.max_steps,
                             syscalls=not args.no_syscalls, repeat=args.repeat, memory_probe=args.memory_probe)
        write_json(Path(args.output), counts.to_json())
    except PredictError as e:
        return _fail(str(e))
    c = counts
    what = (f"{c.instructions:,} instructions ({c.compute_method})" if c.instructions is not None
            else f"user CPU {c.user_s:.3f} s (no instruction count)")
    print(f"{args.output}: {' '.join(command)}: exit status {c.exit_status}, wall {c.wall_s:.3f} s, {what}, "
          f"{c.syscall_total:,} syscalls, {c.minor_faults:,} minor + {c.major_faults:,} major faults, "
          f"{c.processes_created} processes")
    if c.exit_status != 0:
        print(f"vmprof: predict measure: note: the command exited with status {c.exit_status}; "
              f"the counts of that run are in {args.output}", file=sys.stderr)
    return 0


def _vm_program(name: str, directory: str | None) -> Path | str:
    """The static program `measure --vm` runs: a real workload by name (gzip, xz, sqlite, lua, shor) or a path;
    a string is the one line of bad usage."""
    from vmprof_tui.demo import builds, scenarios, workloads
    from vmprof_tui.demo.loader import BadProgram, check_program
    from vmprof_tui.estimate.predict import PredictError

    if directory is not None and not Path(directory).is_dir():
        return f"predict measure --vm: --dir {directory} is not a directory"
    if "/" not in name and name in scenarios.REAL_PROGRAMS:
        try:
            return workloads.program_path(name)
        except builds.BuildError as e:
            raise PredictError(f"predict measure --vm: {e}") from None
    try:
        check_program(Path(name)).stream.close()
    except BadProgram as e:
        return f"predict measure --vm: {e}"
    except OSError as e:
        return f"predict measure --vm: {name}: {e.strerror} (give a static x86-64 program's path, or one of " \
               f"{', '.join(scenarios.REAL_PROGRAMS)})"
    return Path(name)


def cmd_costs(args: argparse.Namespace) -> int:
    from vmprof_tui.estimate.predict import CostStat, PredictError, write_json
    from vmprof_tui.estimate.predict_costs import measure_costs

    if args.repeat < 1 or args.repeat > 1000:
        return _usage("predict costs: --repeat must be between 1 and 1000")
    if not 0 < args.min_time <= 60:
        return _usage("predict costs: --min-time must be between 0 and 60 seconds")
    directory = Path(args.dir) if args.dir else None
    if directory is not None and not directory.is_dir():
        return _usage(f"predict costs: --dir {args.dir} is not a directory")
    if (why := files.check_writable(Path(args.output))) is not None:  # before the measurements, not after them
        return _usage(f"predict costs: -o {args.output}: {why}")

    def progress(name: str, s: CostStat) -> None:
        if not args.quiet:
            print(f"  {name:15} {s.median * 1e9:12.1f} ns  (min {s.min * 1e9:.1f}, max {s.max * 1e9:.1f}, "
                  f"{s.repeat} repetitions)", file=sys.stderr, flush=True)

    if args.vm and args.repeat > 64:
        return _usage("predict costs --vm: --repeat must be between 1 and 64 inside a VM")
    if args.without_wait and args.vm:
        return _usage("predict costs: --without-wait is for a host (a VM's costs are always without its steal)")
    if args.neighbour and not args.vm:
        return _usage("predict costs: --neighbour goes with --vm (a neighbour VM on the target VM's pCPU)")
    if args.probe and (args.vm or args.without_wait):
        return _usage("predict costs: --probe measures this host's loops and wait share alone (no --vm; it is "
                      "always without the wait)")
    try:
        if args.probe:
            from vmprof_tui.estimate.predict_costs import measure_probe

            costs = measure_probe(min(args.repeat, 3), min(args.min_time, 0.1))
        elif args.vm:
            from vmprof_tui.estimate.predict_vm import measure_costs_vm

            costs = measure_costs_vm(args.name, args.repeat, args.min_time, args.neighbour, progress)
        else:
            costs = measure_costs(args.name, directory, args.repeat, args.min_time, progress, args.without_wait)
        write_json(Path(args.output), costs.to_json())
    except PredictError as e:
        return _fail(str(e))
    quota, steal = costs.target.get("cpu_quota"), costs.target.get("steal_share")
    print(f"{args.output}: costs of {costs.name}" + (f" (cgroup CPU quota {quota:.2f})" if quota else "")
          + ("" if steal is None else f" (steal {100 * steal:.1f}% of its time)" if args.vm else
             f" (other work took {100 * steal:.1f}% of its CPU: a term of its own)"
             if args.without_wait or args.probe else
             f" (other work took {100 * steal:.1f}% of its CPU during the compute loop)"))
    for name, why in (costs.target.get("unsupported") or {}).items():
        print(f"vmprof: predict costs: note: no {name} on this target: {why}", file=sys.stderr)
    for n in costs.notes:
        print(f"vmprof: predict costs: note: {n}", file=sys.stderr)
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from vmprof_tui.estimate.predict import PredictError, estimate, load_costs, load_counts, with_probe
    from vmprof_tui.estimate.predict_render import render

    if not args.costs:
        return _usage("predict estimate: give at least one --costs FILE (measured with vmprof predict costs)")
    if args.steal is not None and not 0 <= args.steal < 1:
        return _usage(f"predict estimate: --steal {args.steal} is not a share between 0 and 1 (e.g. 0.5)")
    try:
        counts = load_counts(Path(args.counts))
        reference = load_costs(Path(args.reference)) if args.reference else None
        probe = load_costs(Path(args.probe)) if args.probe else None
        if probe is not None and probe.target.get("probe") is not True:
            return _usage(f"predict estimate: --probe {args.probe} is a full COSTS file, not one from costs --probe")
        targets = [load_costs(Path(p)) for p in args.costs]
        estimates = [estimate(counts, with_probe(t, probe) if probe else t, args.compute, reference, args.steal)
                     for t in targets]
    except PredictError as e:
        return _fail(str(e))
    if args.format == "json":
        print(json.dumps({"command": counts.command, "reference_wall_s": counts.wall_s,
                          "targets": [e.to_json() for e in estimates]}, indent=1))
    else:
        sys.stdout.write(render(counts, estimates, args.top))
    return 0


def run(args: argparse.Namespace) -> int:
    return _usage("predict: say measure, costs or estimate (vmprof predict --help)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The three subcommands of `vmprof predict`."""
    fmt = argparse.RawDescriptionHelpFormatter
    ps = p.add_subparsers(dest="predict_command", metavar="SUBCOMMAND")

    m = ps.add_parser("measure", help="run a command once here and count what it does",
                      description="Run COMMAND (and its children) once and count what it does.",
                      epilog=EPILOGS["measure"], formatter_class=fmt)
    m.add_argument("-o", "--output", required=True, metavar="COUNTS.json", help="where the counts go")
    m.add_argument("--instructions", choices=("auto", "pmu", "ptrace", "user-cpu"), default="auto",
                   help="compute term: auto = the PMU where present, else user CPU time (default: %(default)s)")
    m.add_argument("--max-steps", type=int, default=5_000_000, metavar="N",
                   help="--instructions ptrace gives up after N instructions (default: %(default)s)")
    m.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run N times and keep the run with the median user CPU time; the command must do the "
                        "same work each time (default: %(default)s)")
    m.add_argument("--memory-probe", action="store_true",
                   help="also run the command alone and beside a cache-evicting neighbour on its CPU, to find the "
                        "share of its CPU time that behaves like the memory loop (docs/predict.md)")
    m.add_argument("--no-syscalls", action="store_true",
                   help="do not count system calls (no BPF, no root needed; the estimate loses those terms)")
    m.add_argument("--vm", action="store_true",
                   help="count the program inside a demo VM (a static x86-64 program, or gzip, xz, sqlite, lua, "
                        "shor: the demo's real workloads): syscalls from the VMM's served calls, compute from the "
                        "vCPU's CPU time")
    m.add_argument("--dir", default=None, metavar="HOSTDIR",
                   help="with --vm: the directory the program's files are confined to (default: a fresh one)")
    m.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS]", help="the command to run")
    m.set_defaults(func=cmd_measure)

    c = ps.add_parser("costs", help="time one of each operation on this (target) machine",
                      description="Time one of each operation here: the costs a target publishes.",
                      epilog=EPILOGS["costs"], formatter_class=fmt)
    c.add_argument("-o", "--output", required=True, metavar="COSTS.json", help="where the costs go")
    c.add_argument("--name", default=None, help="the target's name in estimates (default: the host name)")
    c.add_argument("--repeat", type=int, default=5, metavar="N", help="repetitions per cost (default: %(default)s)")
    c.add_argument("--min-time", type=float, default=0.3, metavar="S",
                   help="seconds per repetition (default: %(default)s)")
    c.add_argument("--dir", default=None, metavar="DIR",
                   help="scratch directory on a disk file system, for file and major-fault costs "
                        "(default: /var/tmp)")
    c.add_argument("--vm", action="store_true",
                   help="measure inside a demo VM: the loops run as a static program on the demo guest kernel, "
                        "pinned to the demo's shared pCPU (root, KVM)")
    c.add_argument("--neighbour", action="store_true",
                   help="with --vm: a busy neighbour VM shares the target VM's pCPU (its steal is in the costs and "
                        "recorded as the target's steal share)")
    c.add_argument("--without-wait", action="store_true",
                   help="time each cost without this thread's wait for its CPU (other work's share), which becomes "
                        "the costs' steal share, a term of its own in an estimate")
    c.add_argument("--probe", action="store_true",
                   help="only the compute and memory loops and the wait share, now (under a second): for "
                        "predict estimate --probe just before a run")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=cmd_costs)

    e = ps.add_parser("estimate", help="predicted run time per target, term by term",
                      description="Predicted run time of the counted program on each target, with the "
                                  "breakdown by term.",
                      epilog=EPILOGS["estimate"], formatter_class=fmt)
    e.add_argument("counts", metavar="COUNTS.json", help="written by vmprof predict measure")
    e.add_argument("--costs", action="append", default=[], metavar="COSTS.json",
                   help="written by vmprof predict costs on a target (repeatable)")
    e.add_argument("--compute", choices=("auto", "cpu-time", "instructions"), default="auto",
                   help="compute term: the counts' own method, CPU time × the targets' compute-loop "
                        "ratio, or instructions × time per instruction (default: %(default)s)")
    e.add_argument("--reference", default=None, metavar="COSTS.json",
                   help="costs measured on the machine the counts come from: the CPU-time compute term is then "
                        "the run's whole CPU time minus its counted operations at these costs (without it: the "
                        "user CPU time, which the kernel splits from system time by tick samples)")
    e.add_argument("--probe", default=None, metavar="PROBE.json",
                   help="from predict costs --probe just before the run: its loops and wait share replace the "
                        "costs' (which must be from costs --without-wait)")
    e.add_argument("--steal", type=float, default=None, metavar="SHARE",
                   help="the target's steal share now (0-1, e.g. from vmprof top), if it differs from the one "
                        "measured with its costs (a VM target's costs record theirs)")
    e.add_argument("--format", choices=("table", "json"), default="table", help="(default: %(default)s)")
    e.add_argument("--top", type=int, default=12, metavar="N", help="syscall rows shown (default: %(default)s)")
    e.set_defaults(func=cmd_estimate)


EXAMPLES = EPILOGS["predict"]
