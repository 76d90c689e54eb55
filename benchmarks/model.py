"""Paper 003's experiment with `vmprof model`: the proposed model against the direct fit, same measurement count.

Three workloads (cpu, net-send, net-recv) in demo VMs; the resource is the CPU of all the VM's
threads (host-cpu), measured from vmprof's sched events.  Built from the same number of
measurements (default 55):

* proposed: orders 1, 2, 3 with 30, 15, 10 measurements (the paper's);
* variant: orders 1 and 3 only, 30 and 25 (the paper's figure 2; its first-order points are the
  proposed model's, the 25 third-order points are measured for it);
* direct fit: a polynomial of total degree 3 in the three levels through 55 points of {0..1}^3.

The build points of the three are measured interleaved (round robin) so that a change of the
machine's load hits all of them alike; then the evaluation grid (GRID levels per workload) is
measured in a shuffled order.  Prints the |error| distributions (median, 90th percentile), the
terminal histograms, and the load average before and after.  Run as root.
Usage: python benchmarks/model.py [--grid 7] [--window 0.8] [--png errors.png] [--save points.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from vmprof_tui.estimate import histogram as model_histogram
from vmprof_tui.estimate import model as M
from vmprof_tui.estimate.model_measure import Bench, l_max

RESOURCE = "host-cpu"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=int, default=7, help="levels per workload of the evaluation grid (paper: 11)")
    ap.add_argument("--window", type=float, default=0.8, help="seconds measured per point")
    ap.add_argument("--accounting", choices=("sched", "schedstat"), default="sched")
    ap.add_argument("--png", default=None, help="draw the histograms into this PNG")
    ap.add_argument("--save", default=None, help="keep every measured point as JSON")
    ap.add_argument("--cpus", default=None, metavar="LIST",
                    help="pin every thread of the profiling VMs to these CPUs (e.g. 1): l_max is their count")
    args = ap.parse_args()

    workloads = list(M.WORKLOADS)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    m, lmax = len(workloads), l_max(RESOURCE, cpus)
    proposed_pts = M.design(m, [30, 15, 10])
    variant_pts = [p for p in M.design(m, [30, 0, 25]) if p["order"] == 3]
    direct_levels = M.direct_points(m, len(proposed_pts))
    direct_pts = [{"levels": x.tolist()} for x in direct_levels]
    lists = [proposed_pts, variant_pts, direct_pts]
    build_order = [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]
    grid = M.evaluation_grid(m, args.grid)
    grid_order = np.random.default_rng(3).permutation(len(grid))
    total = len(build_order) + len(grid)
    load_before = os.getloadavg()
    print(f"{len(proposed_pts)} + {len(variant_pts)} + {len(direct_pts)} build points, {len(grid)} grid points "
          f"({args.grid}^{m}), window {args.window} s, accounting {args.accounting}, l_max {lmax:g} cores "
          f"(CPUs {args.cpus or 'all'}); load average before "
          f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    start = time.monotonic()
    done = 0

    def measure(levels: list[float]) -> dict:
        nonlocal done
        p = bench.measure(levels)
        done += 1
        if done % 20 == 0 or done == total:
            elapsed = time.monotonic() - start
            print(f"  {done}/{total} points, {elapsed:.0f} s, ~{elapsed / done * (total - done):.0f} s left",
                  file=sys.stderr, flush=True)
        return {"value": p.value(RESOURCE, args.accounting), "cores": p.cores}

    with Bench(workloads, accounting=args.accounting, window_s=args.window, cpus=cpus) as bench:
        for p in build_order:
            p.update(measure(p["levels"]))
        grid_pts: list[dict] = [{} for _ in grid]
        for i in grid_order:
            grid_pts[i] = measure(grid[i].tolist())
    grid_values = np.array([p["value"] for p in grid_pts])
    elapsed = time.monotonic() - start
    load_after = os.getloadavg()

    proposed = M.fit(workloads, RESOURCE, lmax, proposed_pts, 3)
    variant = M.fit(workloads, RESOURCE, lmax, [p for p in proposed_pts if p["order"] == 1] + variant_pts, 3)
    direct_values = np.array([p["value"] for p in direct_pts])
    direct = M.DirectFit.fit(direct_levels, direct_values, lmax)
    errors = {"proposed (30+15+10)": proposed.predict(grid) - grid_values,
              "variant (30+25)": variant.predict(grid) - grid_values,
              "direct fit (55)": direct.predict(grid) - grid_values}
    summary = {k: M.error_summary(v) for k, v in errors.items()}
    print(f"measured {total} points in {elapsed:.0f} s; load average after {load_after[0]:.2f} "
          f"{load_after[1]:.2f} {load_after[2]:.2f}; measured usage on the grid: median "
          f"{np.median(grid_values):.3f}, max {grid_values.max():.3f} cores")
    print(model_histogram.text(errors, summary))
    if args.accounting == "sched":  # every point carries both accountings: how far apart they are
        diff = np.abs([p["cores"]["sched"][RESOURCE] - p["cores"]["schedstat"][RESOURCE]
                       for p in [*build_order, *grid_pts]])
        print(f"sched events vs schedstat over all {len(diff)} points: |difference| median {np.median(diff):.4f}, "
              f"max {diff.max():.4f} cores")
    pd, dd = summary["proposed (30+15+10)"], summary["direct fit (55)"]
    print(f"proposed / direct: median {pd['median'] / dd['median']:.2f}, 90th percentile {pd['p90'] / dd['p90']:.2f} "
          f"({'proposed better' if pd['median'] < dd['median'] and pd['p90'] < dd['p90'] else 'proposed NOT better'})")
    if args.png:
        model_histogram.png(errors, Path(args.png), f"{RESOURCE}, {len(grid)} grid points, 55 measurements each")
    if args.save:
        grid_saved = [dict(p, levels=x.tolist()) for p, x in zip(grid_pts, grid, strict=True)]
        Path(args.save).write_text(json.dumps({"proposed": proposed_pts, "variant": variant_pts, "direct": direct_pts,
                                               "grid": grid_saved}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
