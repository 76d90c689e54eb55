"""Overhead of `vmprof record` on a CPU-bound guest, beside the floor and beside perf.

Runs interleaved rounds of: no profiler; the floor (the same cpu-clock perf event at the
same frequency with an empty BPF program); `vmprof record`; `vmprof record` without its
steal-cause programs (VMPROF_STEAL_CAUSES=0: IRQ clock, wake-ups, halt ends); `perf kvm
--host --guest record`.  Prints each one's cost as the relative drop of the guest's work
rate, and vmprof's cost above the floor with and without those programs.  With -g, vmprof and
perf record call stacks (`vmprof record -g` by frame pointers and `--call-graph cfi` by stack copies,
`perf kvm ... record -g`, and `perf record -a --call-graph dwarf` beside the cfi mode); the bytes per
sample of vmprof's recordings and the time `vmprof report` takes on each are printed.
Usage: python benchmarks/overhead.py [--rounds 5] [--seconds 3] [-g]
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
    ap.add_argument("-g", dest="stacks", action="store_true", help="record call stacks (vmprof and perf)")
    args = ap.parse_args()
    g = ["-g"] if args.stacks else []
    perf = perf_binary()
    tmp = Path(tempfile.mkdtemp(prefix="vmprof-bench-"))
    conditions = {
        "none": None,
        "floor": lambda f: [sys.executable, "-c", FLOOR, str(f)],
        "vmprof": lambda f: [sys.executable, "-m", "vmprof_tui", "record", "-F", str(f), "-o",
                             str(tmp / "plain.vmprof")],
        # without the IRQ clock, wake-up and halt-end programs (issue 15's steal causes)
        "vmprof-no-causes": lambda f: ["env", "VMPROF_STEAL_CAUSES=0", sys.executable, "-m", "vmprof_tui", "record",
                                       "-F", str(f), "-o", str(tmp / "n.vmprof")],
    }
    if args.stacks:  # beside plain vmprof, so that the cost of the stacks themselves shows
        conditions["vmprof -g"] = lambda f: [sys.executable, "-m", "vmprof_tui", "record", "--call-graph", "fp",
                                             "-F", str(f), "-o", str(tmp / "r.vmprof")]
        conditions["vmprof -g cfi"] = lambda f: [sys.executable, "-m", "vmprof_tui", "record", "--call-graph", "cfi",
                                                 "-F", str(f), "-o", str(tmp / "c.vmprof")]
    if perf:
        conditions["perf"] = lambda f: [perf, "kvm", "--host", "--guest", "record", "-a", *g, "-F", str(f),
                                        "-o", str(tmp / "perf.data")]
        if args.stacks:
            conditions["perf dwarf"] = lambda f: [perf, "record", "-a", "--call-graph", "dwarf", "-F", str(f),
                                                  "-o", str(tmp / "dwarf.data")]
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
        if args.stacks:
            line += f"; vmprof -g above the floor {cost['vmprof -g'] - cost['floor']:+.2f}%"
            line += f", vmprof -g cfi {cost['vmprof -g cfi'] - cost['floor']:+.2f}%"
            if "perf dwarf" in cost and cost["perf dwarf"]:
                line += f"; cost ratios to perf --call-graph dwarf: vmprof -g cfi " \
                        f"{cost['vmprof -g cfi'] / cost['perf dwarf']:.2f}, --call-graph fp " \
                        f"{cost['vmprof -g'] / cost['perf dwarf']:.2f}"
        if "perf" in cost:
            ours = "vmprof -g" if args.stacks else "vmprof"
            line += f"; {ours}/perf cost ratio {cost[ours] / cost['perf']:.2f}" if cost["perf"] else ""
        print(line, flush=True)
        if args.stacks:
            for mode, name in (("fp", "r.vmprof"), ("cfi", "c.vmprof")):
                print(f"{freq} Hz: {mode}: {bytes_per_sample(tmp / name)}; {report_time(tmp / name)}", flush=True)
    return 0


def bytes_per_sample(path: Path) -> str:
    """On-disk bytes per sample of the last vmprof recording: the sample, stack and stack-map chunks."""
    from vmprof_tui.record import recording

    data = path.read_bytes()
    sizes: dict[str, int] = {}
    pos = len(recording.MAGIC) + 2
    while pos + recording.CHUNK_HEADER.size <= len(data):
        _magic, kind, _res, length, _crc = recording.CHUNK_HEADER.unpack_from(data, pos)
        name = recording.KIND_NAMES.get(kind, str(kind))
        sizes[name] = sizes.get(name, 0) + length + recording.CHUNK_HEADER.size
        pos += recording.CHUNK_HEADER.size + length
    n = len(recording.load(path).samples) or 1
    parts = {k: sizes.get(k, 0) / n for k in ("samples", "stacks", "host stacks", "user stack copies")}
    return (f"vmprof -g recording: {n} samples, {sum(parts.values()):.1f} bytes per sample on disk ("
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()) + ")")


def report_time(path: Path) -> str:
    """Wall time of `vmprof report --children` (every stack resolved, every copy unwound) on a recording."""
    import subprocess
    import time

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "vmprof_tui", "report", str(path), "--children"],
                          capture_output=True, text=True)
    return f"report --children {time.monotonic() - t0:.1f} s" + ("" if proc.returncode == 0 else " (failed)")


if __name__ == "__main__":
    sys.exit(main())
