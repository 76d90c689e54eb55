"""A streamed `vmprof steal` of a preempted blank that never closes (as a lost switch-in record leaves one): a vCPU
preempted at 0.5 s and never switched back in while its CPU switches between two host tasks and idle every 2 ms.
What held the blank is carried from piece to piece; its CPU time over the pieces shows whether that grows with
the pieces before (docs/scale.md, "Review fixes").

Usage: python benchmarks/steal_open_blank.py OUT.vmprof [--seconds 60] [--piece-rows 2000]
(makes OUT.vmprof if it is not there; run from the repository, tests/synth.py makes it)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synth import MS, SynthRecording  # noqa: E402

from vmprof_tui.analyse.stream_steal import StreamedSteal  # noqa: E402
from vmprof_tui.record.stream import scan  # noqa: E402


def make(path: Path, seconds: int) -> None:
    b = SynthRecording(cpus=2)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=1, start_ns=0, end_ns=500 * MS)
    b.preempt(web, 0, start_ns=500 * MS, end_ns=seconds * 1000 * MS)
    for k in range(500, seconds * 1000, 2):
        b.host_task(700 + (k // 2) % 2, ("hogb", "hoga")[(k // 2) % 2], cpu=1, start_ns=k * MS, end_ns=(k + 1) * MS)
    b.host_task(500, "app", cpu=0, start_ns=0, end_ns=seconds * 1000 * MS)
    b.write(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--piece-rows", type=int, default=2000)
    args = ap.parse_args()
    if not args.out.exists():
        make(args.out, args.seconds)
    t = time.process_time()
    an = StreamedSteal(scan(args.out), piece_rows=args.piece_rows)
    print(f"{args.out}: {an.pieces} pieces, {time.process_time() - t:.2f} s CPU")


if __name__ == "__main__":
    main()
