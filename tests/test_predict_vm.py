"""vmprof predict onto a demo VM (issue 37): the cost program run inside a VM gives every cost kind with its
spread (or says why the guest kernel has none), an estimate onto a VM target is exact arithmetic (unsupported
costs, the range from the spread, the steal share), and a program that fails inside the VM is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import require_root, vmprof

from tests.test_predict import _costs_json, _counts_json, _one_line_failure
from vmprof_tui.estimate import predict as P
from vmprof_tui.estimate.predict_vm import measure_costs_vm

GUEST_COSTS = {"compute_loop", "null_syscall", "open_close", "read_4k", "read_64k", "write_4k", "write_64k",
               "mmap_munmap", "minor_fault", "major_fault", *P.OPTIONAL_COSTS}


def test_vm_cost_run_gives_every_cost_kind_with_its_spread(tmp_path: Path) -> None:
    require_root()
    costs = measure_costs_vm("t", repeat=3, min_time=0.03, neighbour=False)
    assert set(costs.costs) == GUEST_COSTS
    assert set(costs.target["unsupported"]) == set(P.COST_NAMES) - GUEST_COSTS  # fork, exec, context switch
    assert costs.target["costs_exclude_steal"] is True and set(costs.target["wall_median_s"]) == GUEST_COSTS
    for name, s in costs.costs.items():
        assert s.repeat == 3 and 0 < s.min <= s.median <= s.max, name
    # a served call is a VM exit and the VMM's work: far above a native call (~0.1 us), far below a second
    assert 1e-6 < costs.costs["null_syscall"].median < 0.1
    assert 0 <= costs.target["steal_share"] < 1
    lo, hi = costs.target["compute_ratio_spread"]
    assert 0 < lo <= hi and costs.target["reference_compute_loop_s"] > 0
    # the memory loop, with its host reference timed interleaved like the compute loop's; fcntl a cost of its own
    assert costs.costs["memory_loop"].median > costs.costs["compute_loop"].median
    lo, hi = costs.target["reference_memory_loop_spread"]
    assert 0 < lo <= costs.target["reference_memory_loop_s"] <= hi
    assert costs.costs["fcntl"].median > 1e-6  # an F_SETLK served by the VMM: a VM exit
    # the file round-trips: the unsupported costs may be absent, and an estimate charges them nothing
    P.write_json(tmp_path / "vm.json", costs.to_json())
    loaded = P.load_costs(tmp_path / "vm.json")
    assert loaded.costs["fork_exit"].repeat == 0 and loaded.target["unsupported"]
    assert P.unit_costs(loaded).stat == costs.costs["stat"].median


def _vm_costs(tmp_path: Path, steal: float) -> Path:
    k = _costs_json()
    for name in ("fork_exit", "fork_exec_exit", "context_switch"):
        del k["costs"][name]
    k["costs"]["compute_loop"] = {"median_s": 1e-9, "min_s": 0.8e-9, "max_s": 1.5e-9, "repeat": 3}
    k["costs"]["null_syscall"] = {"median_s": 100e-9, "min_s": 90e-9, "max_s": 130e-9, "repeat": 3}
    for name, v in (("stat", 300e-9), ("write_sync", 5000e-9)):  # measured where the target has them
        k["costs"][name] = {"median_s": v, "min_s": v, "max_s": v, "repeat": 3}
    k["target"] = {"name": "vm", "host": "ref", "steal_share": steal, "reference_compute_loop_s": 0.25e-9,
                   "costs_exclude_steal": True,
                   "unsupported": {"fork_exit": "no fork", "fork_exec_exit": "no exec", "context_switch": "alone"}}
    (tmp_path / "vm.json").write_text(json.dumps(k))
    return tmp_path / "vm.json"


def test_estimate_onto_a_vm_target_is_exact_arithmetic(tmp_path: Path) -> None:
    c = _counts_json()
    c["syscalls"] |= {"newfstatat": {"nr": 262, "calls": 40, "bytes": 0}, "fdatasync": {"nr": 75, "calls": 3}}
    (tmp_path / "c.json").write_text(json.dumps(c))
    counts = P.load_counts(tmp_path / "c.json")
    est = P.estimate(counts, P.load_costs(_vm_costs(tmp_path, 0.4)))
    rb, wb = 6000e-9 / 61440, 3600e-9 / 61440
    rc, wc = 500e-9 - 4096 * rb, 900e-9 - 4096 * wb

    def total(loop: float, null: float) -> float:
        # the compute ratio: the costs' own interleaved reference loop (same host as the counts), not the counts'
        compute = 2.0 * loop / 0.25e-9
        syscall = ((100 * rc + 409600 * rb) + (10 * wc + 40960 * wb) + 20 * (1100e-9 - null) + 20 * null
                   + 30 * (2100e-9 - null) + 7 * null  # execve, clone, wait4: nothing on a target without them
                   + 40 * 300e-9 + 3 * (5000e-9 - 900e-9))  # a stat; a durable write less the write
        return compute + syscall + 1000 * 1e-6 + 4 * 80e-6  # no processes, no context switches

    # the VM's costs are without steal (its vCPU thread's CPU time): the sum is divided by 1 - the steal share
    assert est.total_s == pytest.approx(total(1e-9, 100e-9) / 0.6, rel=1e-12)
    assert est.group_s("process") == 0 and est.group_s("switch") == 0
    assert any("no fork_exit" in n for n in est.notes) and any("no context_switch" in n for n in est.notes)
    assert est.low_s == pytest.approx(total(0.8e-9, 90e-9) / 0.6, rel=1e-12)
    assert est.high_s == pytest.approx(total(1.5e-9, 130e-9) / 0.6, rel=1e-12)
    assert est.steal_share == 0.4 and est.to_json()["steal_s"] == pytest.approx(0.4 * est.total_s, rel=1e-12)
    # a steal share measured apart from the costs (just before the run): (1 - 0.4) / (1 - 0.7) = 2 times
    est2 = P.estimate(counts, P.load_costs(tmp_path / "vm.json"), steal=0.7)
    assert est2.total_s == pytest.approx(2 * est.total_s, rel=1e-12) and est2.steal_share == 0.7
    # wall-time costs (a host's) hold the steal of their measurement: only a share given apart rescales them
    k = json.loads((tmp_path / "vm.json").read_text())
    del k["target"]["costs_exclude_steal"]
    (tmp_path / "wall.json").write_text(json.dumps(k))
    assert P.estimate(counts, P.load_costs(tmp_path / "wall.json")).total_s == pytest.approx(total(1e-9, 100e-9),
                                                                                             rel=1e-12)
    est3 = P.estimate(counts, P.load_costs(tmp_path / "wall.json"), steal=0.7)
    assert est3.total_s == pytest.approx(total(1e-9, 100e-9) * 2, rel=1e-12)
    r = vmprof("predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "vm.json"))
    assert r.returncode == 0, r.stderr
    assert "of which steal" in r.stdout and "range" in r.stdout
    assert "predict estimate: --steal 1.5" in _one_line_failure(vmprof(
        "predict", "estimate", str(tmp_path / "c.json"), "--costs", str(tmp_path / "vm.json"), "--steal", "1.5"), 2)


def test_program_failing_inside_the_vm_is_one_line(tmp_path: Path) -> None:
    require_root()
    src = tmp_path / "fails.c"
    src.write_text('#include <stdio.h>\nint main(void) { fprintf(stderr, "no input here\\n"); return 3; }\n')
    prog = tmp_path / "fails"
    subprocess.run(["gcc", "-static", "-O2", "-o", str(prog), str(src)], check=True)
    out = tmp_path / "c.json"
    line = _one_line_failure(vmprof("predict", "measure", "--vm", "-o", str(out), "--", str(prog)))
    assert "fails failed inside the VM (exit status 3): no input here" in line
    assert not out.exists()
    # a program the guest kernel cannot run (dynamically linked) is bad usage, before any VM starts
    line = _one_line_failure(vmprof("predict", "measure", "--vm", "-o", str(out), "--", "/bin/true"), 2)
    assert "predict measure --vm" in line
    line = _one_line_failure(vmprof("predict", "measure", "--vm", "--repeat", "3", "-o", str(out), "--", str(prog)), 2)
    assert "--repeat" in line


def test_measure_inside_the_vm_counts_served_calls_and_bytes(tmp_path: Path) -> None:
    require_root()
    src = tmp_path / "writes.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\nint main(void) { static char b[1000];\n'
                   'int fd = open("o", O_WRONLY | O_CREAT, 0600);\n'
                   'for (int i = 0; i < 3; i++) if (pwrite(fd, b, sizeof b, i * 1000) != 1000) return 1;\n'
                   'for (int i = 0; i < 5; i++) getppid();\nreturn close(fd); }\n')
    prog, files = tmp_path / "writes", tmp_path / "files"
    files.mkdir()
    subprocess.run(["gcc", "-static", "-O2", "-o", str(prog), str(src)], check=True)
    r = vmprof("predict", "measure", "--vm", "--dir", str(files), "-o", str(tmp_path / "c.json"), "--", str(prog))
    assert r.returncode == 0, r.stderr
    c = P.load_counts(tmp_path / "c.json")
    assert (c.syscalls["pwrite64"].calls, c.syscalls["pwrite64"].bytes) == (3, 3000)
    assert c.syscalls["getppid"].calls == 5 and c.syscalls["openat"].calls == 1
    assert (files / "o").stat().st_size == 3000
    assert c.wall_s > 0 and c.user_s > 0 and c.minor_faults == 0 and c.reference_loop_s > 0
