"""`vmprof model` (paper 003): workloads measured in real demo VMs on a reduced grid, the model's
arithmetic on constructed inputs, and one-line failures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import vmprof

from vmprof_tui.cli import main
from vmprof_tui.estimate import model as M
from vmprof_tui.estimate.model_measure import on_cpu_ns
from vmprof_tui.record.bpf_records import SCHED_DTYPE

WINDOW = "0.3"


@pytest.fixture(scope="module")
def pair_model(tmp_path_factory: pytest.TempPathFactory) -> M.Model:
    """cpu and net-send: 7 levels each, 9 points with both running, measured by `vmprof model build`."""
    path = tmp_path_factory.mktemp("model") / "pair.json"
    assert main(["model", "build", "-o", str(path), "--workloads", "cpu,net-send", "--levels", "14,9",
                 "--window", WINDOW, "-q"]) == 0
    return M.load(path)


def test_first_order_curves_reproduce_their_points(pair_model: M.Model) -> None:
    for i, name in enumerate(pair_model.workloads):
        pts = [p for p in pair_model.points if p["order"] == 1 and p["subset"] == [i]]
        assert len(pts) == 7
        x = np.array([p["levels"][i] for p in pts])
        y = np.array([p["value"] for p in pts])
        fitted = pair_model.first_order(i, x)
        # the machine may be shared: a point may be off by some % of a core, the curve follows the points
        assert np.abs(fitted - y).max() < 0.2, (name, fitted, y)
        assert 1 - np.sum((fitted - y) ** 2) / np.sum((y - y.mean()) ** 2) > 0.85, (name, fitted, y)
        assert y[-1] > y[0] + 0.05, f"{name} at its maximum costs no more than idle: {y}"
    # net-send's cost is in good part the VMM's NIC thread (host CPU outside the vCPU), as virtio's is: vmm-cpu
    # must carry it. The split between the two moves with the machine's load and how the guest's sends batch
    # (31% to 47% the VMM's in runs so far), so the bound only says the NIC thread's work is counted at all
    send = max((p for p in pair_model.points if p["order"] == 1 and p["subset"] == [1]), key=lambda p: p["levels"][1])
    cores = send["cores"]["sched"]
    assert cores["vmm-cpu"] > (cores["vmm-cpu"] + cores["vm-cpu"]) / 6, cores


def test_sched_events_agree_with_schedstat(pair_model: M.Model) -> None:
    """Both accountings are kept for every point: vmprof's sched events against the kernel's schedstat,
    which lags by up to a scheduler tick (4 ms here) at each end of the window for each running thread:
    two busy threads, 16 ms in a 0.3 s window, 0.053 core.  On a loaded machine a point now and then is off by
    more (0.089 core once, in a full test run on a slow 2-CPU machine): nine in ten within that, none over 0.1."""
    off = np.array([abs(p["cores"]["sched"]["host-cpu"] - p["cores"]["schedstat"]["host-cpu"])
                    for p in pair_model.points])
    assert np.mean(off <= 0.06) >= 0.9 and off.max() <= 0.1, off


def test_second_order_correction_lowers_error_on_held_out_points() -> None:
    """The correction on constructed usage with a known interaction (two workloads that share one lock, as
    the demo VMM's vCPU and NIC threads share the interpreter's: together they use less than the sum), with
    measurement noise: built by the model's own design and fit, then checked on points it never saw.
    (On real demo-VM measurements this held in the benchmark's first run and not in its second, and once
    not in CI: the measured pairwise effect is near the noise here. benchmarks/model.py measures it.)"""
    rng = np.random.default_rng(7)

    def usage(x: np.ndarray) -> np.ndarray:
        cpu, send = x[:, 0], x[:, 1]
        return np.minimum(0.05 + 0.9 * cpu + 0.6 * send - 0.45 * cpu * send, 2.0)

    def measure(levels: np.ndarray) -> dict:
        return {"value": float(usage(levels[None])[0] + rng.normal(0, 0.01))}

    model = M.build(["cpu", "net-send"], [14, 9], measure, "host-cpu", 2.0)
    held_out = np.array([[0.25, 0.75], [0.6, 0.6], [0.9, 0.3], [0.9, 0.9], [0.45, 1.0], [0.7, 0.2]])
    truth = usage(held_out)
    err_approx = np.abs(model.approximate((0, 1), held_out) - truth).mean()
    err_corrected = np.abs(model.predict(held_out) - truth).mean()
    assert err_corrected < err_approx / 3, (err_approx, err_corrected)


def _linear_model(l_max: float = 2.0) -> M.Model:
    """Constructed: cpu costs x cores, net-send 0.5 x; no correction."""
    return M.Model(["cpu", "net-send"], "host-cpu", l_max, [np.array([0.0, 1.0]), np.array([0.0, 0.5])],
                   max_order=1)


def test_formula_5_cases() -> None:
    # free host: the new VM needs less than its fair share (2 cores / 3 VMs)
    assert M.add_vm(0.5, 1.2, 2, 2.0) == {"usage": 0.5, "case": "fair share covers it", "fair_share": 2.0 / 3}
    # room left: above its share, but the host is not saturated
    assert M.add_vm(0.9, 0.5, 1, 2.0)["usage"] == 0.9
    # saturated host: it gets what the others leave...
    r = M.add_vm(1.5, 0.8, 1, 2.0)
    assert r["case"] == "saturated" and r["usage"] == pytest.approx(1.2)
    # ...but never less than its fair share
    r = M.add_vm(1.5, 1.9, 1, 2.0)
    assert r["case"] == "saturated" and r["usage"] == pytest.approx(1.0)
    # through a model: three running VMs at cpu=1 use 3 of 2 cores; the new one gets 2/4
    r = _linear_model().add_vm(np.array([1.0, 0.0]), [np.array([1.0, 0.0])] * 3)
    assert (r["alone"], r["running"], r["usage"]) == (pytest.approx(1.0), pytest.approx(3.0), pytest.approx(0.5))


def test_approximation_caps_and_corrects() -> None:
    """Formula (2) is the capped sum; formula (3) adds the error spline, which passes near its points."""
    model = _linear_model(l_max=1.0)
    x = np.array([[0.4, 0.4], [1.0, 1.0]])
    assert model.approximate((0, 1), x) == pytest.approx([0.6, 1.0])
    truth = lambda v: np.minimum(v[:, 0] + 0.5 * v[:, 1] - 0.3 * v[:, 0] * v[:, 1], 1.0)  # noqa: E731
    pts = M.inner_points(2, 9)
    M.fit_correction(model, (0, 1), pts, truth(pts), 9)
    model.max_order = 2
    assert np.abs(model.predict(pts) - truth(pts)).max() < 0.02
    test = np.array([[0.5, 0.5], [0.2, 0.8], [0.8, 0.3]])
    approx = model.approximate((0, 1), test)
    assert np.abs(model.predict(test) - truth(test)).mean() < np.abs(approx - truth(test)).mean()


def test_direct_fit_is_exact_on_a_cubic() -> None:
    pts = M.direct_points(3, 55)
    f = lambda v: 0.6 + v[:, 0] ** 3 - 0.5 * v[:, 1] * v[:, 2] + 0.2 * v[:, 2]  # noqa: E731
    fit = M.DirectFit.fit(pts, f(pts), 10.0)
    grid = M.evaluation_grid(3, 5)
    assert fit.predict(grid) == pytest.approx(f(grid), abs=1e-9)


def test_model_file_round_trip(tmp_path: Path) -> None:
    model = _linear_model()
    pts = M.inner_points(2, 4)
    M.fit_correction(model, (0, 1), pts, np.array([0.1, 0.0, -0.1, 0.05]), 4)
    model.max_order = 2
    model.cpus = [1]
    model.save(tmp_path / "m.json")
    again = M.load(tmp_path / "m.json")
    assert again.cpus == [1]
    grid = M.evaluation_grid(2, 6)
    assert again.predict(grid) == pytest.approx(model.predict(grid))


def test_on_cpu_from_sched_events() -> None:
    ev = np.zeros(4, SCHED_DTYPE)
    ev["time_ns"] = [100, 300, 500, 900]
    ev["next_tid"] = [7, 0, 7, 0]
    ev["prev_tid"] = [0, 7, 0, 7]
    assert on_cpu_ns(ev, 7, 0, 1000, False) == 200 + 400
    assert on_cpu_ns(ev, 7, 200, 600, False) == 100 + 100  # on at 200 (switched in at 100)
    assert on_cpu_ns(ev[1:], 7, 200, 400, False) == 100  # first event a switch-out: on from the start
    assert on_cpu_ns(ev[:0], 7, 0, 1000, True) == 1000


def test_cli_predict_add_and_evaluate(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    assert main(["model", "build", "-o", str(path), "--workloads", "cpu,net-recv", "--levels", "4",
                 "--window", WINDOW, "-q"]) == 0
    r = vmprof("model", "predict", str(path), "--load", "cpu=0.5", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["usage"] > 0
    r = vmprof("model", "add", str(path), "--running", "cpu=1", "cpu=1", "--new", "cpu=1", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["vms"] == 2, r.stderr
    png = tmp_path / "errors.png"
    r = vmprof("model", "evaluate", str(path), "--grid", "2", "--window", WINDOW, "-q", "-o", str(png), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "proposed" in r.stdout and "direct fit" in r.stdout and "90th percentile" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content, says", [
    ("{not json", "bad JSON"),
    ('{"format": "vmprof-model", "version": 1, "workloads": ["cpu"]}', "corrupt model file"),
    ('{"format": "something-else"}', "not a vmprof model"),
    ('{"format": "vmprof-model", "version": 1, "workloads": ["cpu"], "resource": "host-cpu", "l_max": NaN,'
     ' "first": [[0, 1]]}', "not a finite number"),
])
def test_corrupt_model_file_gives_one_line(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(content)
    r = vmprof("model", "predict", str(path), "--load", "cpu=0.5")
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("load, says", [
    ("cpu", "WORKLOAD=LEVEL"), ("disk=0.5", "unknown workload"), ("cpu=lots", "not a number"),
    ("cpu=1.5", "from 0 to 1"),
])
def test_bad_load_gives_one_line(tmp_path: Path, load: str, says: str) -> None:
    path = tmp_path / "m.json"
    _linear_model().save(path)
    r = vmprof("model", "predict", str(path), "--load", load)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = vmprof("model", "add", str(path), "--new", load)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_pinned_vm_uses_at_most_its_cpus() -> None:
    """--cpus: every thread of the profiling VM on one CPU, so cpu and net-send at full level together
    need more than the CPU has (about 1.3 cores unpinned) and get l_max = 1 core."""
    from vmprof_tui.estimate.model_measure import Bench, l_max

    cpu = max(os.sched_getaffinity(0))
    with Bench(["cpu", "net-send"], accounting="schedstat", window_s=0.5, cpus=[cpu]) as bench:
        point = bench.measure([1.0, 1.0])
    used = point.value("host-cpu", "schedstat")
    print(f"cpu=1, net-send=1 pinned to CPU {cpu}: {used:.3f} cores")
    assert l_max("host-cpu", [cpu]) == 1.0
    assert 0.9 <= used <= 1.02


def test_missing_model_and_bad_build_options(tmp_path: Path) -> None:
    r = vmprof("model", "predict", str(tmp_path / "none.json"), "--load", "cpu=1")
    assert r.returncode == 1 and "no such model file" in r.stderr
    r = vmprof("model", "build", "-o", str(tmp_path / "m.json"), "--levels", "30,x")
    assert r.returncode == 2 and "--levels" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = vmprof("model", "build", "-o", str(tmp_path / "m.json"), "--workloads", "cpu,disk")
    assert r.returncode == 2 and "--workloads" in r.stderr
    r = vmprof("model", "build", "-o", str(tmp_path / "m.json"), "--cpus", "4096")
    assert r.returncode == 2 and "--cpus 4096" in r.stderr and len(r.stderr.strip().splitlines()) == 1
