"""Overhead of `vmprof record` on a CPU-bound guest, beside the floor and beside perf.

Runs interleaved rounds of: no profiler; the floor (the same cpu-clock perf event at the
same frequency with an empty BPF program); `vmprof record`; `vmprof record` without its
steal-cause programs (VMPROF_STEAL_CAUSES=0: IRQ clock, wake-ups, halt ends); `perf kvm
--host --guest record`.  Prints each one's cost as the relative drop of the guest's work
rate, and vmprof's cost above the floor with and without those programs.
Usage: python benchmarks/overhead.py [--rounds 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_rates, perf_binary  # noqa: E402

FLOOR = """
import sys, time, bcc
b = bcc.BPF(text="int on_sample(void *ctx) { return 0; }")
b.attach_perf_event(ev_type=bcc.PerfType.SOFTWARE, ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                    fn_name="on_sample", sample_freq=int(sys.argv[1]), cpu=-1)
try:
    while True:
        time.sleep(1)
except KeyboardInterrupt:
    pass
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--frequencies", default="1000,10000")
    args = ap.parse_args()
    perf = perf_binary()
    tmp = Path(tempfile.mkdtemp(prefix="vmprof-bench-"))
    conditions = {
        "none": None,
        "floor": lambda f: [sys.executable, "-c", FLOOR, str(f)],
        "vmprof": lambda f: [sys.executable, "-m", "vmprof_tui", "record", "-q", "-F", str(f), "-o",
                             str(tmp / "r.vmprof")],
        # without the IRQ clock, wake-up and halt-end programs (issue 15's steal causes)
        "vmprof-no-causes": lambda f: ["env", "VMPROF_STEAL_CAUSES=0", sys.executable, "-m", "vmprof_tui", "record",
                                       "-q", "-F", str(f), "-o", str(tmp / "n.vmprof")],
    }
    if perf:
        conditions["perf"] = lambda f: [perf, "kvm", "--host", "--guest", "record", "-a", "-F", str(f), "-o",
                                        str(tmp / "perf.data")]
    else:
        print("perf not found (apt-get install linux-perf): perf column skipped")
    for freq in (int(f) for f in args.frequencies.split(",")):
        rates = interleaved_rates({k: cmd(freq) if cmd else None for k, cmd in conditions.items()}, args.rounds,
                                  args.seconds, f"{freq} Hz")
        base = statistics.median(rates["none"])
        cost = {k: 100.0 * (1 - statistics.median(v) / base) for k, v in rates.items()}
        line = f"{freq} Hz: guest work-rate drop vs no profiler (median of {args.rounds} interleaved rounds): " + \
            ", ".join(f"{k} {c:+.2f}%" for k, c in cost.items() if k != "none")
        line += f"; vmprof above the floor {cost['vmprof'] - cost['floor']:+.2f}%"
        line += f" (without the steal-cause programs {cost['vmprof-no-causes'] - cost['floor']:+.2f}%)"
        if "perf" in cost:
            line += f"; vmprof/perf cost ratio {cost['vmprof'] / cost['perf']:.2f}" if cost["perf"] else ""
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
