"""Shared fixtures.  Tests that need KVM, BPF or root run for real (CI runs as root
on a KVM host); on a machine without them they fail with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.demo import runner
from vmprof_tui.demo.scenarios import SHARED_CPU
from vmprof_tui.record import recording
from vmprof_tui.record.recorder import Recorder

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def vmprof(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the vmprof CLI as a user would."""
    return subprocess.run([sys.executable, "-m", "vmprof_tui", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


def start_recording(out: Path, *args: str, timeout: float = 120) -> subprocess.Popen:
    """`vmprof record -o OUT ARGS` in the background, returned once it says it samples every CPU
    (compiling the BPF programs takes seconds, more on a fresh machine)."""
    return start_sampling("record", "-o", str(out), *args, timeout=timeout)


def start_sampling(*args: str, timeout: float = 120) -> subprocess.Popen:
    """`vmprof ARGS` (record or agent) in the background, returned once it says it samples every CPU;
    its stderr is then read by a thread (kept in proc.lines) so the pipe never fills."""
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", *args], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:  # it ended before attaching
            break
        seen.append(line)
        if ": sampling every CPU" in line:
            proc.lines = seen  # type: ignore[attr-defined]
            threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True).start()  # keep it drained
            return proc
    proc.kill()
    pytest.fail(f"vmprof {args[0]} did not attach: {''.join(seen)}")


def fuzz_process(target: str, seconds: int, work: Path) -> subprocess.Popen:
    """The atheris target `target` of tests/fuzz/fuzz_bundle.py run for `seconds` in `work` (its corpus and crash
    files there), stderr piped.  It starts through a shell that forks it: a process started straight from pytest
    inherits pytest's peak RSS as its own (Linux keeps ru_maxrss across fork and exec), and libFuzzer's
    -rss_limit_mb reads that peak."""
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_bundle.py"), target, f"-max_total_time={seconds}",
            "-timeout=10", "-rss_limit_mb=4096", f"-artifact_prefix={work}/", str(work / "corpus")]
    return subprocess.Popen(["sh", "-c", '"$@"; exit $?', "sh", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=work,
                            env={**os.environ, "VMPROF_FUZZ_SCRATCH": str(work)})


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (CI runs as root); run the suite with sudo")


def cpu_busy_ns(cpu: int) -> int:
    """Time CPU `cpu` has spent running anything since boot (/proc/stat: user, nice, system, irq, softirq;
    a guest's time is inside user)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in line.split()[1:8])
            return (user + nice + system + irq + softirq) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    raise AssertionError(f"/proc/stat has no cpu{cpu}")


def thread_cpu_ns(pid: int, tid: int) -> int:
    """A thread's CPU time so far (its schedstat), 0 once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def require_quiet_pcpu(other_ns: float, wall_ns: float, why: str, limit_pct: float = 3.0) -> None:
    """Some ground truths hold only while the demo VMs have their pCPU to themselves (KVM polls a halt out only
    when nothing else is runnable; a VM alone sees no steal).  Other work on the pCPU (another job on a shared
    machine) is measured independently of vmprof, from /proc/stat less the demo threads' own CPU time: past
    `limit_pct` of the time the test says so and skips, rather than fail on what the machine did."""
    pct = 100 * other_ns / max(wall_ns, 1)
    print(f"other work on the demo pCPU: {pct:.1f}% of the time")
    if pct > limit_pct:
        pytest.skip(f"the demo VMs' pCPU was {pct:.0f}% busy with other work (limit {limit_pct}%): {why}; "
                    "run it on a quiet machine")


class Recorded:
    def __init__(self, rec: recording.Recording, truth: dict, ready: dict, wall_s: float,
                 pcpu_other_ns: float = 0.0, pcpu_wall_ns: float = 1.0) -> None:
        self.rec, self.truth, self.ready, self.wall_s = rec, truth, ready, wall_s
        self.pcpu_other_ns, self.pcpu_wall_ns = pcpu_other_ns, pcpu_wall_ns

    def require_quiet_pcpu(self, why: str, limit_pct: float = 3.0) -> None:
        require_quiet_pcpu(self.pcpu_other_ns, self.pcpu_wall_ns, why, limit_pct)


def record_scenario(tmp: Path, scenario: str | list[dict], seconds: float, frequency: int = 1000,
                    stacks: bool = False, call_graph: str = "fp") -> Recorded:
    """Record the whole life of a demo scenario: recording starts before the VMs, ends after them
    (stacks: as `vmprof record -g --call-graph CALL_GRAPH`)."""
    require_root()
    # The profiler and the VMMs' main threads stay on CPU 0, away from the pCPU the demo vCPUs are pinned to
    # (scenarios.SHARED_CPU), so that the only load there is the VMs, as in the papers' experiments.
    os.sched_setaffinity(0, {0})
    specs = runner.scenario_specs(scenario) if isinstance(scenario, str) else scenario
    out = tmp / f"{specs[0]['name']}.vmprof"
    stop = threading.Event()
    recorder = Recorder(out, CollectionSession(frequency, stacks=stacks, call_graph=call_graph))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            recorder.run(None, stop.is_set)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    assert recorder.attached.wait(30) or errors, errors  # BPF compiled and attached
    t0 = time.monotonic()
    busy0, wall0 = cpu_busy_ns(SHARED_CPU), time.monotonic_ns()
    with runner.DemoRun(specs, duration_s=seconds) as run:
        run.wait(seconds + 10)
    busy, wall = cpu_busy_ns(SHARED_CPU) - busy0, time.monotonic_ns() - wall0
    time.sleep(0.3)
    stop.set()
    thread.join(30)
    assert not errors, errors
    demo_ns = sum(v["thread_cpu_ns"] for t in run.truth.values() for v in t.get("vcpus", ())
                  if v.get("pin") in (None, SHARED_CPU))
    return Recorded(recording.load(out), run.truth, run.ready, time.monotonic() - t0, max(busy - demo_ns, 0), wall)
