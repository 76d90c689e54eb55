"""`vmprof demo`: the built-in demo VMs (real KVM guests with known ground truth), on the live screen."""

from __future__ import annotations

import argparse
import json
import sys
import time

from vmprof_tui.cli.common import Failure, fail, stop_on_signals

HELP = "run the built-in demo VMs (real KVM guests with known ground truth)"
EXAMPLES = """examples:
  vmprof demo                          the 'alone' scenario until Ctrl-C
  vmprof demo --scenario steal3 -d 10  three VMs on one pCPU for 10 s
  vmprof demo --scenario custom --vms 2 --vcpus 2 --program compute \\
              --program jacobi --pin 1
  vmprof demo --scenario halt -d 5 --json   description and ground truth
  vmprof demo --list                   the scenarios"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vmprof_tui.demo import programs, scenarios

    p.add_argument("--scenario", "-s", default="alone", choices=scenarios.NAMES, metavar="NAME",
                   help="one of: " + ", ".join(scenarios.NAMES) + " (default: alone)")
    p.add_argument("--duration", "-d", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--no-tui", action="store_true", help="print a plain-text summary every second instead of "
                   "opening the live screen")
    p.add_argument("-F", "--frequency", "--rate", type=int, default=1000, metavar="HZ",
                   help="live screen sampling rate")
    p.add_argument("--json", action="store_true", help="print the description and ground truth as JSON")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    g = p.add_argument_group("custom scenario")
    g.add_argument("--vms", type=int, default=1, metavar="N", help="number of VMs")
    g.add_argument("--vcpus", type=int, default=1, metavar="N", help="vCPUs per VM")
    g.add_argument("--program", action="append", choices=programs.NAMES, metavar="NAME",
                   help=f"guest program per vCPU, repeatable: {', '.join(programs.NAMES)} (default: compute)")
    g.add_argument("--pin", type=int, default=None, metavar="CPU", help="pin every vCPU to this pCPU")
    g.add_argument("--busy-ms", type=int, default=10, metavar="MS", help="duty program busy time")
    g.add_argument("--idle-ms", type=int, default=20, metavar="MS", help="duty program idle time")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.cli.record import parse_call_graph
    from vmprof_tui.cli.top import run_top
    from vmprof_tui.demo import runner, scenarios
    from vmprof_tui.demo.truth import format_truth, load_line

    if args.list:
        for name in scenarios.NAMES:
            print(f"{name:12} {scenarios.DESCRIPTIONS[name]}")
        return 0
    custom = scenarios.Custom(vms=args.vms, vcpus=args.vcpus, programs=tuple(args.program or ["compute"]),
                              pin=args.pin, busy_ms=args.busy_ms, idle_ms=args.idle_ms)
    try:
        specs = runner.scenario_specs(args.scenario, custom)
        demo = runner.DemoRun(specs, duration_s=args.duration)
        ready = demo.start()
    except (runner.DemoError, OSError) as e:
        return fail(str(e))
    stopped = stop_on_signals()
    if args.json:
        print(json.dumps({"scenario": args.scenario, "vms": list(ready.values())}), flush=True)
    elif not args.no_tui and sys.stdout.isatty():
        try:
            run_top(None, args.frequency, 5.0, 1.0, stopped, stacks=args.scenario in ("stacks", "stacks-nofp"),
                    call_graph=parse_call_graph("cfi") if args.scenario == "stacks-nofp" else None)
        except Failure as e:
            demo.stop()
            return fail(str(e))
        truth = demo.stop()
        print(format_truth(truth))
        return 1 if demo.faults else 0
    else:
        print(f"vmprof demo: scenario {args.scenario}: " + ", ".join(
            f"{n} (pid {vm['pid']}, {len(vm['vcpus'])} vCPU)" for n, vm in ready.items())
            + ("; Ctrl-C stops" if not args.duration else ""), flush=True)
    start = last_print = time.monotonic()
    cpu: dict[tuple[int, int], int] = {}
    while demo.alive() and not stopped():
        time.sleep(0.1)
        now = time.monotonic()
        if not args.json and now - last_print >= 1.0:
            print(load_line(ready, cpu, now - last_print, now - start), flush=True)
            last_print = now
    truth = demo.stop()
    if args.json:
        print(json.dumps({"truth": [truth[n] for n in ready if n in truth], "faults": demo.faults}))
    else:
        for fault in demo.faults:
            rip = f"{fault['rip']:#x}" if fault.get("rip") is not None else "?"
            print(f"vmprof demo: VM {fault['vm']}: guest process {fault['pid']} ({fault['process']}) "
                  f"faulted at rip {rip}: {fault['what']}; that VM was stopped", file=sys.stderr)
        print(format_truth(truth))
    return 1 if demo.faults else 0
