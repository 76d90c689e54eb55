"""`benchmarks/predict.py --target vm`: the demo's real programs counted natively, predicted onto a demo VM.

Per round, for each program: counted natively on the host (`vmprof predict measure --memory-probe`, the static
binary, in a scratch directory), then run inside a demo VM alone and beside a busy neighbour VM on the same pCPU
(its wall time from first instruction to exit, the VMM's truth), each run just after a probe in the same VM
layout (the cost program's compute and memory loops, their CPU time and the steal share over them).  Costs: the
host's (`predict costs`, the reference for the compute term), the VM's alone and with the neighbour (`predict
costs --vm [--neighbour]`).  Then the self-prediction on the host while another job (a busy loop, started here)
runs on CPU 1: counts, costs (`--without-wait`), probes (`costs --probe`) and actual runs pinned to CPU 0, in
rounds; the condition is predicted with no wait for CPU 0 against each run's wall time less its own wait for CPU
0 (only work outside the condition, other users of the machine, causes that wait), and with the probed wait share
against the raw wall time.  Prints per program predicted, range, actual, error and the steal/wait shares.

    python benchmarks/predict.py --target vm --runs 2               # everything (about 10 minutes)
    python benchmarks/predict.py --target vm --self-only --runs 2   # the loaded self-prediction alone
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vmprof_tui.demo import scenarios, workloads  # noqa: E402
from vmprof_tui.estimate.predict import (  # noqa: E402
    Costs,  # noqa: E402
    estimate,
    load_costs,
    load_counts,
    with_probe,
)
from vmprof_tui.estimate.predict_vm import costs_program, parse_costs, run_in_vm  # noqa: E402

CPU = scenarios.SHARED_CPU  # the VMs' pCPU
SELF_CPU, OTHER_CPU = 0, 1  # self-prediction: the programs on one core, the other job on the other
# fixed work (negative seconds = rounds), about 0.3-1 s of CPU each on the development machine
PROGRAMS = {"gzip": ["-2"], "xz": ["-1", "1"], "sqlite": ["-10"], "lua": ["-25"], "shor": ["143", "-1"]}


def vmprof(*args: str, cwd: Path = ROOT, pin: int | None = None) -> None:
    pre = (lambda: os.sched_setaffinity(0, {pin})) if pin is not None else None
    p = subprocess.run([sys.executable, "-m", "vmprof_tui", *args], cwd=cwd, capture_output=True, text=True,
                       preexec_fn=pre, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise SystemExit(f"vmprof {' '.join(args)} failed: {p.stderr.strip()}")


@contextlib.contextmanager
def other_job() -> Iterator[None]:
    """Another job on the other core: a busy loop pinned there."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {OTHER_CPU}))
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def native_wall(path: Path, args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds of one run pinned to SELF_CPU, and its own run-queue wait (seconds it was runnable but other
    work had the CPU), read from its schedstat while it is a zombie (waitid WNOWAIT), before it is reaped."""
    t0 = time.perf_counter()
    p = subprocess.Popen([str(path), *args], cwd=cwd, stdout=subprocess.DEVNULL,
                         preexec_fn=lambda: os.sched_setaffinity(0, {SELF_CPU}))
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - t0
    try:
        wait = int(Path(f"/proc/{p.pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        wait = 0.0
    if p.wait() != 0:
        raise SystemExit(f"{path.name} failed natively ({p.returncode})")
    return wall, wait


def med(d: dict[str, list[float]]) -> dict[str, float]:
    return {n: statistics.median(v) for n, v in d.items()}


def errors(counts: dict, costs, ref, actual: dict,  # noqa: ANN001
           steal: dict | None = None) -> dict[str, tuple[float, float, float, float, float]]:
    """name -> (predicted, low, high, actual, error %); `steal`: each program's steal share to predict with."""
    out = {}
    for name, c in counts.items():
        est = estimate(c, costs, reference=ref, steal=steal[name] if steal else None)
        act = actual[name]
        out[name] = (est.total_s, est.low_s, est.high_s, act, 100 * (est.total_s - act) / act)
    return out


def show(title: str, rows: dict, steal: float | None = None) -> list[float]:
    print(f"\n{title}" + (f" (steal share of the target while its costs were measured: {100 * steal:.1f}%)"
                           if steal is not None else ""))
    print(f"{'program':8} {'predicted':>10} {'range':>17} {'actual':>8} {'error':>7}")
    for name, (pred, lo, hi, act, err) in rows.items():
        print(f"{name:8} {pred:9.3f}s {lo:7.3f}-{hi:7.3f} s {act:7.3f}s {err:+6.1f}%")
    e = [abs(r[4]) for r in rows.values()]
    worst = max(rows, key=lambda n: abs(rows[n][4]))
    print(f"median absolute error {statistics.median(e):.1f}%, worst {max(e):.1f}% ({worst})")
    return e


def main_vm(runs: int, keep: str | None, self_only: bool = False) -> int:
    t_start = time.monotonic()
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="vmprof-predict-vm-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    paths = {n: workloads.program_path(n) for n in PROGRAMS}
    if not self_only:
        vm_part(runs, work, paths, t_start)
    self_part(runs, work, paths, t_start)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def vm_part(runs: int, work: Path, paths: dict[str, Path], t_start: float) -> None:
    print(f"costs: host (reference), VM alone, VM beside a neighbour ... ({work})", flush=True)
    vmprof("predict", "costs", "-q", "-o", str(work / "host.costs.json"), "--name", "host", "--dir", str(work))
    vmprof("predict", "costs", "-q", "-o", str(work / "vm.costs.json"), "--vm")
    vmprof("predict", "costs", "-q", "-o", str(work / "vmn.costs.json"), "--vm", "--neighbour")
    counted: dict[str, list] = {n: [] for n in PROGRAMS}
    vm_wall: dict[str, dict[str, list[float]]] = {t: {n: [] for n in PROGRAMS} for t in ("alone", "neighbour")}
    vm_steal: dict[str, dict[str, list[float]]] = {t: {n: [] for n in PROGRAMS} for t in ("alone", "neighbour")}
    vm_probe: dict[str, dict[str, list[float]]] = {t: {n: [] for n in PROGRAMS} for t in ("alone", "neighbour")}
    vm_loops: dict[str, dict[str, list[Costs]]] = {t: {n: [] for n in PROGRAMS} for t in ("alone", "neighbour")}
    for r in range(runs):
        for name, args in PROGRAMS.items():
            d = work / f"{name}-{r}"
            d.mkdir(exist_ok=True)
            out = work / f"{name}.{r}.counts.json"
            vmprof("predict", "measure", "--memory-probe", "-o", str(out), "--", str(paths[name]), *args, cwd=d)
            counted[name].append(load_counts(out))
            for t in ("alone", "neighbour"):
                # the target's state now: its two loops for a moment in the same VM layout, just before the run
                # (the cost program's "probe"), their CPU time and the run-queue wait over the probe's life
                probe, text = run_in_vm(costs_program(), ["costs", "1", "300", "probe"], d, t == "neighbour",
                                        "probe")
                share = probe["run_delay_ns"] / probe["wall_ns"]
                vm_probe[t][name].append(share)
                vm_loops[t][name].append(Costs(target={"name": "probe", "probe": True, "costs_exclude_steal": True,
                                                       "vm": {"pcpu": CPU}, "steal_share": share},
                                               costs=parse_costs(text)[1]))
                proc, _ = run_in_vm(paths[name], [name, *args], d, t == "neighbour", f"{name} in the VM")
                vm_wall[t][name].append(proc["wall_ns"] / 1e9)
                vm_steal[t][name].append(proc["run_delay_ns"] / proc["wall_ns"])
        print(f"round {r + 1}/{runs} (counts, VM alone, VM + neighbour) done ({time.monotonic() - t_start:.0f} s)",
              flush=True)
    counts = {n: sorted(c, key=lambda x: x.user_s + x.system_s)[len(c) // 2] for n, c in counted.items()}
    host = load_costs(work / "host.costs.json")
    vm, vmn = load_costs(work / "vm.costs.json"), load_costs(work / "vmn.costs.json")
    costs = {"alone": vm, "neighbour": vmn}

    # the prediction: the steal share probed just before each run; with the costs' own share; and, a
    # diagnostic rather than a prediction, with each run's own steal share (what is left is the model's error)
    probed = {t: errors(counts, costs[t], host, med(vm_wall[t]), med(vm_probe[t])) for t in costs}
    static = {t: errors(counts, costs[t], host, med(vm_wall[t])) for t in costs}
    own = {t: errors(counts, costs[t], host, med(vm_wall[t]), med(vm_steal[t])) for t in costs}
    # the loops probed too (per program the probe of median compute loop; the counts' loops as the reference)
    loops = {t: {n: sorted(v, key=lambda k: k.costs["compute_loop"].median)[len(v) // 2]
                 for n, v in vm_loops[t].items()} for t in costs}
    looped = {t: {n: errors({n: c}, with_probe(costs[t], loops[t][n]), host, med(vm_wall[t]),
                            med(vm_probe[t]))[n] for n, c in counts.items()} for t in costs}

    print(f"\nmeasured in {time.monotonic() - t_start:.0f} s on {os.uname().nodename}; {runs} rounds; counts: the run "
          "of median CPU time; actual: median; compute term: CPU time minus operations at the host's costs × the "
          "guest/host compute-loop ratio (timed interleaved)")
    print("counts (native): " + "; ".join(f"{n} cpu {c.user_s + c.system_s:.3f} s, {c.syscall_total} syscalls, "
                                          f"{c.minor_faults} minflt" for n, c in counts.items()))
    for t, where in (("alone", "onto the VM alone"), ("neighbour", "onto the VM beside a busy neighbour VM")):
        show(f"{where}, with the steal share probed just before each run", probed[t])
        show(f"{where}, with the loops and the steal share probed just before each run", looped[t])
        print(f"steal share probed before / during each program's runs ({t}): " + ", ".join(
            f"{n} {100 * statistics.median(vm_probe[t][n]):.1f}/{100 * statistics.median(v):.1f}%"
            for n, v in vm_steal[t].items()))
        show(f"{where}, with the steal share of its costs' measurement", static[t], costs[t].target["steal_share"])
        show(f"diagnostic ({t}): with each run's own steal share", own[t])
    print("\nVM costs (median ns, alone/neighbour): " + "  ".join(
        f"{k} {vm.costs[k].median * 1e9:.0f}/{vmn.costs[k].median * 1e9:.0f}" for k in vm.costs
        if vm.costs[k].repeat))
    print("compute ratio guest/host: alone " + "-".join(f"{x:.3f}" for x in vm.target["compute_ratio_spread"])
          + ", neighbour " + "-".join(f"{x:.3f}" for x in vmn.target["compute_ratio_spread"]))
    print("breakdown onto the VM alone (s): " + "; ".join(
        f"{n}: " + ", ".join(f"{g} {estimate(c, vm, reference=host).group_s(g):.3f}"
                             for g in ("compute", "syscall", "fault")) for n, c in counts.items()))
    print("memory share (measure --memory-probe): " + ", ".join(f"{n} {100 * c.memory_share:.1f}%"
                                                               for n, c in counts.items()))
    for t, k in costs.items():
        ratio = k.costs["memory_loop"].median / k.target["reference_memory_loop_s"]
        print(f"memory loop guest/host ({t}): {ratio:.3f}")


def self_part(runs: int, work: Path, paths: dict[str, Path], t_start: float) -> None:
    """Self-prediction on the host loaded by another job on the other core."""
    print(f"self-prediction with a busy loop on CPU {OTHER_CPU} ...", flush=True)
    self_counted: dict[str, list] = {n: [] for n in PROGRAMS}
    self_wall: dict[str, list[float]] = {n: [] for n in PROGRAMS}
    self_free: dict[str, list[float]] = {n: [] for n in PROGRAMS}  # wall less the run's own wait for CPU 0
    self_wait: dict[str, list[float]] = {n: [] for n in PROGRAMS}
    self_probe: dict[str, list] = {n: [] for n in PROGRAMS}  # `costs --probe` just before each run
    with other_job():
        vmprof("predict", "costs", "-q", "--without-wait", "-o", str(work / "self.costs.json"), "--name",
               "self-loaded", "--dir", str(work), pin=SELF_CPU)
        for r in range(runs):
            for name, args in PROGRAMS.items():
                d = work / f"{name}-{r}"
                d.mkdir(exist_ok=True)
                out = work / f"{name}.{r}.self.counts.json"
                vmprof("predict", "measure", "--memory-probe", "-o", str(out), "--", str(paths[name]), *args, cwd=d,
                       pin=SELF_CPU)
                self_counted[name].append(load_counts(out))
                vmprof("predict", "costs", "--probe", "-q", "-o", str(work / f"{name}.{r}.probe.json"), pin=SELF_CPU)
                self_probe[name].append(load_costs(work / f"{name}.{r}.probe.json"))
                wall, wait = native_wall(paths[name], args, d)
                self_wall[name].append(wall)
                self_free[name].append(wall - wait)
                self_wait[name].append(wait / wall)
    self_costs = load_costs(work / "self.costs.json")
    scounts = {n: sorted(c, key=lambda x: x.user_s + x.system_s)[len(c) // 2] for n, c in self_counted.items()}
    # the costs are without the wait for CPU 0 (--without-wait): the condition (CPU 0 to the work, the other job
    # on CPU 1) is predicted with no wait, against each run's wall less its own wait for CPU 0, which only work
    # outside the condition (the other helpers on this shared machine) causes; then with the wait share
    # probed just before each run against the raw wall time, what that outside work does to a prediction
    # per program the probe of median compute-loop time: its loops and its wait share replace the costs'
    probe = {n: sorted(v, key=lambda k: k.costs["compute_loop"].median)[len(v) // 2] for n, v in self_probe.items()}
    controlled = {n: errors({n: c}, with_probe(self_costs, probe[n]), self_costs, med(self_free), {n: 0.0})[n]
                  for n, c in scounts.items()}
    self_rows = {n: errors({n: c}, with_probe(self_costs, probe[n]), self_costs, med(self_wall))[n]
                 for n, c in scounts.items()}
    unprobed = errors(scounts, self_costs, self_costs, med(self_free), {n: 0.0 for n in PROGRAMS})
    self_static = errors(scounts, self_costs, self_costs, med(self_wall))

    where = f"self-prediction on the host, a busy loop on CPU {OTHER_CPU}, everything on CPU {SELF_CPU}"
    show(f"{where}: the condition (no wait for CPU {SELF_CPU}), loops probed just before each run, against the "
         "wall time less each run's own wait", controlled)
    show(f"{where}: the same without the probe (the loops of the costs' measurement)", unprobed)
    show(f"{where}, loops and the CPU's wait share probed just before each run, against the wall time", self_rows)
    print("wait share probed before / during each run: " + ", ".join(
        f"{n} {100 * statistics.median(k.target['steal_share'] for k in v):.1f}/"
        f"{100 * statistics.median(self_wait[n]):.1f}%" for n, v in self_probe.items()))
    print("compute loop probed (wait-free, ns): " + ", ".join(
        f"{n} " + "/".join(f"{k.costs['compute_loop'].median * 1e9:.3f}" for k in v) for n, v in self_probe.items()))
    show(f"{where}, with the wait share of its costs' measurement", self_static, self_costs.target["steal_share"])
    print(f"compute loop: costs {self_costs.costs['compute_loop'].median * 1e9:.3f} ns (without wait), counts "
          + ", ".join(f"{n} {c.reference_loop_s * 1e9:.3f}" for n, c in scounts.items()) + " ns (CPU time)")
