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


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (CI runs as root); run the suite with sudo")


class Recorded:
    def __init__(self, rec: recording.Recording, truth: dict, ready: dict, wall_s: float) -> None:
        self.rec, self.truth, self.ready, self.wall_s = rec, truth, ready, wall_s


def record_scenario(tmp: Path, scenario: str | list[dict], seconds: float, frequency: int = 1000,
                    stacks: bool = False) -> Recorded:
    """Record the whole life of a demo scenario: recording starts before the VMs, ends after them
    (stacks: as `vmprof record -g`)."""
    require_root()
    # The profiler and the VMMs' main threads stay on CPU 0, away from the pCPU the demo vCPUs are pinned to
    # (scenarios.SHARED_CPU), so that the only load there is the VMs, as in the papers' experiments.
    os.sched_setaffinity(0, {0})
    specs = runner.scenario_specs(scenario) if isinstance(scenario, str) else scenario
    out = tmp / f"{specs[0]['name']}.vmprof"
    stop = threading.Event()
    recorder = Recorder(out, CollectionSession(frequency, stacks=stacks))
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
    with runner.DemoRun(specs, duration_s=seconds) as run:
        run.wait(seconds + 10)
    time.sleep(0.3)
    stop.set()
    thread.join(30)
    assert not errors, errors
    return Recorded(recording.load(out), run.truth, run.ready, time.monotonic() - t0)
