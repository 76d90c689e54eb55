"""`vmprof model`: a VM's resource-usage model under concurrent workloads (paper 003).

build (measure workloads in demo VMs and fit the model), predict (usage at given levels), add
(formula 5: a VM added to a loaded host), evaluate (measure a grid and compare the model with the
conventional direct fit).  Exit codes: 0 success, 2 bad usage, 1 runtime failure with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from vmprof_tui import files
from vmprof_tui.cli.common import Failure, Usage, check_output

HELP = "a VM's resource-usage model under concurrent workloads (paper 003)"

EPILOGS = {
    "model": """examples:
  vmprof model build -o vm.model.json
  vmprof model predict vm.model.json --load cpu=0.5,net-send=0.3
  vmprof model add vm.model.json --running cpu=1 cpu=0.4 --new cpu=0.8
  vmprof model evaluate vm.model.json --grid 7 -o errors.png""",
    "build": """examples:
  vmprof model build -o vm.model.json
  vmprof model build -o m.json --levels 30,15,10 --resource vmm-cpu
  vmprof model build -o m.json --workloads cpu,net-send --levels 10,8 --window 0.5
  vmprof model build -o m.json --cpus 1          # a host of one CPU: the VM saturates it

--levels gives the measurements of each order (all its models together):
30,15,10 is the paper's 55 (10 levels per workload, 5 points per pair,
10 with all three).  Each point runs the workloads in a fresh demo VM
and measures its threads' CPU time from sched events (--accounting).""",
    "predict": """examples:
  vmprof model predict vm.model.json --load cpu=0.5,net-send=0.3
  vmprof model predict vm.model.json --load cpu=1 --load net-recv=0.7 --format json""",
    "add": """examples:
  vmprof model add vm.model.json --running cpu=1 cpu=0.6 --new cpu=0.9,net-send=0.2

Formula (5): a VM that needs no more than its fair share gets it; where
the VMs together need more than the resource's maximum, the new one gets
what the others leave but never less than its fair share.""",
    "evaluate": """examples:
  vmprof model evaluate vm.model.json --grid 5
  vmprof model evaluate vm.model.json --grid 11 -o errors.png --save grid.json

Measures every combination of GRID levels per workload, and as many
points for the direct fit as the model was built from.""",
}


def _model(path: str):  # noqa: ANN202 - the Model type is imported lazily
    from vmprof_tui.estimate.model import ModelError, load

    try:
        return load(Path(path))
    except ModelError as e:
        raise Failure(str(e)) from None


def _loads(texts: list[str], workloads: list[str]) -> np.ndarray:
    from vmprof_tui.estimate.model import ModelError, parse_load

    try:
        return np.array([parse_load(t, workloads) for t in texts])
    except ModelError as e:
        raise Usage(str(e)) from None


def _cpus(text: str | None) -> list[int]:
    """--cpus 0,1 -> [0, 1]; each must be a CPU this process may run on."""
    if not text:
        return []
    try:
        cpus = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        raise Usage(f"--cpus {text}: a comma list of CPU numbers, e.g. 1 or 0,1") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise Usage(f"--cpus {text}: this machine's usable CPUs are {','.join(map(str, sorted(allowed)))}")
    return cpus


def _bench(workloads: list[str], args: argparse.Namespace, cpus: list[int]):  # noqa: ANN202
    from vmprof_tui.estimate.model_measure import Bench

    if not 0.05 <= args.window <= 60:
        raise Usage("--window must be between 0.05 and 60 seconds")
    return Bench(workloads, accounting=args.accounting, window_s=args.window, cpus=cpus)


def _measurer(bench, resource: str, log):  # noqa: ANN001, ANN202
    from vmprof_tui.collect.bpf import CollectError
    from vmprof_tui.collect.session import SessionError
    from vmprof_tui.demo.builds import BuildError
    from vmprof_tui.demo.runner import DemoError

    def measure(levels: np.ndarray) -> dict:
        try:
            p = bench.measure(levels)
        except (DemoError, BuildError, CollectError, SessionError, RuntimeError, OSError) as e:
            raise Failure(f"measuring {_levels(bench.workloads, levels)} failed: {e}") from None
        value = p.value(resource, bench.accounting)
        log(f"{_levels(bench.workloads, levels)}: {value:.3f} cores")
        return {"value": value, "cores": p.cores, "window_s": p.window_s}

    return measure


