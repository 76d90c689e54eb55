"""vmprof predict (paper 004): exact counts of a known program, exact estimate arithmetic,
one clear line for every user error.  Runs as root (the syscall counter is BPF)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_root, vmprof
from vmprof_tui.estimate import cost_code
from vmprof_tui.estimate import predict as P
from vmprof_tui.estimate.syscall_names import syscall_name, syscall_names

KNOWN = ROOT / "tests/native/predict_known.c"


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("predict")
    dyn, static = d / "predict_known", d / "predict_known_static"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(dyn), str(KNOWN)], check=True)
    subprocess.run(["gcc", "-O2", "-static", "-o", str(static), str(KNOWN)], check=True)
    return {"dir": d, "dynamic": dyn, "static": static}


def _measure(out: Path, *cmd: str, extra: tuple[str, ...] = ()) -> dict:
    require_root()
    r = vmprof("predict", "measure", "-o", str(out), *extra, "--", *cmd)
    assert r.returncode == 0, r.stderr
    c = json.loads(out.read_text())
    c["stdout"] = r.stdout  # the command's output, then vmprof's summary line
    return c


def test_known_program_counts_are_exact(known: dict[str, Path]) -> None:
    n, pages, forks, writes = 1000, 300, 3, 50
    c = _measure(known["dir"] / "k.json", str(known["dynamic"]), str(n), str(pages), str(forks), str(writes))
    sc = c["syscalls"]
    # each getppid goes through syscall(2): N in the parent, one in each child
    assert sc["getppid"]["calls"] == n + forks
    # pwrite64 is used by nothing else (the loader reads with pread64, stdio writes with write)
    assert sc["pwrite64"]["calls"] == writes
    assert sc["pwrite64"]["bytes"] == writes * 1000
    # glibc's fork() is one clone; the command's own exec is counted (the launcher's only call after
    # registration), and nothing else of the launcher is
    assert sc.get("clone", {}).get("calls", 0) + sc.get("clone3", {}).get("calls", 0) == forks
    assert sc["execve"]["calls"] == 1
    assert c["processes"] == {"created": forks, "threads": 0}
    assert c["exit_status"] == 0
    assert c["compute"]["method"] in (P.COMPUTE_USER_CPU, P.COMPUTE_PMU)
    # the pages touched are part of the tree's minor faults (the rest: loader, libc, stacks, children)
    assert c["faults"]["minor"] >= pages


def test_minor_faults_of_touched_pages(known: dict[str, Path]) -> None:
    """Touching P fresh pages (huge pages refused) is exactly P minor faults: the program reads its
    own fault count around the loop.  The tree's total is those P plus the faults of starting and
    ending the process (loader, libc, stack, stdio), which vary by a few between two starts (ASLR
    places stack, heap and mappings differently against page and fault-around boundaries): the
    difference of two runs is P within that jitter."""
    pages = 2000
    base = _measure(known["dir"] / "f0.json", str(known["dynamic"]), "10", "0", "0", "0")
    more = _measure(known["dir"] / "f1.json", str(known["dynamic"]), "10", str(pages), "0", "0")
    assert f"touch_faults {pages}\n" in more["stdout"]
    assert more["faults"]["minor"] >= pages
    diff = more["faults"]["minor"] - base["faults"]["minor"]
    assert abs(diff - pages) <= 20, diff
    # fresh anonymous pages are never major faults (a few major faults of the loader's files can come
    # from a cold page cache on a fresh machine: 2 were seen in CI)
    assert more["faults"]["major"] < pages // 100


def test_ptrace_single_step_is_exact(known: dict[str, Path]) -> None:
    """--instructions ptrace equals the project's independent single-step tracer (lbr.groundtruth)
    on a static program; with children, theirs are added."""
    from vmprof_tui.lbr import groundtruth

    argv = [str(known["static"]), "5", "3", "0", "2"]
    c = _measure(known["dir"] / "p.json", *argv, extra=("--instructions", "ptrace"))
    truth = groundtruth.trace(argv[0], argv=argv)
    assert c["compute"]["method"] == P.COMPUTE_PTRACE
    # predict counts a rep string instruction per iteration, as its time goes (docs/predict.md); the ground truth
    # lists it once, as the PMU counts it, and counts the further iterations in its steps
    # equal but for a few single-step traps the platform did not deliver (seen once in a CI run of the suite:
    # 40,332 against 40,335; never in runs of this test alone): within 0.01%
    assert abs(c["compute"]["instructions"] - truth.steps) <= 1e-4 * truth.steps and truth.steps >= len(truth.rips)
    c2 = _measure(known["dir"] / "p2.json", *argv[:3], "2", "2", extra=("--instructions", "ptrace"))
    assert c2["compute"]["instructions"] > c["compute"]["instructions"]
    assert c2["syscalls"]["getppid"]["calls"] == 5 + 2


def _costs_json(**over: float) -> dict:
    med = {"compute_loop": 1e-9, "null_syscall": 100e-9, "open_close": 1100e-9, "read_4k": 500e-9,
           "read_64k": 6500e-9, "write_4k": 900e-9, "write_64k": 4500e-9, "mmap_munmap": 2100e-9,
           "fork_exit": 50e-6, "fork_exec_exit": 130e-6, "minor_fault": 1e-6, "major_fault": 80e-6,
           "context_switch": 2e-6}
    med.update(over)
    return {"format": P.COSTS_FORMAT, "version": 1, "target": {"name": "synthetic"},
            "costs": {k: {"median_s": v, "min_s": v, "max_s": v, "repeat": 1} for k, v in med.items()}}


def _counts_json() -> dict:
    return {"format": P.COUNTS_FORMAT, "version": 1, "command": ["prog"], "exit_status": 0,
            "time": {"wall_s": 3.0, "user_s": 2.0, "system_s": 0.5},
            "compute": {"method": P.COMPUTE_USER_CPU, "instructions": None, "user_cpu_s": 2.0},
            "syscalls": {"read": {"nr": 0, "calls": 100, "bytes": 409600},
                         "write": {"nr": 1, "calls": 10, "bytes": 40960},
                         "openat": {"nr": 257, "calls": 20, "bytes": 0}, "close": {"nr": 3, "calls": 20, "bytes": 0},
                         "execve": {"nr": 59, "calls": 3, "bytes": 0}, "clone": {"nr": 56, "calls": 2, "bytes": 0},
                         "wait4": {"nr": 61, "calls": 2, "bytes": 0}, "mmap": {"nr": 9, "calls": 30, "bytes": 0},
                         "futex": {"nr": 202, "calls": 7, "bytes": 0}},
            "faults": {"minor": 1000, "major": 4}, "context_switches": {"voluntary": 50, "involuntary": 9},
            "processes": {"created": 2, "threads": 0},
            "reference": {"host": "ref", "compute_loop_s": 0.5e-9}}


def test_estimate_is_exact_arithmetic(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(_counts_json()))
    (tmp_path / "k.json").write_text(json.dumps(_costs_json()))
    est = P.estimate(P.load_counts(tmp_path / "c.json"), P.load_costs(tmp_path / "k.json"))
    # read: per byte (6500-500)/(65536-4096) ns, per call 500 - 4096 * that
    rb = 6000e-9 / 61440
    rc = 500e-9 - 4096 * rb
    wb = 3600e-9 / 61440
    wc = 900e-9 - 4096 * wb
    expected = {
        "compute": 2.0 * (1e-9 / 0.5e-9),
        "syscall": (100 * rc + 409600 * rb) + (10 * wc + 40960 * wb) + 20 * 1000e-9 + 20 * 100e-9
        + 3 * 80e-6 + 30 * 2000e-9 + 7 * 100e-9,  # clone and wait4: in the process term
        "fault": 1000 * 1e-6 + 4 * 80e-6,
        "process": 2 * 50e-6,
        "switch": 50 * 2e-6,  # voluntary only
    }
    for g, v in expected.items():
        assert est.group_s(g) == pytest.approx(v, rel=1e-12), g
    assert est.total_s == pytest.approx(sum(expected.values()), rel=1e-12)
    assert est.fallback_s == pytest.approx(7 * 100e-9, rel=1e-12)  # futex: not measured
    # the instructions method: instructions x loop time / 4
    c = _counts_json()
    c["compute"] = {"method": P.COMPUTE_PMU, "instructions": 8_000_000_000, "user_cpu_s": 2.0}
    (tmp_path / "c2.json").write_text(json.dumps(c))
    est2 = P.estimate(P.load_counts(tmp_path / "c2.json"), P.load_costs(tmp_path / "k.json"))
    assert est2.group_s("compute") == pytest.approx(8e9 * 1e-9 / 4, rel=1e-12)
    # with the reference's costs (here the same file): user + system time minus the operations at those
    # costs (major faults left in: a wait), × the loop ratio; the other terms are unchanged
    est3 = P.estimate(P.load_counts(tmp_path / "c.json"), P.load_costs(tmp_path / "k.json"),
                      reference=P.load_costs(tmp_path / "k.json"))
    explained = sum(v for g, v in expected.items() if g != "compute") - 4 * 80e-6
    assert est3.group_s("compute") == pytest.approx((2.5 - explained) * 2, rel=1e-12)
    assert est3.total_s - est3.group_s("compute") == pytest.approx(est.total_s - est.group_s("compute"), rel=1e-12)
    r = vmprof("predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "k.json"),
               "--costs", str(tmp_path / "k.json"), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["targets"][0]["predicted_s"] == pytest.approx(est.total_s, rel=1e-12)
    r = vmprof("predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "k.json"))
    assert r.returncode == 0 and "predicted" in r.stdout and "fallback" in r.stdout


def test_estimate_with_a_memory_share_is_exact_arithmetic(tmp_path: Path) -> None:
    """A share m of the compute CPU time scales with the memory loop, the rest with the compute loop; fcntl is
    charged its own cost where the target has one."""
    c = _counts_json()
    c["reference"] |= {"memory_loop_s": 20e-9, "memory": {"share": 0.25}}
    c["syscalls"]["fcntl"] = {"nr": 72, "calls": 11, "bytes": 0}
    (tmp_path / "c.json").write_text(json.dumps(c))
    k = _costs_json(memory_loop=50e-9, fcntl=300e-9)
    (tmp_path / "k.json").write_text(json.dumps(k))
    counts, costs = P.load_counts(tmp_path / "c.json"), P.load_costs(tmp_path / "k.json")
    est = P.estimate(counts, costs)
    assert est.group_s("compute") == pytest.approx(2.0 * (0.75 * 1e-9 / 0.5e-9 + 0.25 * 50e-9 / 20e-9), rel=1e-12)
    fcntl = [t for t in est.terms if t.name == "fcntl"]
    assert fcntl[0].seconds == pytest.approx(11 * 300e-9, rel=1e-12) and not fcntl[0].fallback
    # without a memory loop in the costs (an older file) or a share in the counts: the compute loop alone
    del k["costs"]["memory_loop"]
    (tmp_path / "old.json").write_text(json.dumps(k))
    assert P.estimate(counts, P.load_costs(tmp_path / "old.json")).group_s("compute") == pytest.approx(4.0, rel=1e-12)
    r = vmprof("predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "k.json"))
    assert r.returncode == 0 and "memory-bound part" in r.stdout, r.stderr
    c["reference"]["memory"]["share"] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(c))
    assert "reference.memory.share" in _one_line_failure(vmprof(
        "predict", "estimate", str(tmp_path / "bad.json"), "--costs", str(tmp_path / "k.json")))


def test_probe_replaces_the_loops_and_the_wait_share(tmp_path: Path) -> None:
    """estimate --probe: the loops and wait share of `costs --probe` (just before a run) replace the costs', exact
    arithmetic; a real probe runs in under a second; costs with the wait in them are refused in one line."""
    c = _counts_json()
    c["reference"] |= {"memory_loop_s": 20e-9, "memory": {"share": 0.25}}
    (tmp_path / "c.json").write_text(json.dumps(c))
    k = _costs_json(memory_loop=50e-9)
    k["target"] |= {"costs_exclude_steal": True, "steal_share": 0.2}
    (tmp_path / "k.json").write_text(json.dumps(k))
    probe = {"format": P.COSTS_FORMAT, "version": 1,
             "target": {"name": "now", "probe": True, "costs_exclude_steal": True, "steal_share": 0.5},
             "costs": {"compute_loop": {"median_s": 2e-9, "min_s": 2e-9, "max_s": 2e-9, "repeat": 3},
                       "memory_loop": {"median_s": 40e-9, "min_s": 40e-9, "max_s": 40e-9, "repeat": 3}}}
    (tmp_path / "p.json").write_text(json.dumps(probe))
    counts, costs = P.load_counts(tmp_path / "c.json"), P.load_costs(tmp_path / "k.json")
    base = P.estimate(counts, costs)
    est = P.estimate(counts, P.with_probe(costs, P.load_costs(tmp_path / "p.json")))
    assert est.group_s("compute") == pytest.approx(2.0 * (0.75 * 2e-9 / 0.5e-9 + 0.25 * 40e-9 / 20e-9) / 0.5,
                                                   rel=1e-12)
    ops = base.total_s - base.group_s("compute")  # at 1 / (1 - 0.2); with the probe's share 1 / (1 - 0.5)
    assert est.total_s - est.group_s("compute") == pytest.approx(ops * 0.8 / 0.5, rel=1e-12)
    assert est.steal_share == 0.5
    r = vmprof("predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "k.json"),
               "--probe", str(tmp_path / "p.json"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["targets"][0]["predicted_s"] == pytest.approx(est.total_s, rel=1e-12)
    # a real probe: both loops and the wait share, on the wait-free clock
    r = vmprof("predict", "costs", "--probe", "-q", "-o", str(tmp_path / "now.json"))
    assert r.returncode == 0, r.stderr
    now = P.load_costs(tmp_path / "now.json")
    assert set(now.costs) == set(P.PROBE_COSTS) and 0 <= now.target["steal_share"] < 1
    assert now.costs["memory_loop"].median > now.costs["compute_loop"].median
    (tmp_path / "wall.json").write_text(json.dumps(_costs_json()))
    assert "--without-wait" in _one_line_failure(vmprof(
        "predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "wall.json"),
        "--probe", str(tmp_path / "now.json")))
    k["target"]["vm"] = {"pcpu": 1}  # a demo VM's costs: a host's probe is of another target
    (tmp_path / "vm.json").write_text(json.dumps(k))
    assert "different targets" in _one_line_failure(vmprof(
        "predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "vm.json"),
        "--probe", str(tmp_path / "now.json")))
    assert "not one from costs --probe" in _one_line_failure(vmprof(
        "predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "k.json"),
        "--probe", str(tmp_path / "k.json")), 2)


def test_memory_probe_tells_a_pointer_chase_from_arithmetic(tmp_path: Path) -> None:
    """measure --memory-probe: a program chasing pointers through the memory loop's working set has a memory share,
    one doing arithmetic in registers none.  How much of the chase the probe finds moves with the state of the L3,
    which this machine shares with the physical host's other tenants (0.09-0.87 measured here, docs/predict.md):
    what the probe guarantees is the separation, not the size of the chase's share."""
    src = tmp_path / "p.c"
    src.write_text("""#include <stdlib.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    long n = 1L << 22, sum = 0;
    if (argc > 1) { /* a random cycle through 4 MiB of cache lines */
        long lines = (4L << 20) / 64, *order = malloc(lines * sizeof(long));
        long *next = mmap(0, 4L << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(next, 4L << 20, MADV_NOHUGEPAGE); /* small pages, as the loop's */
        unsigned long x = 12345;
        for (long i = 0; i < lines; i++) order[i] = i;
        for (long i = lines - 1; i > 0; i--) {
            x = x * 6364136223846793005UL + 1;
            long j = (x >> 33) % i, t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (long i = 0; i < lines; i++) next[order[i] * 8] = order[(i + 1) % lines] * 8;
        long p = 0;
        for (long i = 0; i < n; i++) p = next[p];
        return (int)(p & 1);
    }
    for (long i = 0; i < n * 60; i++) sum = sum * 3 + i;
    return (int)(sum & 1) * 0;
}
""")
    prog = tmp_path / "p"
    subprocess.run(["gcc", "-O1", "-o", str(prog), str(src)], check=True)
    chase = _measure(tmp_path / "chase.json", str(prog), "chase", extra=("--memory-probe",))
    arith = _measure(tmp_path / "arith.json", str(prog), extra=("--memory-probe",))
    m_chase, m_arith = chase["reference"]["memory"], arith["reference"]["memory"]
    assert m_chase["loop_slowdown"] > 1.05  # the neighbour does evict the loop's lines
    assert m_chase["share"] > 0.05 > 0.01 > m_arith["share"], (m_chase, m_arith)
    assert chase["reference"]["memory_loop_s"] > 0 and P.load_counts(tmp_path / "chase.json").memory_share > 0.05


