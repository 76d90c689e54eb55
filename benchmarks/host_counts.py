"""`vmprof top --host-counts` against sending every sample (issue 14): the live window's CPU per refresh and the
records that cross the ring buffer, with a demo VM and busy host processes, the two modes taking turns.

Each round starts a live window in one mode, refreshes it every second (poll, then the overview's host and guest
summaries and the host view's first 500 rows, as the screen would) and measures this process's CPU time over
the refreshes; the host processes busy meanwhile are the samples the kernel counts instead of sending.
Usage: python benchmarks/host_counts.py [--rate 10000] [--busy 1] [--seconds 15] [--repeat 2]   (root)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from vmprof_tui.analyse.window import LiveWindow
from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.demo import runner


def measure(rate: int, counted: bool, seconds: float) -> tuple[float, float]:
    """(CPU ms per refresh, ring-buffer samples per second) of a live window over `seconds`."""
    window = LiveWindow(CollectionSession(rate, build_ids=False, host_counts=counted), 10.0)
    try:
        window.start()
        window.poll()  # compiles nothing more later: the first poll discovers the VM and snapshots processes
        costs, ring, t0 = [], 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            c = time.process_time()
            view = window.poll()
            view.host_summary(), view.host_rows(500), [view.guest_summary(vm) for vm in view.vm_names()]
            costs.append(time.process_time() - c)
            ring += len(window.chunks.chunks[-1].samples)
        return 1000 * statistics.median(costs), ring / (time.monotonic() - t0)
    finally:
        window.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=10000)
    ap.add_argument("--busy", type=int, default=1, help="busy host processes")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    result: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with runner.DemoRun(runner.scenario_specs("alone"), duration_s=2 * args.repeat * (args.seconds + 10) + 30):
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            for _ in range(args.repeat):
                for counted in (False, True):
                    result[counted].append(measure(args.rate, counted, args.seconds))
                    cost, ring = result[counted][-1]
                    print(f"  host counts {'on ' if counted else 'off'}: {cost:.1f} ms per refresh, "
                          f"{ring:.0f} ring samples/s", flush=True)
        finally:
            for p in busy:
                p.kill()
    off, on = (statistics.median(c for c, _r in result[k]) for k in (False, True))
    print(f"{args.rate} Hz, {args.busy} busy host process(es): CPU per refresh {off:.1f} ms with every sample sent, "
          f"{on:.1f} ms with host counts: off / on = {off / on:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
