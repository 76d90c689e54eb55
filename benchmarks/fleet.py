"""Analysis node capacity: t2 per 60 s window of a 2-CPU host with 5 and 10 VMs, and hosts per node.

Builds 60 s windows in the real recording format (synthetic samples and sched events of N 1-vCPU
VMs sharing the host's CPUs at 1 kHz, with guest bundles so guest code resolves), analyses them with
`vmprof analyze` on an embedded LocalCluster of this machine's cores, and prints t0 (store time,
measured by writing the window), t1, t2 (analysis cost of one window, all its VMs) and the largest n
with t0 + t1 > (t0 + t2/threads) × n (thesis: 4 hosts × 10 VMs per 14-core node; target here: 50 × 10).
With --host64, the windows are instead those of the synthetic 64-CPU host of `benchmarks/scale.py make` (20 VMs
of 4 vCPUs, 3.84M samples a 60 s window; docs/scale.md).
Usage: python benchmarks/fleet.py [--vms 5,10] [--windows 4] [--host64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import make  # noqa: E402
from synth import SynthRecording  # noqa: E402

from vmprof_tui.fleet.analyse import Analyser, find_windows, hosts_per_node  # noqa: E402
from vmprof_tui.record import recording  # noqa: E402
from vmprof_tui.record.recording import BUNDLE  # noqa: E402
from vmprof_tui.record.spool import WINDOW_CODEC  # noqa: E402
from vmprof_tui.record.writer import Writer  # noqa: E402


def store_time(path: Path) -> float:
    """t0: the time to write this window as the agent's writer does (tables, snapshot, end; fsynced, its codec);
    the window analysed is the one so written (its guest bundles kept, as the agent's spool has them)."""
    rec = recording.load(path)
    start = time.monotonic()
    w = Writer(path.with_suffix(".t0"), rec.meta, codec=WINDOW_CODEC)
    w.add(rec.samples, rec.sched)
    w.add_snapshot(rec.snapshot)
    w.close(rec.end or {})
    t0 = time.monotonic() - start
    w = Writer(path.with_suffix(".t0"), rec.meta, codec=WINDOW_CODEC)
    w.add(rec.samples, rec.sched)
    w.add_snapshot(rec.snapshot)
    for vm, data in rec.bundles.items():
        w.chunk(BUNDLE, struct.pack("<H", len(vm.encode())) + vm.encode() + data)
    w.close(rec.end or {})
    os.replace(path.with_suffix(".t0"), path)
    return t0


def build_spool(root: Path, vms: int, windows: int, window_s: float = 60.0) -> list[float]:
    """Windows of a 2-CPU host whose VMs take turns on the CPUs in 10 ms slices; returns their store times."""
    wdir = root / "h1" / "windows"
    wdir.mkdir(parents=True)
    t0s = []
    for w in range(windows):
        b = SynthRecording(frequency=1000, cpus=2)
        handles = [b.vm(f"vm{i}", pid=1000 + 10 * i, vcpus={0: 1001 + 10 * i}) for i in range(vms)]
        slice_ns, t, turn = 10_000_000, 0, 0
        while t < int(window_s * 1e9):
            for cpu in range(2):
                vm = handles[(turn + cpu) % vms]
                b.run(vm, vcpu=0, cpu=cpu, start_ns=t, end_ns=t + slice_ns)
            t += slice_ns
            turn += 2
        path = b.write(wdir / f"W{w + 1:08d}-{1_800_000_000 + int(w * window_s)}.vmprof")
        t0s.append(store_time(path))
    return t0s


def build_host64_spool(root: Path, windows: int, window_s: float = 60.0) -> list[float]:
    """Windows of the synthetic 64-CPU, 20-VM host (scale.py make, another seed each); returns their store times."""
    wdir = root / "h1" / "windows"
    wdir.mkdir(parents=True)
    t0s = []
    for w in range(windows):
        path = wdir / f"W{w + 1:08d}-{1_800_000_000 + int(w * window_s)}.vmprof"
        make(path, cpus=64, vms=20, vcpus=4, seconds=window_s, rate=1000, seed=w + 1)
        t0s.append(store_time(path))
    return t0s


def analyse_spool(tmp: Path, t0s: list[float], label: str, vms: int) -> None:
    with Analyser(tmp / "store", workers=os.cpu_count()) as an:
        results = an.run(find_windows([tmp / "spool"]))
        threads = an.n_threads
    shutil.rmtree(tmp, ignore_errors=True)  # 64-CPU windows: 170 MB each
    t2s = [r.t2_s for r in results if r.error is None]
    t0 = statistics.median(t0s)
    n = min(hosts_per_node(t0, 60.0, t2, threads) for t2 in t2s)
    print(f"{label}: t0 {t0:.3f} s (median), t2 median {statistics.median(t2s):.3f} s, max {max(t2s):.3f} s over "
          f"{len(t2s)} windows; {threads} worker processes: hosts per analysis node n = {n} (n x VMs = {n * vms})",
          flush=True)
    cpu = [getattr(r, "t2_cpu_s", 0.0) for r in results if r.error is None]
    if all(cpu):  # a tree whose tasks report their CPU time: t2 on a node of its own, where load inflates the wall
        n_cpu = min(hosts_per_node(t0, 60.0, t2, threads) for t2 in cpu)
        print(f"  t2 in CPU time of the worker: median {statistics.median(cpu):.3f} s, max {max(cpu):.3f} s: "
              f"n = {n_cpu} on a node of its own", flush=True)
    # a node's steady state: each worker's first window (Dask gives each idle worker one of the first `threads`)
    # imports, and parses the guests' bundles and kallsyms that its later windows of the host reuse
    warm = sorted((r for r in results if r.error is None), key=lambda r: r.ref.seq)[threads:]
    if warm and all(cpu):
        wall, wcpu = [r.t2_s for r in warm], [r.t2_cpu_s for r in warm]
        n_wall, n_wcpu = (min(hosts_per_node(t0, 60.0, t2, threads) for t2 in t2s) for t2s in (wall, wcpu))
        print(f"  warm workers ({len(warm)} windows after each worker's first): t2 median "
              f"{statistics.median(wall):.3f} s, max {max(wall):.3f} s: n = {n_wall}; in CPU time median "
              f"{statistics.median(wcpu):.3f} s, max {max(wcpu):.3f} s: n = {n_wcpu}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vms", default="5,10")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--host64", action="store_true", help="windows of the synthetic 64-CPU, 20-VM host instead")
    args = ap.parse_args()
    if args.host64:
        tmp = Path(tempfile.mkdtemp(prefix="vmprof-fleet-"))
        analyse_spool(tmp, build_host64_spool(tmp / "spool", args.windows), "64 CPUs, 20 VMs x 4 vCPUs, 60 s "
                      "windows at 1 kHz (3.84M samples)", 20)
        return 0
    for vms in (int(v) for v in args.vms.split(",")):
        tmp = Path(tempfile.mkdtemp(prefix="vmprof-fleet-"))
        analyse_spool(tmp, build_spool(tmp / "spool", vms, args.windows),
                      f"{vms} VMs per host, 60 s windows at 1 kHz on 2 CPUs", vms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
