"""The continuous agent beside one-shot recording: uncovered rate and cost on a CPU-bound guest.

Interleaved rounds of: no profiler; `vmprof record`; `vmprof agent` (1 s windows, so every round
crosses several window cuts).  Prints the guest's work-rate drop under each, the agent's cost
relative to record's, and the uncovered time between the agent's windows over all rounds (the thesis,
ch. 4: 35% before its fix, 13% after for one VM, 5.75% with two vCPUs per VM; target 0%).
Usage: python benchmarks/continuous.py [--rounds 5] [--seconds 4] [--frequencies 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_rates  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--frequencies", default="1000,10000")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vmprof-continuous-"))
    for freq in (int(f) for f in args.frequencies.split(",")):
        spool = tmp / f"spool-{freq}"
        conditions = {
            "none": None,
            "record": [sys.executable, "-m", "vmprof_tui", "record", "-q", "-F", str(freq), "-o",
                       str(tmp / "r.vmprof")],
            "agent": [sys.executable, "-m", "vmprof_tui", "agent", "--spool", str(spool), "--host", "h",
                      "--window", "1s", "-F", str(freq)],
        }
        rates = interleaved_rates(conditions, args.rounds, args.seconds, f"{freq} Hz", warmup_s=3.0)
        log = [json.loads(line) for line in (spool / "h" / "agent.jsonl").read_text().splitlines()]
        # windows of one agent run touch; between runs (a new agent each round) the gap is not the agent's
        covered = sum(w["t1_s"] for w in log)
        uncovered = sum(w["uncovered_s"] for w in log)
        base = statistics.median(rates["none"])
        cost = {k: 100.0 * (1 - statistics.median(v) / base) for k, v in rates.items() if k != "none"}
        print(f"{freq} Hz: guest work-rate drop (median of {args.rounds} interleaved rounds): record "
              f"{cost['record']:+.2f}%, agent {cost['agent']:+.2f}%; agent - record "
              f"{cost['agent'] - cost['record']:+.2f}"
              f" points; {len(log)} windows, {sum(not w['stored'] for w in log)} not stored, uncovered "
              f"{100 * uncovered / max(covered + uncovered, 1e-9):.3f}% of {covered:.0f} s, mean store time t0 "
              f"{statistics.mean(w['t0_s'] for w in log):.3f} s, lost samples {sum(w['lost_samples'] for w in log)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
