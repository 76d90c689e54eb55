"""002's experiment (Tables 3-4, Fig. 10): a real program's function profile inside a VM against the same
binary run natively.

shor (libquantum) and gzip (zlib), built from Debian's static libraries (docs/demo.md), each run a fixed
amount of work twice on the same pCPU: natively under `perf record`, and in a demo VM on the demo guest
kernel recorded by vmprof (guest level). Printed per program in 002's layout: every function above 1% in
either, its share natively and in the VM, the difference (target: within 2 points); then the run times
(natively: the wall time of a run without perf; in the VM: its vCPU's wall time, from the VMM's ground truth),
the CPU times (natively the process's; in the VM the vCPU thread's, which includes KVM and the VMM serving its
calls: on a shared pCPU the wall times carry other work's waits, the CPU times do not) and their ratios.

    .venv/bin/python benchmarks/native_vs_guest.py [--shor-attempts 8] [--gzip-rounds 30] [-F 4000]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import perf_binary  # noqa: E402

from vmprof_tui.analyse.analysis import analyse  # noqa: E402
from vmprof_tui.collect.session import CollectionSession  # noqa: E402
from vmprof_tui.demo import runner, scenarios, workloads  # noqa: E402
from vmprof_tui.record import recording  # noqa: E402
from vmprof_tui.record.recorder import Recorder  # noqa: E402

CPU = scenarios.SHARED_CPU
REPORT_LINE = re.compile(r"^\s*([0-9.]+)%\s+(?:\S+\s+)?\[[.k]\]\s+(\S+)")


def native(perf: str, program: Path, args: list[str], freq: int, tmp: Path) -> tuple[dict[str, float], float, float]:
    """Function shares (%) of `program` under perf record on CPU, and its wall and CPU time in seconds."""
    data = tmp / f"{program.name}.perf.data"
    subprocess.run(["taskset", "-c", str(CPU), perf, "record", "-q", "-F", str(freq), "-o", str(data), "--",
                    str(program), *args], check=True, cwd=tmp, stdout=subprocess.DEVNULL)
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)  # the run without perf's start-up
    subprocess.run(["taskset", "-c", str(CPU), str(program), *args], check=True, cwd=tmp, stdout=subprocess.DEVNULL)
    wall, c1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    out = subprocess.run([perf, "report", "-i", str(data), "--stdio", "--no-children", "-q", "--sort", "sym",
                          "--comms", program.name, "--percent-limit", "0"], capture_output=True, text=True,
                         check=True).stdout
    shares: dict[str, float] = {}
    for line in out.splitlines():
        m = REPORT_LINE.match(line)
        if m:
            shares[m.group(2)] = shares.get(m.group(2), 0.0) + float(m.group(1))
    return shares, wall, cpu


def guest(program: Path, name: str, args: list[str], freq: int, tmp: Path) -> tuple[dict[str, float], float, float]:
    """Function shares (%) of the program's own samples in a demo VM at guest level, and its vCPU's wall time and
    its vCPU thread's CPU time (the guest's, KVM's and the VMM's serving its calls), in seconds."""
    spec = scenarios.real_vm(name, scenarios.Custom(exec=str(program), args=tuple(args), dir=str(tmp), pin=CPU,
                                                    mem_mb=512))
    out = tmp / f"{name}.vmprof"
    stop = threading.Event()
    recorder = Recorder(out, CollectionSession(freq))
    thread = threading.Thread(target=lambda: recorder.run(None, stop.is_set))
    thread.start()
    recorder.attached.wait(60)
    with runner.DemoRun([spec], duration_s=600) as run:
        run.wait(610)
    stop.set()
    thread.join(60)
    truth = run.truth[name]
    if truth["faults"] or truth["processes"][0]["exit_code"] != 0:
        raise SystemExit(f"{name}: the program did not end cleanly in the VM: {truth['faults']}")
    g = analyse(recording.load(out)).guest_profile(name)
    rows = [r for r in g.rows if r.process == program.name]
    total = sum(r.samples for r in rows) or 1
    shares: dict[str, float] = {}
    for r in rows:
        shares[r.function] = shares.get(r.function, 0.0) + 100 * r.samples / total
    v = truth["vcpus"][0]
    return shares, v["wall_ns"] / 1e9, v["thread_cpu_ns"] / 1e9


def table(name: str, nat: dict[str, float], vm: dict[str, float]) -> int:
    """Print 002's layout for one program; returns how many functions above 1% differ by more than 2 points."""
    funcs = sorted({f for f, s in (*nat.items(), *vm.items()) if s > 1.0}, key=lambda f: -max(nat.get(f, 0),
                                                                                                 vm.get(f, 0)))
    print(f"\n{name}: function shares, native (perf record) vs in the VM (vmprof, guest level)")
    print(f"  {'function':40} {'native %':>9} {'VM %':>9} {'diff':>7}")
    bad = 0
    for f in funcs:
        a, b = nat.get(f, 0.0), vm.get(f, 0.0)
        flag = "" if abs(a - b) <= 2 else "  > 2 points"
        bad += bool(flag)
        print(f"  {f[:40]:40} {a:9.2f} {b:9.2f} {b - a:+7.2f}{flag}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shor-attempts", type=int, default=8)
    ap.add_argument("--gzip-rounds", type=int, default=30)
    ap.add_argument("-F", "--frequency", type=int, default=4000)  # the shares' sampling error well below 2 points
    a = ap.parse_args()
    perf = perf_binary()
    if perf is None:
        print("native_vs_guest: no working perf (apt-get install linux-perf)", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("native_vs_guest: run as root (BPF and the demo VMs)", file=sys.stderr)
        return 1
    os.sched_setaffinity(0, {0})  # the recorder and the VMM's main thread away from the measured pCPU
    runs = {"shor": ["143", str(-a.shor_attempts)], "gzip": [str(-a.gzip_rounds)]}
    bad = 0
    times = []
    with tempfile.TemporaryDirectory(prefix="vmprof-nvg-") as tmp:
        for name, args in runs.items():
            program = workloads.program_path(name)
            nat, t_nat, c_nat = native(perf, program, args, a.frequency, Path(tmp))
            vm, t_vm, c_vm = guest(program, f"nvg-{name}", args, a.frequency, Path(tmp))
            bad += table(name, nat, vm)
            times.append((name, t_nat, t_vm, c_nat, c_vm))
    print("\nrun time of the same work (s): wall (with whatever else the pCPU ran) and CPU time")
    print(f"  {'program':10} {'native':>9} {'in the VM':>10} {'ratio':>7}   {'CPU native':>10} {'in the VM':>10} "
          f"{'ratio':>7}")
    for name, t_nat, t_vm, c_nat, c_vm in times:
        print(f"  {name:10} {t_nat:9.2f} {t_vm:10.2f} {t_vm / t_nat:7.2f}   {c_nat:10.2f} {c_vm:10.2f} "
              f"{c_vm / c_nat:7.2f}")
    print(f"\nfunctions above 1% more than 2 points apart: {bad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
