"""`vmprof analyze`: the analysis node: spools of agent windows → Dask tasks → the Parquet store."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.cli.common import Failure, count, scheduler_address, stop_on_signals

HELP = "analyse agent windows on Dask into a Parquet store (each window once)"
EXAMPLES = """examples:
  vmprof analyze /srv/spool --store /srv/store          embedded LocalCluster
  vmprof analyze /nfs/spool/* --store /srv/store --scheduler tcp://node1:8786
  vmprof analyze /srv/spool --store /srv/store --follow   keep up with it

a real cluster: `dask scheduler` on one node, `dask worker tcp://node1:8786` on
each analysis node (vmprof installed, the spool mounted at the same path).

the store's folders are created 0700 and its files 0600; --group-readable (or
VMPROF_GROUP_READABLE=1 in a remote worker's environment): 0750/0640."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spools", nargs="+", metavar="SPOOL", help="spool folders (or one host's folder in a spool)")
    p.add_argument("--store", required=True, metavar="DIR", help="the Parquet store to append to")
    p.add_argument("--scheduler", type=scheduler_address, default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (default: an embedded LocalCluster)")
    p.add_argument("--workers", type=count, default=None, metavar="N",
                   help="LocalCluster worker processes (default: one per CPU)")
    p.add_argument("--follow", action="store_true", help="keep looking for new windows until Ctrl-C")
    p.add_argument("--retries", type=int, default=3, metavar="N", help="re-runs of a failed task")
    p.add_argument("--group-readable", action="store_true",
                   help="create the store's folders 0750 and files 0640 instead of 0700/0600")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.fleet.analyse import (
        Analyser,
        StoreWriteError,
        WindowResult,
        check_store,
        find_windows,
        hosts_per_node,
    )

    spools = [Path(s) for s in args.spools]
    for s in spools:
        if not s.is_dir():
            raise Failure(f"{s} is not a spool folder (vmprof agent --spool {s} writes one)")
    if args.group_readable:
        files.share_with_group()  # before the LocalCluster's workers start: they inherit it
    stopped = stop_on_signals()
    worst: list[int] = []

    def on_window(r: WindowResult) -> None:
        if r.error:
            print(f"vmprof analyze: {r.ref.host} window {r.ref.seq} skipped: {r.error}", file=sys.stderr, flush=True)
            return
        n = hosts_per_node(r.t0_s, r.t1_s, r.t2_s, threads)
        worst.append(n)
        print(f"{r.ref.host:12} window {r.ref.seq:6}  VMs {len(r.vms):2}  t0 {r.t0_s:6.3f}s  t1 {r.t1_s:7.2f}s  "
              f"t2 {r.t2_s:6.3f}s  hosts per node {n}", flush=True)

    store = Path(args.store)
    try:
        check_store(store)  # before a cluster starts: a read-only store is one line, not one per window
        analyser = Analyser(store, args.scheduler, args.workers)
        try:
            analyser.__enter__()
        except OSError as e:  # only connecting is the scheduler's part
            where = f"the Dask scheduler {args.scheduler}" if args.scheduler else "an embedded Dask cluster"
            raise Failure(f"cannot reach {where}: {e}") from None
        try:
            threads = analyser.n_threads
            while True:
                results = analyser.run(find_windows(spools), on_window, retries=args.retries)
                if not args.follow or stopped():
                    break
                if not results:
                    time.sleep(1.0)
        finally:
            analyser.__exit__(None, None, None)
    except StoreWriteError as e:
        raise Failure(str(e.strerror)) from None
    except OSError as e:  # a spool that went away, a file that cannot be read: named, not blamed on the scheduler
        raise Failure(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}") from None
    if worst:
        print(f"continuity t0 + t1 > (t0 + t2/{threads}) x n holds here for n <= {min(worst)} hosts "
              f"(the worst window; {threads} worker threads)")
    return 0
