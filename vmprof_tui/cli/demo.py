"""`vmprof demo`: the built-in demo VMs (real KVM guests with known ground truth), on the live screen."""

from __future__ import annotations

import argparse
import json
import sys
import time

from vmprof_tui.cli.common import Failure, fail, frequency, seconds, stop_on_signals

HELP = "run the built-in demo VMs (real KVM guests with known ground truth)"
EXAMPLES = """examples:
  vmprof demo                          the 'alone' scenario until Ctrl-C
  vmprof demo --scenario steal3 -d 10  three VMs on one pCPU for 10 s
  vmprof demo --scenario custom --vms 2 --vcpus 2 --program compute \\
              --program jacobi --pin 1
  vmprof demo --scenario halt -d 5 --json   description and ground truth
  vmprof demo --scenario custom --exec /bin/busybox --arg sha256sum \\
              --arg /f --dir DIR       a real static program on the guest kernel
  vmprof demo --scenario custom --program gzip -d 10   a real workload
  vmprof demo --scenario lbr           LBR block times (simulated, any host)
  vmprof demo --list                   the scenarios"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vmprof_tui.demo import builds, scenarios

    p.add_argument("--scenario", "-s", default="alone", choices=scenarios.SCENARIOS, metavar="NAME",
                   help="one of: " + ", ".join(scenarios.SCENARIOS) + " (default: alone)")
    p.add_argument("--duration", "-d", type=seconds, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--no-tui", action="store_true", help="print a plain-text summary every second instead of "
                   "opening the live screen")
    p.add_argument("-F", "--frequency", "--rate", type=frequency, default=1000, metavar="HZ",
                   help="live screen sampling rate")
    p.add_argument("--json", action="store_true", help="print the description and ground truth as JSON")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    g = p.add_argument_group("custom scenario")
    g.add_argument("--vms", type=int, default=1, metavar="N", help="number of VMs")
    g.add_argument("--vcpus", type=int, default=1, metavar="N", help="vCPUs per VM")
    names = (*builds.NAMES, *scenarios.REAL_PROGRAMS)
    g.add_argument("--program", action="append", choices=names, metavar="NAME",
                   help=f"guest program per vCPU, repeatable: {', '.join(names)} (default: compute); "
                   f"{', '.join(scenarios.REAL_PROGRAMS)} are real programs on the guest kernel, one vCPU each")
    g.add_argument("--pin", type=int, default=None, metavar="CPU", help="pin every vCPU to this pCPU")
    g.add_argument("--busy-ms", type=int, default=10, metavar="MS", help="duty program busy time")
    g.add_argument("--idle-ms", type=int, default=20, metavar="MS", help="duty program idle time")
    g.add_argument("--exec", metavar="PATH", help="run this static x86-64 program on the demo guest kernel")
    g.add_argument("--arg", action="append", default=[], metavar="ARG", help="an argument of the real program "
                   "(repeatable)")
    g.add_argument("--dir", metavar="HOSTDIR", help="the host directory the real program's files are confined to "
                   "(its /; default: none)")
    g.add_argument("--mem", default=f"{scenarios.REAL_MEM_MB}M", metavar="SIZE",
                   help=f"guest memory of a real program's VM, e.g. 512M, 2G (default {scenarios.REAL_MEM_MB}M)")


def _mem_mb(text: str) -> int | None:
    """512M, 2G or a number of MiB; None if not a size."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"M": 1, "G": 1024}.get(t[-1:], 0)
    digits = t[:-1] if scale else t
    if not digits.isdigit():
        return None
    return int(digits) * (scale or 1)


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.cli.record import parse_call_graph
    from vmprof_tui.cli.top import run_top
    from vmprof_tui.demo import builds, runner, scenarios
    from vmprof_tui.demo.truth import format_truth, load_line

    if args.list:
        for name in scenarios.SCENARIOS:
            print(f"{name:12} {scenarios.DESCRIPTIONS[name]}")
        return 0
    if args.scenario == "lbr":
        return run_lbr(args)
    mem_mb = _mem_mb(args.mem)
    if mem_mb is None or not 16 <= mem_mb <= 65536:
        return _usage(f"--mem {args.mem!r} is not a guest memory size between 16M and 64G (e.g. 512M, 2G)")
    if (args.exec or args.arg or args.dir) and args.scenario != "custom":
        return _usage("--exec, --arg and --dir belong to --scenario custom")
    custom = scenarios.Custom(vms=args.vms, vcpus=args.vcpus, programs=tuple(args.program or ["compute"]),
                              pin=args.pin, busy_ms=args.busy_ms, idle_ms=args.idle_ms, exec=args.exec,
                              args=tuple(args.arg), dir=args.dir, mem_mb=mem_mb)
    try:
        specs = runner.scenario_specs(args.scenario, custom)
        demo = runner.DemoRun(specs, duration_s=args.duration)
        ready = demo.start()
    except runner.BadRealProgram as e:
        return _usage(str(e))
    except (runner.DemoError, OSError, builds.BuildError) as e:
        return fail(str(e))
    stopped = stop_on_signals()
    if args.json:
        print(json.dumps({"scenario": args.scenario, "vms": list(ready.values())}), flush=True)
    elif not args.no_tui and sys.stdout.isatty():
        try:
            run_top(None, args.frequency, 5.0, 1.0, stopped, stacks=args.scenario in ("stacks", "stacks-nofp"),
                    call_graph=parse_call_graph("cfi" if args.scenario == "stacks-nofp" else "fp"))
        except Failure as e:
            demo.stop()
            return fail(str(e))
        truth = demo.stop()
        _show_output(demo.output, 0, False)  # what real programs wrote while the screen was up
        print(format_truth(truth))
        return 1 if demo.faults else 0
    else:
        print(f"vmprof demo: scenario {args.scenario}: " + ", ".join(
            f"{n} (pid {vm['pid']}, {len(vm['vcpus'])} vCPU)" for n, vm in ready.items())
            + ("; Ctrl-C stops" if not args.duration else ""), flush=True)
    start = last_print = time.monotonic()
    cpu: dict[tuple[int, int], int] = {}
    shown = 0
    while demo.alive() and not stopped():
        time.sleep(0.1)
        shown = _show_output(demo.output, shown, args.json)
        now = time.monotonic()
        if not args.json and now - last_print >= 1.0:
            print(load_line(ready, cpu, now - last_print, now - start), flush=True)
            last_print = now
    truth = demo.stop()
    _show_output(demo.output, shown, args.json)
    if args.json:
        print(json.dumps({"truth": [truth[n] for n in ready if n in truth], "faults": demo.faults,
                          "output": demo.output}))
    else:
        for fault in demo.faults:
            rip = f"{fault['rip']:#x}" if fault.get("rip") is not None else "?"
            ended = "that process was ended" if fault.get("ended") == "process" else "that VM was stopped"
            print(f"vmprof demo: VM {fault['vm']}: guest process {fault['pid']} ({fault['process']}) "
                  f"faulted at rip {rip}: {fault['what']}; {ended}", file=sys.stderr)
        print(format_truth(truth))
    return 1 if demo.faults else 0


