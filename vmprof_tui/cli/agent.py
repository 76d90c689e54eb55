"""`vmprof agent`: always-on collection into a spool of back-to-back windows (thesis ch. 4)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.cli.common import Failure, Usage, fail, frequency, seconds, stop_on_signals

HELP = "profile continuously: back-to-back windows into a spool, for vmprof analyze"
EXAMPLES = """examples:
  vmprof agent --spool /var/spool/vmprof            60 s windows at 1000 Hz
  vmprof agent --spool /srv/spool --window 10s --keep 24h --metrics :9466
  vmprof agent --spool /srv/spool --max-size 10G    oldest windows go first
  vmprof agent --spool /srv/spool --status          what the agent stored

the spool's folders are created 0700 and its files 0600 (they hold guest and
host names and the host's kernel addresses); --group-readable: 0750/0640."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spool", required=True, metavar="DIR", help="spool folder (windows go to DIR/HOST/windows)")
    p.add_argument("--host", default=socket.gethostname(), metavar="NAME", help="this host's name in the spool")
    p.add_argument("--window", default="60s", metavar="DURATION", help="window length (e.g. 10s, 1m)")
    p.add_argument("-F", "--frequency", "--rate", type=frequency, default=1000, metavar="HZ",
                   help="samples per second per CPU, to 100000")
    p.add_argument("--keep", default=None, metavar="DURATION", help="delete windows older than this (e.g. 24h)")
    p.add_argument("--max-size", default=None, metavar="SIZE", help="keep the spool's windows under SIZE (e.g. 10G)")
    p.add_argument("--metrics", default=None, metavar="[ADDR]:PORT",
                   help="serve Prometheus metrics: PORT on 127.0.0.1 only, :PORT on every interface (scraped from "
                        "other hosts), ADDR:PORT on that address")
    p.add_argument("-d", "--duration", type=seconds, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--group-readable", action="store_true",
                   help="create the spool's folders 0750 and files 0640 instead of 0700/0600")
    p.add_argument("--status", action="store_true", help="show the stored windows and exit")


def _status(spool_dir: Path, limit: int = 20) -> int:
    from vmprof_tui.record.spool import Spool

    spool = Spool(spool_dir.parent, spool_dir.name)
    log = spool.read_log()
    if not log:
        print(f"{spool_dir}: no window stored yet")
        return 0
    print(f"{'window':>8} {'t1 s':>7} {'t0 s':>7} {'uncovered s':>11} {'samples':>8} {'lost':>5}  file")
    for w in log[-limit:]:
        print(f"{w['seq']:>8} {w['t1_s']:>7.2f} {w['t0_s']:>7.3f} {w['uncovered_s']:>11.3f} {w['samples']:>8} "
              f"{w['lost_samples']:>5}  {w['file'] or 'NOT STORED: ' + str(w['error'])}")
    covered = sum(w["t1_s"] for w in log)
    uncovered = sum(w["uncovered_s"] for w in log)
    print(f"{len(log)} windows, {sum(1 for w in log if not w['stored'])} not stored, uncovered "
          f"{100 * uncovered / max(covered + uncovered, 1e-9):.2f}% of {covered + uncovered:.0f} s")
    print(f"host objects' symbol tables stored: {sum(w.get('objects_stored', 0) for w in log)}, "
          f"{sum(w.get('objects_bytes', 0) for w in log) / 1024:.0f} KiB, "
          f"{sum(w.get('objects_cpu_s', 0.0) for w in log):.2f} s of the writer thread's CPU")
    return 0


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.record.spool import Spool, parse_duration, parse_size

    try:
        window_s = parse_duration(args.window)
        keep_s = parse_duration(args.keep) if args.keep else None
        max_bytes = parse_size(args.max_size) if args.max_size else None
    except ValueError as e:
        raise Usage(str(e)) from None
    if window_s < 1:
        raise Usage("--window must be at least 1 s")
    listen = None
    if args.metrics:  # checked before the spool is made: bad usage touches nothing
        from vmprof_tui.fleet.metrics import parse_address

        try:
            listen = parse_address(args.metrics)
        except ValueError as e:
            raise Usage(str(e)) from None
    if args.status:
        return _status(Path(args.spool) / args.host)
    if args.group_readable:
        files.share_with_group()

    from vmprof_tui.collect.backends import BackendError
    from vmprof_tui.collect.bpf import CollectError
    from vmprof_tui.collect.session import CollectionSession, SessionError
    from vmprof_tui.record.spool import Agent, WindowStats

    try:
        spool = Spool(Path(args.spool), args.host, keep_s, max_bytes)
        spool.remove_unfinished()
    except OSError as e:
        raise Failure(f"cannot use the spool {args.spool}: {e.strerror or e}") from None
    metrics = None
    if args.metrics:
        from vmprof_tui.fleet.metrics import AgentMetrics

        metrics = AgentMetrics()
        try:
            metrics.serve(args.metrics)
        except (OSError, ValueError) as e:
            raise Failure(f"cannot serve metrics on {args.metrics}: {e}") from None

    def on_window(stats: WindowStats, path: Path | None) -> None:
        if stats.stored:
            print(f"vmprof agent: window {stats.seq} stored ({stats.t1_s:.1f} s, {stats.samples} samples, "
                  f"t0 {stats.t0_s:.3f} s, uncovered {stats.uncovered_s:.3f} s, lost {stats.lost_samples})",
                  file=sys.stderr, flush=True)
        else:
            print(f"vmprof agent: window {stats.seq} NOT stored: {stats.error}; collection goes on "
                  f"({agent.not_stored} not stored so far)", file=sys.stderr, flush=True)
        if metrics is not None and path is not None:
            from vmprof_tui.analyse.analysis import analyse
            from vmprof_tui.analyse.source import RecordingSource
            from vmprof_tui.record.recording import load

            metrics.add_window(RecordingSource(analyse(load(path))), stats.stored, stats.t0_s, stats.uncovered_s,
                               stats.lost_samples)

    interrupted = stop_on_signals()
    try:
        session = CollectionSession(args.frequency)
        agent = Agent(session, spool, window_s, on_window)
        session.on_attached = lambda: print(
            f"vmprof agent: sampling every CPU at {args.frequency} Hz into {spool.dir} in {window_s:g} s windows"
            + (f"; metrics on http://{listen[0]}:{listen[1]}/metrics" if args.metrics else ""), file=sys.stderr,
            flush=True)
        # -d counts from the start of sampling, as in `record`: BPF compilation takes a variable time
        agent.run(lambda: interrupted() or (args.duration is not None
                                            and time.monotonic() - session.started_at >= args.duration))
    except (BackendError, CollectError, SessionError) as e:
        return fail(str(e))
    print(json.dumps({"windows": len(agent.stats), "not_stored": agent.not_stored,
                      "uncovered_s": sum(s.uncovered_s for s in agent.stats)}))
    return 0
