"""`vmprof predict` on real programs nobody here wrote: self- and cross-prediction errors.

Programs (inputs generated in a scratch directory on disk): gzip and xz of a generated text
file, sort of a large generated file, a python3 script, sqlite3 queries, and a small C
project built with make.  Each is counted with `vmprof predict measure` (CLI, as a user
would) once per round, and in the same round its real wall time is taken (without counting)
on two machines:

* self: this machine as it is (counts and costs from the same machine);
* target: a slower machine made real here: a cgroup-v1 `cpu` cgroup with a CFS quota
  (--quota of one CPU), pinned to one CPU beside a disturbance (a busy-loop process on the
  same CPU, outside the cgroup).  Costs are measured, and the programs run, inside it.

Prints per program the counts summary, predicted vs actual and the error for each target,
then each target's median and worst absolute error, also with the user CPU time as the
compute term (estimate without --reference) for comparison.  Run as root (BPF, cgroups).
Usage: python benchmarks/predict.py [--runs 3] [--quota 0.4] [--keep DIR]

`--target vm` (paper 004's own setting): the demo's real workloads (gzip, xz, sqlite, lua, shor: static
programs, docs/demo.md) are counted natively on the host and predicted onto a demo VM on the demo guest kernel,
with costs measured inside the VM (`predict costs --vm`), alone and beside a busy neighbour VM on the same pCPU
(`--neighbour`); the actual run time is each program's wall time inside the VM (first instruction to exit,
the VMM's truth).  Then self-prediction on the host while another job (a busy loop) runs on the other core:
counts, costs and actual runs all pinned to the target pCPU.  Counted and actual runs alternate in rounds.
Usage: python benchmarks/predict.py --target vm [--runs 2] [--self-only]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vmprof_tui.estimate.predict import estimate, load_costs, load_counts  # noqa: E402

CGROUP = Path("/sys/fs/cgroup/cpu/vmprof-predict-target")
TARGET_CPU = 1
PY = "/usr/bin/python3"


# ---------------------------------------------------------------------------
# inputs


def words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz", dtype=np.uint8)
    p = np.linspace(2.0, 0.2, len(letters))
    p /= p.sum()
    vocab = []
    for _ in range(n):
        k = int(rng.integers(2, 11))
        vocab.append(bytes(rng.choice(letters, size=k, p=p)).decode())
    return vocab


def make_text(path: Path, mb: int, rng: np.random.Generator) -> None:
    vocab = np.array(words(rng, 20000))
    ranks = np.arange(1, len(vocab) + 1)
    zipf = (1.0 / ranks) / (1.0 / ranks).sum()
    with path.open("w") as f:
        written = 0
        while written < mb << 20:
            w = rng.choice(vocab, size=200_000, p=zipf)
            lines = [" ".join(w[i:i + 12]) for i in range(0, len(w), 12)]
            chunk = "\n".join(lines) + "\n"
            f.write(chunk)
            written += len(chunk)


def make_sort_input(path: Path, lines: int, rng: np.random.Generator) -> None:
    vocab = np.array(words(rng, 50000))
    a = rng.choice(vocab, size=lines)
    b = rng.integers(0, 10**9, size=lines)
    with path.open("w") as f:
        for i in range(0, lines, 100_000):
            f.write("".join(f"{x} {y}\n" for x, y in zip(a[i:i + 100_000], b[i:i + 100_000], strict=True)))


def make_db(path: Path, rows: int, rng: np.random.Generator) -> None:
    vocab = words(rng, 3000)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, value REAL)")
    grp = rng.integers(0, 5000, size=rows)
    val = rng.random(rows)
    names = rng.integers(0, len(vocab), size=rows)
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                    ((i, int(grp[i]), vocab[names[i]], float(val[i])) for i in range(rows)))
    con.commit()
    con.close()


SQL = ("SELECT grp, count(*), avg(value) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3; "
       "SELECT count(*) FROM t a JOIN t b ON a.grp = b.id WHERE a.value > b.value; "
       "SELECT name, sum(value) FROM t GROUP BY name ORDER BY 2 DESC LIMIT 3; "
       "SELECT count(DISTINCT substr(name, 1, 3) || grp) FROM t;")

PY_SCRIPT = """
import collections, json, re, sys
text = open(sys.argv[1]).read(6 << 20)
words = re.findall(r"[a-z]+", text)
common = collections.Counter(words).most_common(50)
pairs = collections.Counter(zip(words, words[1:])).most_common(20)
doc = json.dumps({"common": common, "pairs": [[a, b, n] for (a, b), n in pairs]})
sieve = bytearray([1]) * 2_000_000
for i in range(2, 1415):
    if sieve[i]:
        sieve[i * i::i] = bytearray(len(range(i * i, 2_000_000, i)))
print(len(words), len(doc), sum(sieve) - 2)
"""


def make_c_project(d: Path, files: int = 10) -> None:
    d.mkdir(parents=True, exist_ok=True)
    objs = []
    for k in range(files):
        funcs = []
        for j in range(25):
            funcs.append(f"""
