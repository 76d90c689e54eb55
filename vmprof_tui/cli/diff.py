"""`vmprof diff`: a VM's differential profile between two time ranges of the store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vmprof_tui.cli.common import Failure, Usage, count, write_output

HELP = "differential profile of a VM between two time ranges of the store"
EXAMPLES = """examples:
  vmprof diff --store /srv/store --vm web1 2h..1h 1h..0m   the last hour vs
                                                           the one before
  vmprof diff --store /srv/store --vm web1 \\
              2026-11-22T09:00..2026-11-22T10:00 30m..0m"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, metavar="DIR", help="the Parquet store of vmprof analyze")
    p.add_argument("--vm", required=True, metavar="NAME", help="the VM")
    p.add_argument("--host", default=None, metavar="NAME", help="one host")
    p.add_argument("a", metavar="A", help="FROM..TO: the first range (ISO times or ages such as 2h)")
    p.add_argument("b", metavar="B", help="FROM..TO: the second range")
    p.add_argument("--limit", type=count, default=20, metavar="N", help="at most N functions")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.fleet.history import Store, StoreError, diff, parse_time

    ranges = []
    for text in (args.a, args.b):
        lo, sep, hi = text.partition("..")
        if not sep:
            raise Usage(f"a range is FROM..TO, not {text!r}")
        ranges.append((lo, hi))
    try:
        store = Store(Path(args.store))
        (a, b) = [(parse_time(lo), parse_time(hi)) for lo, hi in ranges]
        rows = diff(store, args.vm, a, b, args.host, args.limit, (f"A {args.a}", f"B {args.b}"))
    except StoreError as e:
        raise Failure(str(e)) from None
    if args.format == "json":
        write_output(args, json.dumps([{"function": r.function, "module": r.module, "a_pct": round(r.a_pct, 3),
                                        "b_pct": round(r.b_pct, 3), "delta": round(r.delta, 3)} for r in rows],
                                      indent=1) + "\n")
        return 0
    lines = [f"VM {args.vm}: share of its samples in A ({args.a}) and B ({args.b})",
             f"{'A %':>7} {'B %':>7} {'change':>7}  function  module"]
    lines += [f"{r.a_pct:7.2f} {r.b_pct:7.2f} {r.delta:+7.2f}  {r.function}  {r.module}" for r in rows]
    write_output(args, "\n".join(lines) + "\n")
    return 0