def _one_line_failure(r: subprocess.CompletedProcess, code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmprof: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_user_errors_give_one_line(tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "x.json"
    line = _one_line_failure(vmprof("predict", "measure", "-o", str(out), "--", "no-such-command-xyz", "a"))
    assert line == "vmprof: predict measure: command not found: no-such-command-xyz"
    text = tmp_path / "notes.txt"
    text.write_text("not a program\n")
    text.chmod(0o644)
    line = _one_line_failure(vmprof("predict", "measure", "-o", str(out), "--", str(text)))
    assert line == f"vmprof: predict measure: not an executable file: {text}"
    text.chmod(0o755)  # executable, but neither ELF nor script: the exec itself fails
    line = _one_line_failure(vmprof("predict", "measure", "-o", str(out), "--", str(text)))
    assert line == f"vmprof: predict measure: cannot execute {text}: Exec format error"
    _one_line_failure(vmprof("predict", "measure", "-o", str(out)), code=2)
    # a command that fails: counts are written, with its status, and a note
    r = vmprof("predict", "measure", "-o", str(out), "--", "sh", "-c", "exit 3")
    assert r.returncode == 0 and "status 3" in r.stderr
    assert json.loads(out.read_text())["exit_status"] == 3
    costs = tmp_path / "k.json"
    costs.write_text(json.dumps(_costs_json()))
    bad = tmp_path / "bad.json"
    for text, what in (("{not json", "not JSON"), ('{"format": "other"}', "not a vmprof predict counts"),
                       (json.dumps({**_counts_json(), "version": 9}), "version 9"),
                       (json.dumps({**_counts_json(), "faults": {"minor": -1, "major": 0}}), "faults.minor"),
                       (json.dumps({**_counts_json(), "time": {"wall_s": "x"}}), "time.wall_s")):
        bad.write_text(text)
        assert what in _one_line_failure(vmprof("predict", "estimate", str(bad), "--costs", str(costs)))
    k = _costs_json()
    del k["costs"]["major_fault"]
    bad.write_text(json.dumps(k))
    (tmp_path / "c.json").write_text(json.dumps(_counts_json()))
    assert "major_fault" in _one_line_failure(vmprof("predict", "estimate", str(tmp_path / "c.json"),
                                                     "--costs", str(bad)))
    assert "no such file" in _one_line_failure(vmprof("predict", "estimate", str(tmp_path / "nope.json"),
                                                      "--costs", str(costs)))
    _one_line_failure(vmprof("predict", "estimate", str(tmp_path / "c.json")), code=2)


def test_costs_run_and_parse(tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    r = vmprof("predict", "costs", "-q", "-o", str(out), "--repeat", "2", "--min-time", "0.02",
               "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    c = P.load_costs(out)
    m = {k: v.median for k, v in c.costs.items()}
    assert m["fork_exec_exit"] > m["fork_exit"] > m["null_syscall"]
    assert m["read_64k"] > m["read_4k"] and m["major_fault"] > m["minor_fault"]
    assert not list(tmp_path.glob("vmprof-costs-*"))  # scratch files removed
    # the memory loop (a load misses the L1) and a durable write (a wait for the disk) are measured too
    assert m["memory_loop"] > m["compute_loop"] and m["write_sync"] > m["write_4k"]
    assert "costs_exclude_steal" not in c.target  # wall time: the wait is in the costs
    assert "--without-wait is for a host" in _one_line_failure(vmprof(
        "predict", "costs", "--vm", "--without-wait", "-o", str(out)), 2)


def test_costs_without_wait_leave_out_a_neighbours_share_of_the_cpu() -> None:
    """A busy process on the same CPU takes about half of it: the wall-time loop doubles, the wait-free one does not
    (the neighbour's share is the costs' steal share instead, a term of its own)."""
    import os
    import time

    from vmprof_tui.estimate import predict_costs as C

    cpu = min(os.sched_getaffinity(0))
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    busy = subprocess.Popen(["python3", "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        cpu_time = C.time_compute_loop(3, 0.2, cpu_time=True).median
        wall = C._loop_cost(C.snippets().compute_loop, (), 3, 0.2, check=False, clock=time.perf_counter).median
        free = C._loop_cost(C.snippets().compute_loop, (), 3, 0.2, check=False, clock=C.wait_free_clock).median
    finally:
        busy.kill()
        busy.wait()
        os.sched_setaffinity(0, old)
    assert wall > 1.5 * cpu_time  # the neighbour's share is in the wall time
    assert 0.8 < free / cpu_time < 1.25  # and not in the wait-free time


def test_machine_code_matches_its_source(tmp_path: Path) -> None:
    """The embedded bytes are the assembly in predict_costs (binutils come with gcc)."""
    for name, asm, code in (("snippets", cost_code.SNIPPETS_ASM, cost_code.SNIPPETS_CODE),
                            ("forker", cost_code.FORKER_ASM, cost_code.FORKER_CODE)):
        src, obj, binary = tmp_path / f"{name}.s", tmp_path / f"{name}.o", tmp_path / f"{name}.bin"
        src.write_text(asm)
        subprocess.run(["as", "-o", str(obj), str(src)], check=True)
        subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(obj), str(binary)], check=True)
        assert binary.read_bytes() == code, name
    syms = subprocess.run(["nm", str(tmp_path / "snippets.o")], capture_output=True, text=True, check=True).stdout
    offsets = {line.split()[2]: int(line.split()[0], 16) for line in syms.splitlines()}
    assert offsets == cost_code.SNIPPETS


def test_syscall_names_from_the_machine() -> None:
    names = syscall_names()
    assert names[0] == "read" and names[110] == "getppid" and names[59] == "execve"
    assert syscall_name(100000, names) == "syscall_100000"


def test_deeply_nested_json_in_counts_costs_and_model_files_gives_one_line(tmp_path: Path) -> None:
    """100,000-deep JSON (and 40-deep, under the parser's own limit) in a counts file, a costs file and a model
    file: one line naming the file and the nesting, exit 1, never a RecursionError."""
    counts, costs, deep = tmp_path / "c.json", tmp_path / "k.json", tmp_path / "deep.json"
    counts.write_text(json.dumps(_counts_json()))
    costs.write_text(json.dumps(_costs_json()))
    for text in ("[" * 100_000 + "]" * 100_000, json.dumps({**_counts_json(), "x": [[[[[[[[[[[]]]]]]]]]]] * 1} |
                                                           {"y": json.loads("[" * 40 + "]" * 40)})):
        deep.write_text(text)
        for args in (("predict", "estimate", str(deep), "--costs", str(costs)),
                     ("predict", "estimate", str(counts), "--costs", str(deep)),
                     ("model", "predict", str(deep), "--load", "cpu=0.5")):
            line = _one_line_failure(vmprof(*args))
            assert f"{deep} nests deeper than 32 levels" in line, (args, line)


def test_memory_probe_of_a_failing_command_gives_one_line(tmp_path: Path) -> None:
    """The probe times whole runs: a command that fails is refused, not timed as if it had done its work."""
    require_root()
    line = _one_line_failure(vmprof("predict", "measure", "--memory-probe", "-o", str(tmp_path / "c.json"), "--",
                                    "sh", "-c", "exit 3"))
    assert line == ("vmprof: predict measure --memory-probe: sh exited with status 3 "
                    "(the probe times whole runs: run a command that succeeds)")
