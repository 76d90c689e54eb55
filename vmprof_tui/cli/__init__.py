"""The `vmprof` command line.  Exit codes: 0 success, 1 runtime failure, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vmprof_tui import __version__


class Failure(Exception):
    """A runtime failure with one line for the user (exit status 1)."""


def stop_on_signals() -> Callable[[], bool]:
    """Ctrl-C and SIGTERM end a command cleanly: they only set a flag that the command's loop watches."""
    flag = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: flag.set())
    return flag.is_set


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
    stopped = stop_on_signals()
    if args.json:
        print(json.dumps({"scenario": args.scenario, "vms": list(ready.values())}), flush=True)
    elif not args.no_tui and sys.stdout.isatty():
        try:
            _run_top(None, args.frequency, 5.0, 1.0, stopped)
        except Failure as e:
            run.stop()
            return _fail(str(e))
        truth = run.stop()
        print(format_truth(truth))
        return 1 if run.faults else 0
    else:
        print(f"vmprof demo: scenario {args.scenario}: " + ", ".join(
            f"{n} (pid {vm['pid']}, {len(vm['vcpus'])} vCPU)" for n, vm in ready.items())
            + ("; Ctrl-C stops" if not args.duration else ""), flush=True)
    start = last_print = time.monotonic()
    cpu: dict[tuple[int, int], int] = {}
    while run.alive() and not stopped():
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
# vmprof top


def _run_top(replay: str | None, frequency: int, window_s: float, refresh_s: float,
             should_stop: Callable[[], bool] | None = None) -> None:
    from vmprof_tui.live import LiveSession, ReplaySession
    from vmprof_tui.tui import VmprofTop

    if replay:
        from vmprof_tui.recording import RecordingError

        try:
            session = ReplaySession(Path(replay), window_s)
        except RecordingError as e:
            raise Failure(str(e)) from None
    else:
        from vmprof_tui.backends import BackendError
        from vmprof_tui.collect import CollectError

        try:
            session = LiveSession(frequency, window_s)  # checks privileges, BTF and KVM; BPF loads in the app
        except (BackendError, CollectError) as e:
            raise Failure(str(e)) from None
    try:
        VmprofTop(session, refresh_s, should_stop).run()
    finally:
        session.close()