def _levels(workloads: list[str], levels: np.ndarray) -> str:
    return ",".join(f"{w}={x:.2f}" for w, x in zip(workloads, levels, strict=True) if x > 0) or "idle"


def _start(bench) -> None:  # noqa: ANN001
    try:
        bench.__enter__()
    except (RuntimeError, OSError) as e:  # the collect stage's errors (privileges, BTF, BPF) are RuntimeErrors
        raise Failure(f"{e} (or use --accounting schedstat, which needs no BPF)") from None


def _progress(total: int, quiet: bool):  # noqa: ANN202
    done = [0]

    def log(line: str) -> None:
        done[0] += 1
        if not quiet:
            print(f"[{done[0]}/{total}] {line}", file=sys.stderr, flush=True)

    return log


def cmd_build(args: argparse.Namespace) -> int:
    from vmprof_tui.estimate import model as M
    from vmprof_tui.estimate.model_measure import l_max

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if len(set(workloads)) != len(workloads) or not workloads or any(w not in M.WORKLOADS for w in workloads):
        raise Usage(f"--workloads: a comma list of distinct workloads from {', '.join(M.WORKLOADS)}")
    try:
        counts = [int(c) for c in args.levels.split(",")]
    except ValueError:
        raise Usage("--levels: measurements per order as integers, e.g. 30,15,10") from None
    if not counts or len(counts) > len(workloads) or min(counts) < 0 or counts[0] < 2 * len(workloads):
        raise Usage(f"--levels: 1 to {len(workloads)} counts (one per order, 0 skips one), the first at "
                    f"least {2 * len(workloads)} (two levels per workload)")
    output = Path(args.output)
    check_output(args.output)
    cpus = _cpus(args.cpus)
    bench = _bench(workloads, args, cpus)
    _start(bench)
    try:
        log = _progress(len(M.design(len(workloads), counts)), args.quiet)
        model = M.build(workloads, counts, _measurer(bench, args.resource, log), args.resource,
                        l_max(args.resource, cpus), cpus)
    finally:
        bench.__exit__()
    model.save(output)
    print(f"model of {args.resource} for {', '.join(workloads)}: {len(model.points)} measurements, "
          f"orders 1..{model.max_order}, l_max {model.l_max:g} cores -> {output}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    model = _model(args.model)
    levels = _loads(args.load, model.workloads)
    values = model.predict(levels)
    if args.format == "json":
        print(json.dumps([{"load": t, "resource": model.resource, "usage": float(v)}
                          for t, v in zip(args.load, values, strict=True)], indent=1))
    else:
        for lv, v in zip(levels, values, strict=True):
            print(f"{_levels(model.workloads, lv):<40} {model.resource} {v:.3f} cores")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    model = _model(args.model)
    new = _loads([args.new], model.workloads)
    running = list(_loads(args.running, model.workloads)) if args.running else []
    r = model.add_vm(new, running)
    if args.format == "json":
        print(json.dumps(dict(r, resource=model.resource, l_max=model.l_max, vms=len(running)), indent=1))
    else:
        print(f"{model.resource}: the new VM alone {r['alone']:.3f} cores; {len(running)} VMs running use "
              f"{r['running']:.3f} of {model.l_max:g}; fair share {r['fair_share']:.3f}")
        print(f"the new VM gets {r['usage']:.3f} cores ({r['case']})")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from vmprof_tui.estimate import histogram as model_histogram
    from vmprof_tui.estimate import model as M

    model = _model(args.model)
    if not 2 <= args.grid <= 21:
        raise Usage("--grid: levels per workload, from 2 to 21 (the paper uses 11)")
    for option, path in (("-o", args.output), ("--save", args.save)):
        if path:
            check_output(path, option)  # before the measurements, not after them
    grid = M.evaluation_grid(model.m, args.grid)
    direct = M.direct_points(model.m, len(model.points))
    bench = _bench(model.workloads, args, model.cpus)  # measured where the model was built
    _start(bench)
    log = _progress(len(direct) + len(grid), args.quiet)
    try:
        measure = _measurer(bench, model.resource, log)
        direct_values = np.array([measure(x)["value"] for x in direct])
        grid_values = np.array([measure(x)["value"] for x in grid])
    finally:
        bench.__exit__()
    result = M.compare(model, direct, direct_values, grid, grid_values)
    if args.save:
        files.write_file(Path(args.save), json.dumps({"workloads": model.workloads, "resource": model.resource,
                                               "direct": {"levels": direct.tolist(), "values": direct_values.tolist()},
                                               "grid": {"levels": grid.tolist(), "values": grid_values.tolist()}}))
    errors = result["errors"]
    sys.stdout.write(model_histogram.text(errors, result["summary"]))
    if args.output:
        model_histogram.png(errors, Path(args.output), f"{model.resource}: {len(grid)} points, models from "
                                                       f"{len(model.points)} measurements each")
    return 0


def run(args: argparse.Namespace) -> int:
    raise Usage("say build, predict, add or evaluate (vmprof model --help)")


def _measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accounting", choices=("sched", "schedstat"), default="sched",
                   help="CPU time of the VM's threads from vmprof's sched events (BPF, root) or from "
                        "/proc/.../schedstat (default: %(default)s)")
    p.add_argument("--window", type=float, default=1.0, metavar="S",
                   help="seconds measured per point, after 0.3 s to settle (default: %(default)s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vmprof_tui.estimate.model import WORKLOADS
    from vmprof_tui.estimate.model_measure import RESOURCES

    fmt = argparse.RawDescriptionHelpFormatter
    ps = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")

    b = ps.add_parser("build", help="measure workloads in demo VMs and fit the model",
                      description="Measure synthetic workloads in demo VMs and fit the model order by order.",
                      epilog=EPILOGS["build"], formatter_class=fmt)
    b.add_argument("-o", "--output", required=True, metavar="MODEL.json", help="where the model goes")
    b.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list (default: %(default)s)")
    b.add_argument("--levels", default="30,15,10", metavar="N1,N2,...",
                   help="measurements of order 1, 2, ... (default: %(default)s)")
    b.add_argument("--resource", choices=RESOURCES, default="host-cpu",
                   help="what is modelled: all the VM's threads, its vCPUs, or the VMM's other threads "
                        "(default: %(default)s)")
    b.add_argument("--cpus", default=None, metavar="LIST",
                   help="pin every thread of the profiling VMs to these CPUs (e.g. 1): the host the model is for "
                        "has that many, and l_max of host-cpu and vmm-cpu is their count (default: all CPUs); "
                        "evaluate measures on the same ones")
    _measure_options(b)
    b.set_defaults(func=cmd_build)

    pr = ps.add_parser("predict", help="the model's usage at given workload levels",
                       description="The model's usage at given workload levels (fractions of each maximum).",
                       epilog=EPILOGS["predict"], formatter_class=fmt)
    pr.add_argument("model", metavar="MODEL.json")
    pr.add_argument("--load", action="append", required=True, metavar="W=X,...",
                    help="levels, e.g. cpu=0.5,net-send=0.3 (repeatable)")
    pr.add_argument("--format", choices=("table", "json"), default="table", help="(default: %(default)s)")
    pr.set_defaults(func=cmd_predict)

    a = ps.add_parser("add", help="formula (5): the usage of a VM added to a loaded host",
                      description="The usage of a new VM where other VMs of the same model already run.",
                      epilog=EPILOGS["add"], formatter_class=fmt)
    a.add_argument("model", metavar="MODEL.json")
    a.add_argument("--running", nargs="*", default=[], metavar="W=X,...", help="the levels of each running VM")
    a.add_argument("--new", required=True, metavar="W=X,...", help="the levels of the new VM")
    a.add_argument("--format", choices=("table", "json"), default="table", help="(default: %(default)s)")
    a.set_defaults(func=cmd_add)

    e = ps.add_parser("evaluate", help="measure a grid: error histograms of the model and the direct fit",
                      description="Measure every combination of GRID levels and compare the model with the "
                                  "conventional direct fit from as many measurements.",
                      epilog=EPILOGS["evaluate"], formatter_class=fmt)
    e.add_argument("model", metavar="MODEL.json")
    e.add_argument("--grid", type=int, default=5, metavar="N", help="levels per workload (default: %(default)s)")
    e.add_argument("-o", "--output", default=None, metavar="PNG", help="also draw the histograms into PNG")
    e.add_argument("--save", default=None, metavar="FILE", help="keep the measured points as JSON")
    _measure_options(e)
    e.set_defaults(func=cmd_evaluate)


EXAMPLES = EPILOGS["model"]
