"""`vmprof record`: sample the whole host into a recording file."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.cli.common import DEFAULT_RECORDING, Failure, Usage, fail, frequency, seconds, stop_on_signals

HELP = "sample the whole host (host, VMMs, every guest) into a recording file"
EXAMPLES = """examples:
  vmprof record -d 10       every CPU, 10 s at 1000 Hz, into ./vmprof.data
  vmprof record -o run.vmprof -F 10000          10 kHz until Ctrl-C
  vmprof record -o run.vmprof -- make -j2       while a command runs
  vmprof record -o web.vmprof --vm web1 -d 30   samples of one VM only
  vmprof record -o lbr.vmprof --lbr -p 1234     + branch records (PMU hosts)
  vmprof record -g -d 5 -o stacks.vmprof        + call stacks, host and guest
  vmprof record --call-graph fp -d 5            stacks by frame pointers only
  vmprof record -e cpu-clock -d 5               perf's events: cpu-clock, cycles
  vmprof record -o sim.vmprof --lbr=simulate -F 100000 -- ./prog
                 branch records on any machine: prog single-stepped (slow)

the recording is created 0600 (as perf.data); --group-readable makes it 0640.
exit status: COMMAND's, as perf's; else 0, 1 on failure, 2 on bad usage."""

EVENTS = {"cpu-clock": "cpu-clock", "cycles": "cycles", "cpu-cycles": "cycles"}  # perf's names -> the collector's
CALL_GRAPH_MODES = ("fp", "dwarf", "cfi", "lbr")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help=f"recording file to write (default: ./{DEFAULT_RECORDING}; an old one becomes .old)")
    p.add_argument("-F", "--frequency", "--rate", type=frequency, default=1000, metavar="HZ",
                   help="samples per second per CPU, to 100000")
    p.add_argument("-d", "--duration", type=seconds, default=None, metavar="S",
                   help="stop after S seconds (default: Ctrl-C, the end of COMMAND or of -p PID)")
    p.add_argument("-e", "--event", type=_event, default=None, metavar="EVENT",
                   help="cpu-clock or cycles (a hardware PMU only; default: cycles where there is one)")
    p.add_argument("-a", "--all-cpus", action="store_true",
                   help="accepted for perf's habit: vmprof always samples every CPU")
    p.add_argument("-c", "--count", default=None, metavar="N", help="not supported: vmprof samples by -F HZ")
    p.add_argument("-C", "--cpu", default=None, metavar="CPUS",
                   help="not supported: vmprof samples every CPU (report --cpu N shows one)")
    p.add_argument("-t", "--tid", default=None, metavar="TID", help="not supported: use -p PID")
    p.add_argument("--group-readable", action="store_true",
                   help="create the recording 0640 instead of 0600, for a team reading it through a group")
    p.add_argument("--vm", action="append", default=[], metavar="NAME",
                   help="keep only samples of this VM (repeatable; scheduler events are always kept)")
    p.add_argument("-p", "--pid", type=int, default=None,
                   help="keep only samples of this host process; stop when it exits")
    p.add_argument("-g", dest="stacks", action="store_true",
                   help="record call stacks: host kernel and user chains and guest chains read through guest "
                        "memory (docs/stacks.md); user chains as --call-graph says")
    p.add_argument("--call-graph", default=None, metavar="fp|cfi|dwarf[,SIZE]",
                   help="implies -g: cfi (dwarf, as perf calls it; the default) copies SIZE bytes of user stack per "
                        "sample (default 8192) and unwinds them when reporting by each object's call-frame "
                        "information, by frame pointers in an object without any; fp walks frame pointers at "
                        "sample time (smaller and cheaper: for many CPUs at high rates)")
    p.add_argument("--stack-map-entries", type=int, default=None, metavar="N",
                   help="with -g: host chains the BPF stack map holds (default 16384); a chain whose slot "
                        "another holds is stored in its sample's record instead")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress")
    p.add_argument("--lbr", nargs="?", const="type4", default=None, metavar="PATTERN",
                   help="also record last branch records with cycles and instructions (hosts with a PMU and LBR; "
                        "PATTERN type1..type4 or any as in `vmprof blocks --patterns`, default type4). "
                        "simulate[:PATTERN] needs -- COMMAND and works anywhere: COMMAND is single-stepped, which is "
                        "slow (every instruction traced; bounded by --lbr-max-instructions, -d and Ctrl-C), and "
                        "sampled "
                        "every 1e9/F cycles of a synthetic cost model (1 cycle = 1 ns), the recording marked "
                        "simulated; no other sampling then (docs/lbr.md)")
    p.add_argument("--lbr-depth", type=int, default=16, metavar="N", help="with --lbr=simulate: LBR entries")
    p.add_argument("--lbr-max-instructions", type=int, default=2_000_000, metavar="N",
                   help="with --lbr=simulate: stop the command (keeping what was traced) after N instructions")
    p.add_argument("--lbr-period", type=int, default=1_000_003, metavar="CYCLES",
                   help="cycles between LBR samples (about 1 ms at 1 GHz)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="record while this command runs, from its start to its end")


def _event(text: str) -> str:
    if text not in EVENTS:
        raise argparse.ArgumentTypeError(f"takes cpu-clock or cycles, not {text!r}")
    return EVENTS[text]


def _refuse_perf_options(args: argparse.Namespace) -> None:
    """perf options vmprof has no equivalent of: one line each, saying what to use instead."""
    if args.count is not None:
        raise Usage(f"-c {args.count}: vmprof samples by frequency, not every N events: use -F HZ")
    if args.cpu is not None:
        raise Usage(f"-C {args.cpu}: vmprof samples every CPU; vmprof report --cpu N shows one of them")
    if args.tid is not None:
        raise Usage(f"-t {args.tid}: vmprof keeps the samples of a whole process: use -p PID")


def _process_gone(pid: int) -> bool:
    """-p PID has exited: no /proc entry, or a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def parse_call_graph(text: str | None, default: str = "cfi") -> tuple[str, int]:
    """(mode, stack copy bytes) of --call-graph fp|cfi|dwarf[,SIZE] (dwarf is cfi); `-g` alone is `default`.

    record's `-g` is cfi: each object unwinds by its call-frame information where it has some, by frame pointers
    where it has none (resolve/unwind.py), because Debian's programs and libraries have no frame pointers and
    the copy costs little per sample (the measurement is in docs/stacks.md, "Default")."""
    from vmprof_tui.record.bpf_records import STACK_COPY_BYTES

    mode, _, size = (text or default).partition(",")
    mode = "cfi" if mode == "dwarf" else mode
    if mode not in ("fp", "cfi") or (size and mode != "cfi"):
        raise Usage(f"--call-graph {text}: say fp, cfi or dwarf, the last two with an optional ,SIZE")
    if not size:
        return mode, STACK_COPY_BYTES
    if not size.isdigit() or int(size) not in [1 << k for k in range(10, 17)]:
        raise Usage(f"--call-graph {text}: SIZE is the bytes of stack copied per sample, a power of two "
                    "from 1024 to 65536")
    return mode, int(size)


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.collect.backends import BackendError
    from vmprof_tui.collect.bpf import HOST_STACK_ENTRIES, CollectError
    from vmprof_tui.collect.session import CollectionSession, SessionError
    from vmprof_tui.lbr.collector import LbrCollector, LbrConfig
    from vmprof_tui.record.recorder import Progress, Recorder
    from vmprof_tui.record.recording import RecordingError

    _refuse_perf_options(args)
    call_graph, copy_bytes = parse_call_graph(args.call_graph)
    args.stacks = args.stacks or args.call_graph is not None
    if args.group_readable:
        files.share_with_group()
    if args.stack_map_entries is not None and not (args.stacks and 1 <= args.stack_map_entries <= 1 << 20):
        raise Usage("--stack-map-entries needs -g and a count between 1 and 1048576")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and shutil.which(command[0]) is None:
        if command[0] in CALL_GRAPH_MODES:  # `-g dwarf`: perf's -g takes no mode either
            raise Usage(f"command not found: {command[0]} (a call-graph mode goes after --call-graph)")
        raise Failure(f"command not found: {command[0]}")
    if args.pid is not None and not Path(f"/proc/{args.pid}").is_dir():
        raise Failure(f"no process with pid {args.pid} on this host")
    args.output = args.output or DEFAULT_RECORDING
    if args.lbr and args.lbr.split(":")[0] == "simulate":
        return run_simulate(args, command)
    interrupted = stop_on_signals()
    child: subprocess.Popen | None = None

    def stopped() -> bool:
        return (interrupted() or (child is not None and child.poll() is not None)
                or (args.pid is not None and _process_gone(args.pid)))
    tty = sys.stderr.isatty()

    def on_progress(p: Progress) -> None:
        if not recorder.attached.is_set():
            return
        line = (f"recording {args.output}: {p.elapsed_s:6.1f}s  samples {p.samples}  guest {p.guest}  "
                f"lost {p.lost}  VMs {', '.join(p.vms) or 'none'}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        lbr = LbrCollector(LbrConfig.named(args.lbr, period=args.lbr_period, pid=args.pid or 0)) if args.lbr else None
        session = CollectionSession(args.frequency, vm_names=args.vm, pid=args.pid, lbr=lbr, stacks=args.stacks,
                                    stack_map_entries=args.stack_map_entries or HOST_STACK_ENTRIES,
                                    event=args.event or "", call_graph=call_graph,
                                    stack_copy_bytes=copy_bytes)
        for note in session.backend.notes:
            print(f"vmprof record: note: {note}", file=sys.stderr)
        recorder = Recorder(Path(args.output), session, keep_old=True)  # as perf: an older file becomes .old

        def attached() -> None:
            nonlocal child
            if not args.quiet:  # the line a user (or a test) waits for: from here on every CPU is sampled
                print(f"vmprof record: sampling every CPU at {args.frequency} Hz ({session.collector.event}) "
                      f"into {args.output}; " + (f"running {shlex.join(command)}" if command else "Ctrl-C stops"),
                      file=sys.stderr, flush=True)
            if command:
                child = subprocess.Popen(command)

        session.on_attached = attached
        progress = recorder.run(args.duration, stopped, None if args.quiet else on_progress)
    except (BackendError, CollectError, SessionError, RecordingError, OSError) as e:
        return fail(str(e))
    finally:
        if child is not None and child.poll() is None:  # -d ended the recording first, or Ctrl-C
            child.terminate()
            child.wait()
    if tty and not args.quiet:
        print(file=sys.stderr)
    if args.pid is not None and _process_gone(args.pid):
        print(f"vmprof record: note: process {args.pid} exited", file=sys.stderr)
    print(progress.summary())
    if child is not None and child.returncode:  # the workload's status, as perf (a signal: 128 + its number)
        status = child.returncode if child.returncode > 0 else 128 - child.returncode
        print(f"vmprof record: note: {command[0]} exited with status {status}", file=sys.stderr)
        return status
    return 0


def run_simulate(args: argparse.Namespace, command: list[str]) -> int:
    """`vmprof record --lbr=simulate[:PATTERN] -- COMMAND`: lbr/simulate.py."""
    from vmprof_tui.lbr import simulate as lbr_simulate
    from vmprof_tui.lbr.patterns import get
    from vmprof_tui.record.recording import RecordingError

    if not command:
        raise Usage("--lbr=simulate needs a command to single-step: vmprof record --lbr=simulate -o REC -- CMD")
    if args.pid is not None or args.vm or args.stacks:
        raise Usage("--lbr=simulate traces its command alone: leave out -p, --vm and -g")
    name = args.lbr.partition(":")[2] or "type4"
    try:
        pattern = get(name).with_options(info=True)
    except ValueError as e:
        raise Usage(f"--lbr=simulate:{name}: {e}") from None
    if not 1 <= args.lbr_depth <= 256 or args.lbr_max_instructions < 1:
        raise Usage("--lbr-depth must be 1..256 and --lbr-max-instructions at least 1")
    if not args.quiet:
        print(f"vmprof record: single-stepping {shlex.join(command)} (at most {args.lbr_max_instructions:,} "
              "instructions" + (f" or {args.duration:g} s" if args.duration else "") + "; this is slow)",
              file=sys.stderr, flush=True)
    try:
        run = lbr_simulate.simulate(command, pattern, args.frequency, args.lbr_depth, args.lbr_max_instructions,
                                    args.duration, stop_on_signals())
        lbr_simulate.write(Path(args.output), run, args.frequency, keep_old=True)
    except (lbr_simulate.SimulateError, RecordingError) as e:
        return fail(str(e))
    if run.stopped:
        print(f"vmprof record: note: {command[0]} was stopped at {run.stopped}: the recording holds what ran "
              "until then", file=sys.stderr)
    if len(run.records) < 20:
        print(f"vmprof record: note: only {len(run.records)} LBR samples; raise -F (up to 100000) for more",
              file=sys.stderr)
    print(f"{run.summary()} into {args.output}")
    return 0
