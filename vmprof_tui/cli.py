"""The `vmprof` command line.  Exit codes: 0 success, 1 runtime failure, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vmprof_tui import __version__


class Failure(Exception):
    """A runtime failure with one line for the user (exit status 1)."""


def _fail(message: str) -> int:
    print(f"vmprof: {message}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------
# vmprof demo


def _thread_cpu_ns(pid: int, tid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _print_demo_summary(ready: dict[str, dict], last: dict[tuple[int, int], int], dt: float,
                        elapsed: float) -> None:
    parts = []
    for name, vm in ready.items():
        loads = []
        for v in vm["vcpus"]:
            key = (vm["pid"], v["tid"])
            now = _thread_cpu_ns(*key)
            if now and key in last:
                loads.append(f"vcpu{v['vcpu']} {100 * (now - last[key]) / 1e9 / dt:5.1f}%")
            elif not now:
                loads.append(f"vcpu{v['vcpu']} ended")
            last[key] = now
        parts.append(f"{name}[{vm['pid']}]: " + ", ".join(loads))
    print(f"{elapsed:6.1f}s  " + "  ".join(parts), flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from vmprof_tui.demo import runner, scenarios

    if args.list:
        for name in scenarios.NAMES:
            print(f"{name:12} {scenarios.DESCRIPTIONS[name]}")
        return 0
    custom = scenarios.Custom(vms=args.vms, vcpus=args.vcpus, programs=tuple(args.program or ["compute"]),
                              pin=args.pin, busy_ms=args.busy_ms, idle_ms=args.idle_ms)
    try:
        specs = runner.scenario_specs(args.scenario, custom)
        run = runner.DemoRun(specs, duration_s=args.duration)
        ready = run.start()
    except (runner.DemoError, OSError) as e:
        return _fail(str(e))
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if args.json:
        print(json.dumps({"scenario": args.scenario, "vms": list(ready.values())}), flush=True)
    else:
        print(f"vmprof demo: scenario {args.scenario}: " + ", ".join(
            f"{n} (pid {vm['pid']}, {len(vm['vcpus'])} vCPU)" for n, vm in ready.items())
            + ("; Ctrl-C stops" if not args.duration else ""), flush=True)
    start = last_print = time.monotonic()
    cpu: dict[tuple[int, int], int] = {}
    while run.alive() and not stop:
        time.sleep(0.1)
        now = time.monotonic()
        if not args.json and now - last_print >= 1.0:
            _print_demo_summary(ready, cpu, now - last_print, now - start)
            last_print = now
    truth = run.stop()
    if args.json:
        print(json.dumps({"truth": [truth[n] for n in ready if n in truth], "faults": run.faults}))
    else:
        for fault in run.faults:
            rip = f"{fault['rip']:#x}" if fault.get("rip") is not None else "?"
            print(f"vmprof demo: VM {fault['vm']}: guest process {fault['pid']} ({fault['process']}) "
                  f"faulted at rip {rip}: {fault['what']}; that VM was stopped", file=sys.stderr)
        print(format_truth(truth))
    return 1 if run.faults else 0


def format_truth(truth: dict[str, dict]) -> str:
    def sec(ns: int) -> str:
        return f"{ns / 1e9:.3f}s"

    lines = ["ground truth (time in KVM_RUN measured by the demo VMM):"]
    for name, vm in truth.items():
        lines.append(f"  {name} (pid {vm['pid']}): wall {sec(vm['wall_ns'])}")
        for v in vm["vcpus"]:
            lines.append(f"    vcpu{v['vcpu']} tid {v['tid']} pin {v['pin']}: guest {sec(v['kvm_run_ns'])}, "
                         f"halted {sec(v['halt_ns'])}, on-CPU {sec(v['thread_cpu_ns'])}, "
                         f"run-queue wait {sec(v['run_delay_ns'])}")
        for p in vm["processes"]:
            lines.append(f"    pid {p['pid']} {p['name']} (cr3 {p['cr3']:#x}): in KVM_RUN {sec(p['run_ns'])}, "
                         f"on-CPU {sec(p['cpu_ns'])}, work {p['work']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# vmprof record


def cmd_record(args: argparse.Namespace) -> int:
    from vmprof_tui.backends import BackendError
    from vmprof_tui.collect import CollectError
    from vmprof_tui.recorder import Recorder, RecordError
    from vmprof_tui.recording import RecordingError

    if args.frequency <= 0 or args.frequency > 100_000:
        print("vmprof record: -F must be between 1 and 100000 Hz", file=sys.stderr)
        return 2
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    tty = sys.stderr.isatty()

    def on_progress(p: object) -> None:
        line = (f"recording {args.output}: {p.elapsed_s:6.1f}s  samples {p.samples}  guest {p.guest}  "
                f"lost {p.lost}  VMs {', '.join(p.vms) or 'none'}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        recorder = Recorder(Path(args.output), frequency=args.frequency, vm_names=args.vm, pid=args.pid)
        for note in recorder.backend.notes:
            print(f"vmprof record: note: {note}", file=sys.stderr)
        progress = recorder.run(args.duration, lambda: stop, None if args.quiet else on_progress)
    except (BackendError, CollectError, RecordError, RecordingError) as e:
        return _fail(str(e))
    if tty and not args.quiet:
        print(file=sys.stderr)
    print(progress.summary())
    return 0


# ---------------------------------------------------------------------------
# vmprof doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    from vmprof_tui.doctor import run_checks

    checks = run_checks()
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{'ok ' if c.ok else 'NO '} {c.name:{width}}  {c.detail}")
        if not c.ok and c.fix:
            print(f"    {'':{width}}  fix: {c.fix}")
    essential_ok = all(c.ok for c in checks if c.essential)
    print("vmprof can record on this host." if essential_ok else "vmprof cannot record here yet: see 'fix' above.")
    return 0 if essential_ok else 1


# ---------------------------------------------------------------------------


EXAMPLES = {
    "record": """examples:
  vmprof record -o run.vmprof -d 10          everything on every CPU for 10 s at 1000 Hz
  vmprof record -o run.vmprof -F 10000       10 kHz until Ctrl-C
  vmprof record -o web.vmprof --vm web1 --vm web2 -d 30   samples of two VMs only""",
    "doctor": """examples:
  vmprof doctor        what this host can do, and how to fix what is missing""",
    "demo": """examples:
  vmprof demo                              run the 'alone' scenario until Ctrl-C
  vmprof demo --scenario steal3 -d 10      three VMs on one pCPU for 10 s
  vmprof demo --scenario custom --vms 2 --vcpus 2 --program compute --program jacobi --pin 1
  vmprof demo --scenario halt -d 5 --json  machine-readable description and ground truth
  vmprof demo --list                       the scenarios""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vmprof", description="Profile a whole KVM host (host, VMMs, every guest) from the host alone.")
    parser.add_argument("--version", action="version", version=f"vmprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXAMPLES.get(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    from vmprof_tui.demo import programs, scenarios

    p = add("record", "sample the whole host (host, VMMs, every guest) into a recording file", cmd_record)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="recording file to write")
    p.add_argument("-F", "--frequency", type=int, default=1000, metavar="HZ", help="samples per second per CPU")
    p.add_argument("-d", "--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--vm", action="append", default=[], metavar="NAME",
                   help="keep only samples of this VM (repeatable; scheduler events are always kept)")
    p.add_argument("--pid", type=int, default=None, help="keep only samples of this host process")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress")

    add("doctor", "check what this host can do (privileges, BTF, bcc, KVM backend, PMU, LBR, helper)", cmd_doctor)

    p = add("demo", "run the built-in demo VMs (real KVM guests with known ground truth)", cmd_demo)
    p.add_argument("--scenario", "-s", default="alone", choices=scenarios.NAMES, metavar="NAME",
                   help="one of: " + ", ".join(scenarios.NAMES) + " (default: alone)")
    p.add_argument("--duration", "-d", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--no-tui", action="store_true", help="print a plain-text summary every second")
    p.add_argument("--json", action="store_true", help="print the description and ground truth as JSON")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    g = p.add_argument_group("custom scenario")
    g.add_argument("--vms", type=int, default=1, metavar="N")
    g.add_argument("--vcpus", type=int, default=1, metavar="N", help="vCPUs per VM")
    g.add_argument("--program", action="append", choices=programs.NAMES,
                   help="guest program per vCPU, repeatable (default: compute)")
    g.add_argument("--pin", type=int, default=None, metavar="CPU", help="pin every vCPU to this pCPU")
    g.add_argument("--busy-ms", type=int, default=10, metavar="MS", help="duty program busy time")
    g.add_argument("--idle-ms", type=int, default=20, metavar="MS", help="duty program idle time")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except Failure as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