def _usage(message: str) -> int:
    print(f"vmprof demo: {message}", file=sys.stderr)
    return 2


def _show_output(events: list[dict], shown: int, as_json: bool) -> int:
    """Print what real programs wrote (stdout to stdout, stderr to stderr) and the notices about their system
    calls, from `shown` on; returns how many events are printed.  With --json they go into the final object."""
    if as_json:
        return len(events)
    for event in events[shown:]:
        if event["event"] == "output":
            (sys.stdout if event["fd"] == 1 else sys.stderr).write(event["text"])
        else:
            print(f"vmprof demo: VM {event['vm']}: guest process {event['pid']} ({event['process']}): "
                  f"{event['what']}", file=sys.stderr)
    sys.stdout.flush()
    return len(events)


LBR_RATE = 100_000  # simulated samples per second: one every 10,000 cost-model cycles
LBR_FUNCTION = "hash_step"
LBR_LIVE_ROUNDS = 40_000  # the live screen's program: some 3.7M instructions, a minute or two single-stepped
LBR_LIVE_MAX_INSTRUCTIONS = 5_000_000


def run_lbr(args: argparse.Namespace) -> int:
    """`vmprof demo --scenario lbr`: programs/lbr_demo.c single-stepped (lbr/simulate.py) into LBR records.  On a
    terminal, live: `vmprof top --lbr=simulate --blocks hash_step -- PROGRAM`, the block view of hash_step filling
    in as the program runs (single-stepping gives a few samples a second: a longer build of the program keeps the
    view moving).  Otherwise (--json, --no-tui, no terminal): a shorter build recorded, and its blocks printed."""
    from vmprof_tui.cli.top import live_lbr, run_top
    from vmprof_tui.demo.builds import BuildError, lbr_demo_path
    from vmprof_tui.lbr import simulate as lbr_simulate
    from vmprof_tui.lbr.patterns import get

    live = not (args.json or args.no_tui or not sys.stdout.isatty())
    try:
        program = lbr_demo_path(LBR_LIVE_ROUNDS) if live else lbr_demo_path()
    except BuildError as e:
        return fail(str(e))
    if live:
        try:
            run_top(None, args.frequency, 5.0, 1.0, stop_on_signals(), blocks=LBR_FUNCTION,
                    lbr_live=live_lbr("simulate", None, 16, LBR_LIVE_MAX_INSTRUCTIONS, [str(program)], None))
        except Failure as e:
            return fail(str(e))
        return 0
    try:
        run = lbr_simulate.simulate([str(program)], get("type4").with_options(info=True), LBR_RATE)
    except lbr_simulate.SimulateError as e:
        return fail(str(e))
    if args.json:
        print(json.dumps({"scenario": "lbr", "program": str(program), "instructions": run.instructions,
                          "samples": len(run.records), "period_cycles": run.period, "function": LBR_FUNCTION}))
        return 0
    import tempfile
    from pathlib import Path

    from vmprof_tui.lbr import format_table as blocks_table
    from vmprof_tui.lbr.source import from_recording
    from vmprof_tui.record.recording import load

    with tempfile.TemporaryDirectory(prefix="vmprof-lbr-demo-") as tmp:
        rec = Path(tmp) / "lbr_demo.vmprof"
        lbr_simulate.write(rec, run, LBR_RATE)
        source = from_recording(load(rec))
    print(run.summary())
    print(blocks_table.render(source.report(None, None), LBR_FUNCTION, 0))
    return 0
