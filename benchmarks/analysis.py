"""End-to-end report time of a 60 s, 2-CPU, 1 kHz recording of three VMs, beside `perf kvm report`
on a perf.data recorded at the same time and rate.

Usage: python benchmarks/analysis.py [--seconds 60] [--keep DIR]
Records both (vmprof record and perf kvm --host --guest record, side by side, while the steal3 demo
runs), then times `vmprof report` (host and guest level) and `perf kvm report` three times each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Background, perf_binary  # noqa: E402

from vmprof_tui.demo import runner  # noqa: E402


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--keep", type=Path, default=None, help="folder for the recordings (default: a temp dir)")
    args = ap.parse_args()
    out = args.keep or Path(tempfile.mkdtemp(prefix="vmprof-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rec, pdata = out / "steal3.vmprof", out / "perf.data"
    perf = perf_binary()
    with runner.DemoRun(runner.scenario_specs("steal3"), duration_s=args.seconds + 30):
        time.sleep(1)
        bg = [Background([sys.executable, "-m", "vmprof_tui", "record", "-q", "-F", "1000", "-o", str(rec),
                          "-d", str(args.seconds)], warmup_s=0)]
        if perf:
            bg.append(Background([perf, "kvm", "--host", "--guest", "record", "-a", "-F", "1000", "-o",
                                  str(pdata)], warmup_s=0))
        time.sleep(args.seconds + 3)
        for b in bg:
            b.stop()
    vm = [sys.executable, "-m", "vmprof_tui", "report", str(rec)]
    host_s = statistics.median(timed(vm) for _ in range(3))
    guest_s = statistics.median(timed([*vm, "--vm", "steal1"]) for _ in range(3))
    print(f"vmprof report, host level:  {host_s:.3f} s end to end")
    print(f"vmprof report, guest level: {guest_s:.3f} s end to end")
    if perf:
        perf_s = statistics.median(timed([perf, "kvm", "--host", "--guest", "report", "-i", str(pdata), "--stdio"])
                                   for _ in range(3))
        print(f"perf kvm report:            {perf_s:.3f} s end to end")
        print(f"ratio vmprof (host level) / perf kvm report: {host_s / perf_s:.2f}")
    else:
        print("perf not installed (apt-get install linux-perf): no comparison")
    print(f"recordings in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