def cmd_top(args: argparse.Namespace) -> int:
    if not args.replay:
        from vmprof_tui import discover

        if not discover.discover_vms():
            print("vmprof top: no KVM guest runs on this host; showing the host alone "
                  "(`vmprof demo` starts demo VMs)", file=sys.stderr)
    _run_top(args.replay, args.frequency, args.window, args.refresh, stop_on_signals())
    return 0


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
    stopped = stop_on_signals()
    tty = sys.stderr.isatty()

    def on_progress(p: object) -> None:
        line = (f"recording {args.output}: {p.elapsed_s:6.1f}s  samples {p.samples}  guest {p.guest}  "
                f"lost {p.lost}  VMs {', '.join(p.vms) or 'none'}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        lbr = None
        if args.lbr:
            from vmprof_tui.lbr.collect import LbrConfig

            lbr = LbrConfig.named(args.lbr, period=args.lbr_period, pid=args.pid or 0)
        recorder = Recorder(Path(args.output), frequency=args.frequency, vm_names=args.vm, pid=args.pid, lbr=lbr)
        for note in recorder.backend.notes:
            print(f"vmprof record: note: {note}", file=sys.stderr)
        progress = recorder.run(args.duration, stopped, None if args.quiet else on_progress)
    except (BackendError, CollectError, RecordError, RecordingError) as e:
        return _fail(str(e))
    if tty and not args.quiet:
        print(file=sys.stderr)
    print(progress.summary())
    return 0


# ---------------------------------------------------------------------------
# vmprof report / steal


def _parse_bundles(values: list[str]) -> dict[str, Path]:
    out = {}
    for v in values:
        vm, sep, path = v.partition("=")
        if not sep or not vm or not path:
            raise Failure(f"--guest-bundle takes VM=PATH, not {v!r}")
        out[vm] = Path(path)
    return out


def _analysis(args: argparse.Namespace):  # noqa: ANN202
    from vmprof_tui.analysis import Analysis
    from vmprof_tui.recording import RecordingError, load

    try:
        rec = load(Path(args.recording))
    except RecordingError as e:
        raise Failure(str(e)) from None
    time_range = None
    if args.time_range:
        try:
            lo, hi = (float(x) for x in args.time_range.split(":"))
        except ValueError:
            raise Failure(f"--time-range takes FROM:TO in seconds, not {args.time_range!r}") from None
        time_range = (lo, hi)
    an = Analysis(rec, _parse_bundles(args.guest_bundle), time_range=time_range)
    if args.vm and args.vm not in an.vm_names():
        raise Failure(f"no VM named {args.vm} in {args.recording} (VMs: {', '.join(an.vm_names()) or 'none'})")
    return an


def _write(args: argparse.Namespace, data: str | bytes) -> None:
    if getattr(args, "output", None):
        Path(args.output).write_bytes(data if isinstance(data, bytes) else data.encode())
    elif isinstance(data, bytes):
        sys.stdout.buffer.write(data)
    else:
        sys.stdout.write(data)


def cmd_report(args: argparse.Namespace) -> int:
    import importlib

    an = _analysis(args)
    level = args.level or ("guest" if args.vm else "host")
    if level == "guest":
        vms = [args.vm] if args.vm else an.vm_names()
        if not vms:
            raise Failure(f"{args.recording} has no VM: use --level host")
        if len(vms) > 1 and args.format not in ("table", "csv"):
            raise Failure(f"the guest level of {args.format} output covers one VM: add --vm (one of {', '.join(vms)})")
        profiles = [an.guest_profile(vm, args.vcpu) for vm in vms]
    else:
        profiles = [an.host_profile(args.cpu)]
    module = {"json": "jsonfmt", "csv": "csvfmt"}.get(args.format, args.format)
    fmt = importlib.import_module(f"vmprof_tui.export.{module}")
    if args.format in ("pprof", "chrome"):
        _write(args, fmt.render_analysis(an, profiles[0], args))
        return 0
    out = [fmt.render(p, sort=args.sort, limit=args.limit) for p in profiles]
    _write(args, "\n".join(out))
    return 0


def cmd_steal(args: argparse.Namespace) -> int:
    from vmprof_tui.steal import render_table, steal_report

    an = _analysis(args)
    vms = [args.vm] if args.vm else an.vm_names()
    if not vms:
        raise Failure(f"{args.recording} has no VM, so there is no steal to show")
    reports = [steal_report(an, vm) for vm in vms]
    if args.format == "json":
        _write(args, json.dumps(reports if len(reports) > 1 else reports[0], indent=1) + "\n")
    else:
        _write(args, "\n".join(render_table(r, args.limit) for r in reports))
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
  vmprof record -o web.vmprof --vm web1 --vm web2 -d 30   samples of two VMs only
  vmprof record -o lbr.vmprof --lbr --pid 1234 -d 10      + branch records for vmprof blocks (PMU hosts)""",
    "report": """examples:
  vmprof report run.vmprof                          host level: host kernel, processes, one row per VM
  vmprof report run.vmprof --vm web1                guest level of VM web1: processes, functions, steal, idle
  vmprof report run.vmprof --vm web1 --vcpu 0 --format json
  vmprof report run.vmprof --level host --cpu 1     one pCPU only
  vmprof report run.vmprof --vm web1 --format collapsed > web1.folded   (FlameGraph, speedscope)
  vmprof report run.vmprof --vm web1 --guest-bundle web1=/srv/bundles/web1
  vmprof report run.vmprof --vm web1 --format pprof -o web1.pb.gz      (pprof -http :8080 web1.pb.gz)
  vmprof report run.vmprof --format chrome -o run.json                 (open in ui.perfetto.dev)
  vmprof report run.vmprof --time-range 10:20                          seconds 10 to 20 only""",
    "steal": """examples:
  vmprof steal run.vmprof                 every VM: steal type 1/2, idle, who stole, corrected times
  vmprof steal run.vmprof --vm web1 --format json""",
    "doctor": """examples:
  vmprof doctor        what this host can do, and how to fix what is missing""",
    "top": """examples:
  vmprof top                       live: every VM, vCPU, guest process and function, steal and idle
  vmprof top -F 499 --window 30    lower rate, longer window
  vmprof top --replay run.vmprof   play a recording through the same screens""",
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
    p.add_argument("--lbr", nargs="?", const="type4", default=None, metavar="PATTERN",
                   help="also record last branch records with cycles and instructions (hosts with a PMU and LBR; "
                        "PATTERN type1..type4 as in `vmprof blocks --patterns`, default type4)")
    p.add_argument("--lbr-period", type=int, default=1_000_003, metavar="CYCLES",
                   help="cycles between LBR samples (default about 1 ms at 1 GHz)")

    from vmprof_tui.export import FORMATS

    def add_rec(p: argparse.ArgumentParser) -> None:
        p.add_argument("recording", metavar="REC", help="a recording written by vmprof record")
        p.add_argument("--vm", default=None, metavar="NAME", help="one VM")
        p.add_argument("--guest-bundle", action="append", default=[], metavar="VM=PATH",
                       help="guest bundle (folder or tar) naming VM's guest samples (repeatable)")
        p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")
        p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N rows")
        p.add_argument("--time-range", default=None, metavar="FROM:TO",
                       help="only this span, in seconds after the first record (e.g. 2.5:10)")

    p = add("report", "profile tables of a recording, at host or guest level", cmd_report)
    add_rec(p)
    p.add_argument("--level", choices=("host", "guest"), default=None,
                   help="host (default without --vm) or guest (default with --vm)")
    p.add_argument("--vcpu", type=int, default=None, metavar="N", help="guest level: one vCPU")
    p.add_argument("--cpu", type=int, default=None, metavar="N", help="host level: one pCPU")
    p.add_argument("--sort", choices=("samples", "name"), default="samples")
    p.add_argument("--format", choices=FORMATS, default="table")

    p = add("top", "the live screen: what every VM, vCPU, guest process and function is doing now", cmd_top)
    p.add_argument("--replay", default=None, metavar="REC", help="play a recording instead of sampling live")
    p.add_argument("-F", "--frequency", type=int, default=1000, metavar="HZ")
    p.add_argument("--window", type=float, default=5.0, metavar="S", help="seconds of history analysed (default 5)")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S", help="seconds between refreshes")

    p = add("steal", "steal and idle per VM and vCPU, who stole, and corrected execution times", cmd_steal)
    add_rec(p)
    p.add_argument("--format", choices=("table", "json"), default="table")

    from vmprof_tui.lbr import command as lbr_command

    p = add("blocks", lbr_command.HELP, lbr_command.cmd_blocks)
    lbr_command.add_arguments(p)
    from vmprof_tui.lbr.recorded import samples_of_recording

    p.set_defaults(func=lambda a: lbr_command.cmd_blocks(a, load_recording=samples_of_recording))

    from vmprof_tui import guest_fetch

    p = add("guest", "guest bundles: collect one from a libvirt VM through the QEMU guest agent",
            lambda a: _usage(a, "vmprof guest fetch --vm NAME [-o DIR]"))
    guest_fetch.register(p)

    add("doctor", "check what this host can do (privileges, BTF, bcc, KVM backend, PMU, LBR, helper)", cmd_doctor)
    from vmprof_tui.cli import predict as predict_cli; predict_cli.register(sub)  # noqa: E702, I001

    p = add("demo", "run the built-in demo VMs (real KVM guests with known ground truth)", cmd_demo)
    p.add_argument("--scenario", "-s", default="alone", choices=scenarios.NAMES, metavar="NAME",
                   help="one of: " + ", ".join(scenarios.NAMES) + " (default: alone)")
    p.add_argument("--duration", "-d", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--no-tui", action="store_true", help="print a plain-text summary every second instead of "
                   "opening the live screen")
    p.add_argument("-F", "--frequency", type=int, default=1000, metavar="HZ", help="live screen sampling rate")
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


def _usage(_args: argparse.Namespace, usage: str) -> int:
    print(f"usage: {usage}", file=sys.stderr)
    return 2


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
    except BrokenPipeError:  # the reader went away (`vmprof report REC | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
