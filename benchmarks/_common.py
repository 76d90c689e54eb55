"""Shared pieces of the benchmarks: run a demo VM for a fixed time and measure its work rate."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

from vmprof_tui.demo import runner


def guest_rate(seconds: float, scenario: str = "alone") -> float:
    """Work units per second of wall time of the demo's compute program (includes every interruption)."""
    with runner.DemoRun(runner.scenario_specs(scenario), duration_s=seconds) as run:
        run.wait(seconds + 20)
    truth = next(iter(run.truth.values()))
    proc = truth["processes"][0]
    return proc["work"] / (truth["vcpus"][0]["wall_ns"] / 1e9)


def perf_binary() -> str | None:
    """Debian's perf (the /usr/bin/perf wrapper refuses kernels it has no build for)."""
    candidates = sorted(Path("/usr/bin").glob("perf_*"), reverse=True)
    for p in [Path(shutil.which("perf") or "/nonexistent"), *candidates]:
        if p.exists() and subprocess.run([str(p), "--version"], capture_output=True).returncode == 0:
            return str(p)
    return None


READY = ": sampling every CPU"  # what `vmprof record` (without -q) prints once its BPF programs sample


class Background:
    """A command running in the background for one measurement, stopped with SIGINT.  A `vmprof record`
    is waited for until it samples (compiling its BPF programs can outlast any fixed warm-up on a loaded
    machine), then given a short settle; other commands get the fixed warm-up."""

    def __init__(self, cmd: list[str], warmup_s: float) -> None:
        waits = "vmprof_tui" in cmd and "record" in cmd and "-q" not in cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE if waits else subprocess.DEVNULL, text=True)
        if not waits:
            time.sleep(warmup_s)
            return
        deadline = time.monotonic() + 300
        for line in self.proc.stderr:  # type: ignore[union-attr]
            if READY in line or time.monotonic() > deadline:
                break
        threading.Thread(target=lambda: self.proc.stderr.read(), daemon=True).start()  # type: ignore[union-attr]
        time.sleep(0.5)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGINT, then SIGKILL after timeout_s (perf record writes its build-ids after SIGINT: minutes for a
        large perf.data on a loaded machine, and a killed perf leaves a file perf report refuses)."""
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def interleaved_rates(conditions: dict[str, list[str] | None], rounds: int, seconds: float, label: str,
                      warmup_s: float = 2.5) -> dict[str, list[float]]:
    """The guest's work rate under each condition (a command in the background, or None), in interleaved
    rounds so that the machine's drift hits every condition alike."""
    rates: dict[str, list[float]] = {k: [] for k in conditions}
    for r in range(rounds):
        for name, cmd in conditions.items():
            bg = Background(cmd, warmup_s=warmup_s) if cmd else None
            try:
                rates[name].append(guest_rate(seconds))
            finally:
                if bg:
                    bg.stop()
        print(f"  {label} round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()),
              flush=True)
    return rates
