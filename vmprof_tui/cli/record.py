"""`vmprof record`: sample the whole host into a recording file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vmprof_tui.cli.common import fail, stop_on_signals

HELP = "sample the whole host (host, VMMs, every guest) into a recording file"
EXAMPLES = """examples:
  vmprof record -o run.vmprof -d 10          everything on every CPU for 10 s at 1000 Hz
  vmprof record -o run.vmprof -F 10000       10 kHz until Ctrl-C
  vmprof record -o web.vmprof --vm web1 --vm web2 -d 30   samples of two VMs only
  vmprof record -o lbr.vmprof --lbr --pid 1234 -d 10      + branch records for vmprof blocks (PMU hosts)"""


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.collect.backends import BackendError
    from vmprof_tui.collect.bpf import CollectError
    from vmprof_tui.collect.lbr import LbrConfig
    from vmprof_tui.collect.session import CollectionSession, SessionError
    from vmprof_tui.record.recorder import Progress, Recorder
    from vmprof_tui.record.recording import RecordingError

    if args.frequency <= 0 or args.frequency > 100_000:
        print("vmprof record: -F must be between 1 and 100000 Hz", file=sys.stderr)
        return 2
    stopped = stop_on_signals()
    tty = sys.stderr.isatty()

    def on_progress(p: Progress) -> None:
        if not recorder.attached.is_set():
            return
        line = (f"recording {args.output}: {p.elapsed_s:6.1f}s  samples {p.samples}  guest {p.guest}  "
                f"lost {p.lost}  VMs {', '.join(p.vms) or 'none'}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        lbr = LbrConfig.named(args.lbr, period=args.lbr_period, pid=args.pid or 0) if args.lbr else None
        session = CollectionSession(args.frequency, vm_names=args.vm, pid=args.pid, lbr=lbr)
        for note in session.backend.notes:
            print(f"vmprof record: note: {note}", file=sys.stderr)
        recorder = Recorder(Path(args.output), session)
        if not args.quiet:
            # the line a user (or a test) waits for: from here on every CPU is sampled
            session.on_attached = lambda: print(
                f"vmprof record: sampling every CPU at {args.frequency} Hz ({session.collector.event}) "
                f"into {args.output}; Ctrl-C stops", file=sys.stderr, flush=True)
        progress = recorder.run(args.duration, stopped, None if args.quiet else on_progress)
    except (BackendError, CollectError, SessionError, RecordingError) as e:
        return fail(str(e))
    if tty and not args.quiet:
        print(file=sys.stderr)
    print(progress.summary())
    return 0
