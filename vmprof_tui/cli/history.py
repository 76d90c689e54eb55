"""`vmprof history`: per-window steal, idle and top functions of VMs from the store (DuckDB)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from vmprof_tui.cli.common import Failure, Usage, write_output

HELP = "per-window history of VMs in the store: user, kernel, idle, steal, top functions"
EXAMPLES = """examples:
  vmprof history --store /srv/store --vm web1 --since 1h
  vmprof history --store /srv/store --anomalies          windows that stand out
  vmprof history --store /srv/store --host h1 --format csv > h1.csv"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, metavar="DIR", help="the Parquet store of vmprof analyze")
    p.add_argument("--host", default=None, metavar="NAME", help="one host")
    p.add_argument("--vm", default=None, metavar="NAME", help="one VM")
    p.add_argument("--since", default=None, metavar="TIME", help="from this time (ISO, or an age: 1h, 2d)")
    p.add_argument("--until", default=None, metavar="TIME", help="before this time (ISO, or an age)")
    p.add_argument("--top", type=int, default=3, metavar="N", help="top functions per window")
    p.add_argument("--anomalies", action="store_true", help="only windows that depart from their VM's baseline")
    p.add_argument("--baseline", type=int, default=10, metavar="N", help="windows in the anomaly baseline")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.fleet.analyse import corrupt_windows
    from vmprof_tui.fleet.history import Store, StoreError, flag_anomalies, parse_time

    if args.baseline < 3:  # anomalies need at least 3 earlier windows
        raise Usage(f"--baseline takes 3 or more windows, not {args.baseline}")
    if args.top < 0:
        raise Usage(f"--top takes 0 or more functions, not {args.top}")
    try:
        store = Store(Path(args.store))
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
        for what, value, known in (("host", args.host, store.hosts), ("VM", args.vm, lambda: store.vms(args.host))):
            if value is not None and value not in known():
                raise StoreError(f"no {what} named {value} in {args.store}"
                                 f"{f' on host {args.host}' if what == 'VM' and args.host else ''} "
                                 f"({what}s: {', '.join(known()) or 'none'})")
        rows = store.history(args.host, args.vm, since, until, args.top)
        flag_anomalies(rows, store.per_window_function_shares(args.host, args.vm, since, until), args.baseline)
    except StoreError as e:
        raise Failure(str(e)) from None
    for w in corrupt_windows(Path(args.store)):  # skipped by analyze: said once each, never silently missing
        if (args.host in (None, w["host"]) and (since is None or w["start_unix_s"] >= since.timestamp())
                and (until is None or w["start_unix_s"] < until.timestamp())):
            print(f"vmprof history: {w['host']} window {w['seq']} skipped: {w['why']}", file=sys.stderr)
    if not rows:
        raise Failure(f"no window in {args.store} matches"
                      + "".join(f" {k} {v}" for k, v in (("--host", args.host), ("--vm", args.vm),
                                                          ("--since", args.since), ("--until", args.until)) if v))
    if args.anomalies:
        rows = [r for r in rows if r.anomalies]
    if args.format == "json":
        write_output(args, json.dumps([r.to_json() for r in rows], indent=1) + "\n")
    elif args.format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["host", "vm", "window_id", "start", "window_s", "user_pct", "kernel_pct", "idle_pct", "steal_pct",
                    "top_function", "top_pct", "anomalies"])
        for r in rows:
            f, _m, p = r.top[0] if r.top else ("", "", 0.0)
            w.writerow([r.host, r.vm, r.window, r.start.isoformat(), f"{r.window_s:.3f}",
                        f"{r.shares['guest_user']:.3f}", f"{r.shares['guest_kernel']:.3f}",
                        f"{r.shares['idle']:.3f}", f"{r.shares['steal']:.3f}", f, f"{p:.3f}", "; ".join(r.anomalies)])
        write_output(args, buf.getvalue())
    else:
        lines = [f"{'host':10} {'vm':10} {'window':>6} {'start (UTC)':19} {'user%':>6} {'kern%':>6} {'idle%':>6} "
                 f"{'steal%':>6}  top functions"]
        for r in rows:
            tops = ", ".join(f"{f} {p:.0f}%" for f, _m, p in r.top)
            lines.append(f"{r.host[:10]:10} {r.vm[:10]:10} {r.window:>6} {r.start:%Y-%m-%d %H:%M:%S} "
                         f"{r.shares['guest_user']:6.1f} {r.shares['guest_kernel']:6.1f} {r.shares['idle']:6.1f} "
                         f"{r.shares['steal']:6.1f}  {tops}")
            lines += [f"{'':>10}   ! {a}" for a in r.anomalies]
        write_output(args, "\n".join(lines) + "\n")
    return 0
