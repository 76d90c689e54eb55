"""The sched stage of a streamed `vmprof steal` alone: the recording's sched events read a stretch at a time
(record/stream.SchedReader) into the vCPU timelines (analyse/stream_sched.SchedStream), no samples, with its time
and peak RSS.  Flat against the recording's length when what it carries is bounded by what is open at an edge
(docs/scale.md, "`vmprof steal` a piece at a time").

Usage: python benchmarks/steal_sched.py REC [--step-s 4]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np

from vmprof_tui.analyse.stream_sched import MIN, SchedStream
from vmprof_tui.record.stream import SchedReader, scan
from vmprof_tui.resolve.prepare import learn_vms, recording_end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rec", type=Path)
    ap.add_argument("--step-s", type=float, default=4.0, help="the stretch of host time given at a time")
    args = ap.parse_args()
    t0 = time.perf_counter()
    scanned = scan(args.rec)
    if scanned is None:
        raise SystemExit(f"{args.rec} cannot be read a piece at a time")
    vms = learn_vms(scanned.rec, scanned.rec.samples, np.zeros(0, bool))
    timelines, events = SchedStream(vms.vcpu_of_tid, vms.by_pid), SchedReader(scanned)
    step = int(args.step_s * 1e9)
    events.until(0)  # the first chunk, read ahead: where the events begin
    lo, hi = MIN, int(events.ahead["time_ns"].min()) + step if events.ahead is not None and len(events.ahead) else 0
    steps = blanks = 0
    while True:
        sched = events.until(hi)
        last = events.ahead is None and not len(events.held)
        end = recording_end(events.first or 0, events.last or 0, scanned.rec.end) if last else hi
        blanks += len(timelines.advance(sched, lo, end, last).finished)
        steps += 1
        if last:
            break
        lo, hi = hi, hi + step
    print(f"{args.rec}: {steps} steps of {args.step_s:g} s, {blanks:,} blanks, {time.perf_counter() - t0:.1f} s, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
