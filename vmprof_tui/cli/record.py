"""`vmprof record`: sample the whole host into a recording file."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from vmprof_tui.cli.common import DEFAULT_RECORDING, Failure, Usage, fail, stop_on_signals

HELP = "sample the whole host (host, VMMs, every guest) into a recording file"
EXAMPLES = """examples:
  vmprof record -d 10       every CPU, 10 s at 1000 Hz, into ./vmprof.data
  vmprof record -o run.vmprof -F 10000          10 kHz until Ctrl-C
  vmprof record -o run.vmprof -- make -j2       while a command runs
  vmprof record -o web.vmprof --vm web1 -d 30   samples of one VM only
  vmprof record -o lbr.vmprof --lbr -p 1234     + branch records (PMU hosts)
  vmprof record -g -d 5 -o stacks.vmprof        + call stacks, host and guest"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help=f"recording file to write (default: ./{DEFAULT_RECORDING}; an old one becomes .old)")
    p.add_argument("-F", "--frequency", "--rate", type=int, default=1000, metavar="HZ",
                   help="samples per second per CPU")
    p.add_argument("-d", "--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: Ctrl-C, or the end of COMMAND)")
    p.add_argument("-a", "--all-cpus", action="store_true",
                   help="accepted for perf's habit: vmprof always samples every CPU")
    p.add_argument("--vm", action="append", default=[], metavar="NAME",
                   help="keep only samples of this VM (repeatable; scheduler events are always kept)")
    p.add_argument("-p", "--pid", type=int, default=None, help="keep only samples of this host process")
    p.add_argument("-g", dest="stacks", action="store_true",
                   help="record call stacks: host kernel and user chains and guest chains read through guest "
                        "memory (docs/stacks.md); user chains as --call-graph says")
    p.add_argument("--call-graph", default=None, metavar="fp|cfi|dwarf[,SIZE]",
                   help="implies -g: fp walks frame pointers at sample time; cfi (dwarf, as perf calls it) copies "
                        "SIZE bytes of user stack per sample (default 8192) and unwinds them by the objects' "
                        "call-frame information when reporting (default: fp)")
    p.add_argument("--stack-map-entries", type=int, default=None, metavar="N",
                   help="with -g: host chains the BPF stack map holds (default 16384); a chain whose slot "
                        "another holds is stored in its sample's record instead")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress")
    p.add_argument("--lbr", nargs="?", const="type4", default=None, metavar="PATTERN",
                   help="also record last branch records with cycles and instructions (hosts with a PMU and LBR; "
                        "PATTERN type1..type4 as in `vmprof blocks --patterns`, default type4)")
    p.add_argument("--lbr-period", type=int, default=1_000_003, metavar="CYCLES",
                   help="cycles between LBR samples (about 1 ms at 1 GHz)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="record while this command runs, from its start to its end")


def parse_call_graph(text: str | None) -> tuple[str, int]:
    """(mode, stack copy bytes) of --call-graph fp|cfi|dwarf[,SIZE] (dwarf is cfi)."""
    from vmprof_tui.record.records import STACK_COPY_BYTES

    mode, _, size = (text or "fp").partition(",")
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
    from vmprof_tui.collect.lbr import LbrConfig
    from vmprof_tui.collect.session import CollectionSession, SessionError
    from vmprof_tui.record.recorder import Progress, Recorder
    from vmprof_tui.record.recording import RecordingError

    if args.frequency <= 0 or args.frequency > 100_000:
        raise Usage("-F must be between 1 and 100000 Hz")
    call_graph, copy_bytes = parse_call_graph(args.call_graph)
    args.stacks = args.stacks or args.call_graph is not None
    if args.stack_map_entries is not None and not (args.stacks and 1 <= args.stack_map_entries <= 1 << 20):
        raise Usage("--stack-map-entries needs -g and a count between 1 and 1048576")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and shutil.which(command[0]) is None:
        raise Failure(f"command not found: {command[0]}")
    if args.pid is not None and not Path(f"/proc/{args.pid}").is_dir():
        raise Failure(f"no process with pid {args.pid} on this host")
    if args.output is None:
        args.output = DEFAULT_RECORDING
        if Path(args.output).exists():  # as perf does with perf.data
            Path(args.output).replace(args.output + ".old")
    interrupted = stop_on_signals()
    child: subprocess.Popen | None = None

    def stopped() -> bool:
        return interrupted() or (child is not None and child.poll() is not None)
    tty = sys.stderr.isatty()

    def on_progress(p: Progress) -> None:
        if not recorder.attached.is_set():
            return
        line = (f"recording {args.output}: {p.elapsed_s:6.1f}s  samples {p.samples}  guest {p.guest}  "
                f"lost {p.lost}  VMs {', '.join(p.vms) or 'none'}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        lbr = LbrConfig.named(args.lbr, period=args.lbr_period, pid=args.pid or 0) if args.lbr else None
        session = CollectionSession(args.frequency, vm_names=args.vm, pid=args.pid, lbr=lbr, stacks=args.stacks,
                                    stack_map_entries=args.stack_map_entries or HOST_STACK_ENTRIES,
                                    call_graph=call_graph, stack_copy_bytes=copy_bytes)
        for note in session.backend.notes:
            print(f"vmprof record: note: {note}", file=sys.stderr)
        recorder = Recorder(Path(args.output), session)

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
    if child is not None and child.returncode:
        print(f"vmprof record: note: {command[0]} exited with status {child.returncode}", file=sys.stderr)
    print(progress.summary())
    return 0
