"""What `record -g` costs by mode: the sampler's time per sample, the recorder's CPU, bytes per sample on disk.

For each of `--call-graph fp` and `cfi` (twice each, interleaved) while a Python loop keeps one CPU busy:
`vmprof record -F HZ` of the whole host; once its BPF program is loaded, SECONDS of its `on_sample` run time
(kernel.bpf_stats_enabled, set for the run and put back after), the recorder's user+system CPU, and the
recording's size per sample.  Usage: python benchmarks/callgraph_cost.py [--frequency 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
BUSY = "import time\nend = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < end: sum(range(1000))"


def programs() -> dict[int, tuple[str, int, int]]:
    """Every loaded BPF program: id -> (name, run time ns, runs)."""
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, timeout=60).stdout
    return {p["id"]: (p.get("name", ""), p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in json.loads(out or "[]")}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, freq: int, seconds: float, out: Path) -> str:
    from vmprof_tui.record import recording

    before = set(programs())
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "record", "-q", "--call-graph", mode, "-F", str(freq),
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        ours: list[int] = []
        while not ours:  # its sampler is loaded (compiling takes seconds)
            if time.monotonic() > deadline or proc.poll() is not None:
                return f"{mode}: the recorder did not start"
            time.sleep(0.2)
            ours = [i for i, (name, _t, _n) in programs().items() if i not in before and name == "on_sample"]
        if len(ours) > 1:
            return f"{mode}: another recorder started at the same time; run again"
        p0, c0, t0 = programs()[ours[0]], cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        p1, c1, t1 = programs()[ours[0]], cpu_s(proc.pid), time.monotonic()
    finally:
        proc.send_signal(2)
        proc.wait(timeout=120)
    runs, ns = p1[2] - p0[2], p1[1] - p0[1]
    rec = recording.load(out)
    n = max(len(rec.samples), 1)
    lost = {k: sum(v) for k, v in rec.end.get("lost", {}).items()}
    line = (f"{mode:3s} {freq} Hz: sampler {ns / max(runs, 1):.0f} ns a sample ({runs / (t1 - t0):.0f}/s, "
            f"{100 * ns / 1e9 / (t1 - t0):.2f}% of a CPU); recorder {100 * (c1 - c0) / (t1 - t0):.1f}% of a CPU; "
            f"{out.stat().st_size / n:.0f} bytes a sample on disk ({n} samples); lost {lost}")
    out.unlink()
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frequency", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vmprof-cg-"))
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(10 * (args.seconds + 60))])
    was = STATS.read_text().strip()
    STATS.write_text("1")
    try:
        for mode in ("fp", "cfi", "fp", "cfi"):
            print(measure(mode, args.frequency, args.seconds, tmp / f"{mode}.vmprof"), flush=True)
    finally:
        STATS.write_text(was)
        busy.kill()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