long f{k}_{j}(long n)
{{
\tlong acc = {j};
\tfor (long i = 0; i < n; i++) {{
\t\tacc = acc * {3 + j} + (i ^ {k});
\t\tif (acc % {7 + j} == 0)
\t\t\tacc /= 3;
\t}}
\tswitch (n & 7) {{
\tcase 0: return acc + {j};
\tcase 1: return acc - {k};
\tcase 2: return acc * 2;
\tcase 3: return acc ^ {j * k + 1};
\tdefault: return acc;
\t}}
}}
""")
        (d / f"mod{k}.c").write_text('#include "proj.h"\n#include <stdio.h>\n#include <string.h>\n' + "".join(funcs))
        objs.append(f"mod{k}.o")
    (d / "proj.h").write_text("".join(f"long f{k}_{j}(long n);\n" for k in range(files) for j in range(25)))
    calls = " + ".join(f"f{k}_{j}(argc)" for k in range(files) for j in range(0, 25, 5))
    (d / "main.c").write_text(f'#include "proj.h"\n#include <stdio.h>\nint main(int argc, char **argv)\n'
                              f'{{\n\t(void)argv;\n\tprintf("%ld\\n", {calls});\n\treturn 0;\n}}\n')
    (d / "Makefile").write_text(
        "CFLAGS = -O2 -Wall\nOBJS = main.o " + " ".join(objs) + "\n\n"
        "proj: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n%.o: %.c proj.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\n"
        "clean:\n\trm -f proj *.o\n")


def programs(work: Path) -> dict[str, tuple[list[str], list[str] | None]]:
    """name -> (command, command run before each run to reset state, or None).  Every command
    does the same work each time it runs (measure --repeat relies on it)."""
    return {
        "gzip": (["gzip", "-6", "-k", "-f", str(work / "text32")], None),
        "xz": (["xz", "-1", "-T1", "-k", "-f", str(work / "text12")], None),
        "sort": (["sort", "--parallel=1", "-S", "256M", "-o", str(work / "sorted"), str(work / "lines")], None),
        "python3": ([PY, str(work / "script.py"), str(work / "text32")], None),
        "sqlite3": (["sqlite3", str(work / "db.sqlite"), SQL], None),
        "make": (["make", "-B", "-s", "-j1", "-C", str(work / "proj")], None),  # -B: the whole build every time
    }


# ---------------------------------------------------------------------------
# the target


@contextlib.contextmanager
def target_machine(quota: float) -> Iterator[None]:
    """The cgroup with its quota, and the disturbance beside it on the same CPU."""
    if CGROUP.exists():
        CGROUP.rmdir()
    CGROUP.mkdir()
    period = 100_000
    (CGROUP / "cpu.cfs_period_us").write_text(str(period))
    (CGROUP / "cpu.cfs_quota_us").write_text(str(int(quota * period)))
    busy = subprocess.Popen([PY, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {TARGET_CPU}))
    try:
        yield
    finally:
        busy.kill()
        busy.wait()
        for _ in range(50):
            try:
                CGROUP.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _into_target() -> None:
    (CGROUP / "tasks").write_text(str(os.getpid()))
    os.sched_setaffinity(0, {TARGET_CPU})


def run_timed(cmd: list[str], in_target: bool, cwd: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                       preexec_fn=_into_target if in_target else None)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode()[:300]}")
    return dt


def vmprof(*args: str, in_target: bool = False) -> None:
    p = subprocess.run([sys.executable, "-m", "vmprof_tui", *args], cwd=ROOT, capture_output=True, text=True,
                       preexec_fn=_into_target if in_target else None)
    if p.returncode != 0:
        raise SystemExit(f"vmprof {' '.join(args)} failed: {p.stderr.strip()}")


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="actual runs per program and target (median)")
    ap.add_argument("--quota", type=float, default=0.4, help="the target's CPU quota, in CPUs")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the inputs and JSON files in DIR")
    ap.add_argument("--target", choices=("cgroup", "vm"), default="cgroup",
                    help="cgroup: a CPU quota on the host (default); vm: a demo VM (see above)")
    ap.add_argument("--self-only", action="store_true", help="with --target vm: only the loaded self-prediction")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (BPF counter, cgroups)", file=sys.stderr)
        return 1
    if args.target == "vm":
        from predict_vm_target import main_vm

        return main_vm(args.runs, args.keep, args.self_only)
    t_start = time.monotonic()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vmprof-predict-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(18)
    print(f"inputs in {work} ...", flush=True)
    make_text(work / "text32", 32, rng)
    make_text(work / "text12", 12, rng)
    make_sort_input(work / "lines", 1_500_000, rng)
    (work / "db.sqlite").unlink(missing_ok=True)
    make_db(work / "db.sqlite", 300_000, rng)
    (work / "script.py").write_text(PY_SCRIPT)
    make_c_project(work / "proj")
    progs = programs(work)
    print(f"inputs ready ({time.monotonic() - t_start:.0f} s); costs of this machine ...", flush=True)

    vmprof("predict", "costs", "-q", "-o", str(work / "self.costs.json"), "--name", "self", "--dir", str(work))
    print(f"costs of the target: cgroup quota {args.quota} CPU on CPU {TARGET_CPU} beside a busy loop ...", flush=True)
    with target_machine(args.quota):
        vmprof("predict", "costs", "-q", "-o", str(work / "target.costs.json"), "--name",
               f"quota{args.quota}+busy", "--dir", str(work), "--min-time", "0.5", in_target=True)
    # counted runs and actual runs in the same rounds, the two machines alternating, so that a change of
    # this shared machine's speed (its user CPU times drift by 10-20% over minutes) falls on all of them
    # rather than on the counts alone
    times: dict[str, dict[str, list[float]]] = {t: {n: [] for n in progs} for t in ("self", "target")}
    counted: dict[str, list] = {n: [] for n in progs}
    for r in range(args.runs):
        for name, (cmd, reset) in progs.items():
            if reset:
                run_timed(reset, False, work)
            out = work / f"{name}.{r}.counts.json"
            vmprof("predict", "measure", "-o", str(out), "--", *cmd)
            counted[name].append(load_counts(out))
        for t in ("self", "target"):
            with target_machine(args.quota) if t == "target" else contextlib.nullcontext():
                for name, (cmd, reset) in progs.items():
                    if reset:
                        run_timed(reset, False, work)
                    times[t][name].append(run_timed(cmd, t == "target", work))
        print(f"round {r + 1}/{args.runs} of counted and actual runs done ({time.monotonic() - t_start:.0f} s)",
              flush=True)
    # the counted run of median CPU time
    counts = {n: sorted(c, key=lambda x: x.user_s + x.system_s)[len(c) // 2] for n, c in counted.items()}
    actual = {t: {n: statistics.median(v) for n, v in times[t].items()} for t in times}
    costs = {"self": load_costs(work / "self.costs.json"), "target": load_costs(work / "target.costs.json")}

    ref = costs["self"]  # the machine the counts come from

    print(f"\nmeasured in {time.monotonic() - t_start:.0f} s on {os.uname().nodename} ({os.cpu_count()} CPUs, "
          f"no PMU: compute term = CPU time minus the counted operations at this machine's costs); target = "
          f"cgroup-v1 cfs quota {args.quota} CPU, pinned to CPU {TARGET_CPU} beside a busy loop; counts: the "
          f"run of median CPU time, actual times: median, of {args.runs} rounds\n")
    print(f"{'program':9} {'user s':>7} {'sys s':>6} {'syscalls':>9} {'minflt':>8} {'majflt':>6} {'procs':>5} | "
          f"{'self pred':>9} {'actual':>7} {'error':>7} | {'target pred':>11} {'actual':>7} {'error':>7}")
    errors: dict[str, list[float]] = {"self": [], "target": []}
    user_only: dict[str, list[float]] = {"self": [], "target": []}  # the compute term without --reference
    for name, c in counts.items():
        row = (f"{name:9} {c.user_s:7.3f} {c.system_s:6.3f} {c.syscall_total:9,} {c.minor_faults:8,} "
               f"{c.major_faults:6,} {c.processes_created:5}")
        for t in ("self", "target"):
            pred = estimate(c, costs[t], reference=ref).total_s
            act = actual[t][name]
            err = 100 * (pred - act) / act
            errors[t].append(abs(err))
            user_only[t].append(abs(100 * (estimate(c, costs[t]).total_s - act) / act))
            row += f" | {pred:{9 if t == 'self' else 11}.3f} {act:7.3f} {err:+6.1f}%"
        print(row)
    print("\nspread of the actual runs (min-max s): " + "; ".join(
        f"{n} self {min(times['self'][n]):.3f}-{max(times['self'][n]):.3f}, target "
        f"{min(times['target'][n]):.3f}-{max(times['target'][n]):.3f}" for n in progs))
    print("CPU s (user+system) of the counted runs: " + "; ".join(
        f"{n} " + "/".join(f"{x.user_s + x.system_s:.3f}" for x in cs) for n, cs in counted.items()))
    print()
    for t in ("self", "target"):
        e, u = errors[t], user_only[t]
        print(f"{t:6}: median absolute error {statistics.median(e):.1f}%, worst {max(e):.1f}% ({len(e)} programs); "
              f"with user CPU time as the compute term: median {statistics.median(u):.1f}%, worst {max(u):.1f}%")
    cu = {t: costs[t].costs for t in costs}
    print("\ncosts (median, ns):  " + "  ".join(
        f"{k} {cu['self'][k].median * 1e9:.1f}/{cu['target'][k].median * 1e9:.1f}" for k in cu["self"]) +
        "   (self/target)")
    print("\nbreakdown of the target predictions (s): " + "; ".join(
        f"{n}: " + ", ".join(f"{g} {estimate(c, costs['target'], reference=ref).group_s(g):.3f}"
                             for g in ("compute", "syscall", "fault", "process", "switch"))
        for n, c in counts.items()))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
