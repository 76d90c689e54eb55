"""CPU time of vmprof's own BPF programs while it records, per program, from the kernel's BPF statistics.

The interleaved work-rate comparison of benchmarks/overhead.py is the end-to-end figure, but on a loaded
2-CPU machine its spread is larger than the cost of a few tracepoint programs.  This measures those
programs directly: with ``kernel.bpf_stats_enabled`` on (restored afterwards) the kernel counts each
program's runs and run time; two readings of ``bpftool prog show`` a few seconds apart, taken once the
recording's programs are attached, give each program's share of CPU time.  It reports the sampler,
the sched_switch program, and the steal-cause programs (IRQ clock, wake-ups, halt ends) of issue 15.
The run time excludes the tracepoint's own entry into BPF (tens of ns a call).

With --baseline TREE the same is measured for another checkout (its vmprof_tui run by PYTHONPATH), in
alternate rounds, and the ns per run of each group is compared; --switch-load runs `perf bench sched
pipe` through the measured seconds, so that sched_switch runs mostly for switches it does not record.

Usage (root): python benchmarks/bpf_programs.py [--frequencies 1000,10000] [--seconds 4]
              [--baseline TREE --rounds 3] [--switch-load]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
CAUSES = ("irq_handler", "softirq", "local_timer", "reschedule", "call_function", "irq_work", "sched_wakeup",
          "kvm_vcpu_wakeup")


def programs() -> dict[int, dict]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return {p["id"]: p for p in json.loads(out)}


def group(name: str) -> str:
    if name == "on_sample":
        return "sampler"
    if name.endswith("sched_switch"):
        return "sched_switch"
    return "steal causes" if any(c in name for c in CAUSES) else ""


def measure(freq: int, seconds: float, out: Path, tree: Path | None = None,
            switch_load: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """ms of CPU per second and ns per run, by group, of the programs of one recording."""
    before_ids = set(programs())
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    rec = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "record", "-q", "-F", str(freq), "-o", str(out), "--",
                            sys.executable, "-m", "vmprof_tui", "demo", "-s", "alone", "-d", str(seconds + 30),
                            "--no-tui"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree)
    load = None
    try:
        deadline = time.monotonic() + 60
        while True:  # ready: this recording's steal-cause programs are attached
            mine = {i: p for i, p in programs().items() if i not in before_ids and group(p.get("name", ""))}
            if any(group(p["name"]) == "steal causes" for p in mine.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # past the start of the demo VM
        if switch_load:
            load = subprocess.Popen(["perf", "bench", "sched", "pipe", "-l", "100000000"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = {i: p for i, p in programs().items() if i in mine}
        time.sleep(seconds)
        last = {i: p for i, p in programs().items() if i in mine}
    finally:
        if load:
            load.kill()
            load.wait()
        rec.send_signal(2)
        rec.wait(60)
    ms_per_s: dict[str, float] = {}
    ns_runs: dict[str, list[int]] = {}
    for i, p in last.items():
        ns = p.get("run_time_ns", 0) - first.get(i, {}).get("run_time_ns", 0)
        runs = p.get("run_cnt", 0) - first.get(i, {}).get("run_cnt", 0)
        g = group(p["name"])
        ms_per_s[g] = ms_per_s.get(g, 0.0) + ns / 1e6 / seconds
        total = ns_runs.setdefault(g, [0, 0])
        total[0] += ns
        total[1] += runs
        print(f"  {tree or 'this tree'} {freq} Hz {p['name']:<44} {runs / seconds:9.0f} runs/s "
              f"{ns / 1e6 / seconds:7.3f} ms/s {ns / max(runs, 1):6.0f} ns/run")
    return ms_per_s, {g: ns / max(runs, 1) for g, (ns, runs) in ns_runs.items()}


def compare(freq: int, seconds: float, tmp: Path, baseline: Path, rounds: int, switch_load: bool) -> None:
    """ns per run of each group, this tree against the baseline's, in alternate rounds (medians)."""
    per_run: dict[str, dict[str, list[float]]] = {"baseline": {}, "this tree": {}}
    for _ in range(rounds):
        for name, tree in (("baseline", baseline), ("this tree", None)):
            for g, ns in measure(freq, seconds, tmp / "r.vmprof", tree, switch_load)[1].items():
                per_run[name].setdefault(g, []).append(ns)
    for g in ("sampler", "sched_switch", "steal causes"):
        old, new = (statistics.median(per_run[n].get(g) or [0.0]) for n in ("baseline", "this tree"))
        print(f"{freq} Hz {g}: {new:.0f} ns per run against {old:.0f} in {baseline} "
              f"({new / old if old else float('nan'):.2f}x)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frequencies", default="1000,10000")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--baseline", type=Path, help="another checkout to compare ns per run with")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: alternate rounds of each tree")
    ap.add_argument("--switch-load", action="store_true", help="run `perf bench sched pipe` while measuring")
    args = ap.parse_args()
    was = STATS.read_text().strip()
    STATS.write_text("1")
    try:
        with tempfile.TemporaryDirectory(prefix="vmprof-bench-") as tmp:
            for freq in (int(f) for f in args.frequencies.split(",")):
                if args.baseline:
                    compare(freq, args.seconds, Path(tmp), args.baseline.resolve(), args.rounds, args.switch_load)
                    continue
                g, _ = measure(freq, args.seconds, Path(tmp) / "r.vmprof", switch_load=args.switch_load)
                cpus = len(os.sched_getaffinity(0))
                print(f"{freq} Hz: CPU time of vmprof's BPF programs, ms per second of the whole machine "
                      f"({cpus} CPUs): sampler {g.get('sampler', 0):.2f}, sched_switch {g.get('sched_switch', 0):.2f}, "
                      f"steal causes {g.get('steal causes', 0):.2f} "
                      f"(= {100 * g.get('steal causes', 0) / 1000 / cpus:.3f}% of the machine)")
    finally:
        STATS.write_text(was)
    return 0


if __name__ == "__main__":
    sys.exit(main())
