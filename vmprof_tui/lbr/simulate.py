"""`--lbr=simulate`: LBR records on any machine, from the exact single-step ground truth.

The command is single-stepped with ptrace (lbr/groundtruth.py: every retired user-mode
instruction, hence every taken branch, is known).  A simulated PMU then samples it as a host
with LBR would: a sample every `period` cycles of a synthetic cost model (1-6 cycles per
instruction, a function of the address: groundtruth.cost_model), the last `depth` branches
the pattern's filter keeps, the running cycles and instructions counts, and the cycles a timed
LBR would have recorded per entry.  The records have the layout the BPF collector writes
(lbr/records.py), so everything downstream reads them as a PMU host's.

Simulated time: one cost-model cycle is one nanosecond (a 1 GHz CPU), so `-F HZ` means a
sample every 1e9/HZ cycles of the program's own execution.  Single-stepping is slow (docs/lbr.md
has figures): a run is bounded by an instruction limit, by `-d` and by Ctrl-C.
Only the traced thread is seen (a multi-threaded program's other threads run untraced).

`vmprof record --lbr=simulate` traces the command to its end, then writes the recording (simulate, write);
`vmprof top --lbr=simulate` samples it live (lbr/simulated_collector.py), with the same records.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.collect.session import BranchCollectorError, snapshot_process
from vmprof_tui.lbr import groundtruth
from vmprof_tui.lbr.model import INFO_CYCLES_SHIFT, Fields
from vmprof_tui.lbr.patterns import Pattern
from vmprof_tui.lbr.records import record_dtype
from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE
from vmprof_tui.record.writer import Writer

CLOCK_HZ = 1_000_000_000  # simulated: one cost-model cycle per ns
START_NS = 1_000_000_000  # simulated time of the first instruction
DEFAULT_MAX_INSTRUCTIONS = 2_000_000
BACKEND = "lbr-simulate"


class SimulateError(BranchCollectorError):
    """The command cannot be simulated (one line for the user)."""


@dataclass
class SimulatedRun:
    command: list[str]
    pattern: Pattern
    depth: int
    period: int  # cycles between samples
    records: np.ndarray  # raw LBR records, record_dtype(depth, pattern.fields)
    samples: np.ndarray  # SAMPLE_DTYPE: one host sample at each LBR sample (the live screen's function rows)
    instructions: int  # traced
    cycles: int  # cost-model cycles of the traced instructions
    trace_s: float  # wall time of the single-stepping
    exit_status: int
    stopped: str | None  # the limit that ended the trace early, None when the command exited
    processes: dict[int, dict] = field(default_factory=dict)

    def lbr_meta(self) -> dict:
        """The recording's meta["lbr"]: what was simulated, so that every reader can say so."""
        return {"pattern": self.pattern.name, "simulated": True, "depth": self.depth, "period_cycles": self.period,
                "clock_hz": CLOCK_HZ, "instructions": self.instructions, "stopped": self.stopped,
                "command": self.command[:16]}

    def summary(self) -> str:
        end = f"stopped at {self.stopped}" if self.stopped else f"exit status {self.exit_status}"
        return (f"simulated LBR: {self.instructions:,} instructions single-stepped in {self.trace_s:.1f} s ({end}), "
                f"{len(self.records)} samples every {self.period:,} cycles, depth {self.depth}, "
                f"{self.pattern.branch_filter.describe()}")


def simulate(command: list[str], pattern: Pattern, rate_hz: int, depth: int = 16,
             max_instructions: int = DEFAULT_MAX_INSTRUCTIONS, duration_s: float | None = None,
             should_stop: Callable[[], bool] | None = None) -> SimulatedRun:
    """Trace `command` and sample it as a PMU host would (see the module's docstring); past a limit, or once
    should_stop() (Ctrl-C), the command is stopped and what ran until then is kept."""
    path = shutil.which(command[0]) if command else None
    if path is None:
        raise SimulateError(f"command not found: {command[0] if command else '(none)'}")
    snaps: dict[int, dict] = {}

    def at_exit(pid: int) -> None:  # the maps as they are at the end: every library the program loaded
        snap = snapshot_process(pid)
        if snap is not None:
            snaps[pid] = snap

    t0 = time.monotonic()
    try:
        t = groundtruth.trace(path, max_instructions, [path, *command[1:]], on_exit=at_exit,
                              deadline=None if duration_s is None else t0 + duration_s, should_stop=should_stop,
                              stop_at_limit=True)
        br = groundtruth.branches(t)
    except groundtruth.TraceError as e:
        raise SimulateError(f"cannot single-step {command[0]}: {e}") from None
    trace_s = time.monotonic() - t0
    if len(t.rips) < 2:
        raise SimulateError(f"{command[0]} ran no instruction that could be traced")
    sim = groundtruth.LbrSimulator(t, br, pattern.branch_filter, depth)
    period = max(CLOCK_HZ // rate_hz, 1)
    total = int(sim.cum_cost[-1])
    points = np.unique(np.searchsorted(sim.cum_cost, np.arange(period, total, period, dtype=np.int64)))
    points = points[(points > 0) & (points < len(t.rips))]
    records = sample_records(sim, points, pattern, depth)
    records["hdr"]["time_ns"] = START_NS + sim.cum_cost[points]
    samples = host_samples(records)
    return SimulatedRun(list(command), pattern, depth, period, records, samples, len(t.rips), total, trace_s,
                        t.exit_status, t.stopped, snaps)


def sample_records(sim: groundtruth.LbrSimulator, points: np.ndarray, pattern: Pattern, depth: int, prev: int = 0,
                   first: int = 0) -> np.ndarray:
    """The records of the samples taken at trace steps `points` (the one before them at step `prev`, `first` the
    index of the first), as the BPF collector writes them; their times are the caller's."""
    records = np.zeros(len(points), record_dtype(depth, pattern.fields))
    hdr = records["hdr"]
    cum = sim.cum_cost[points]
    hdr["ip"] = sim.trace.rips[points]
    hdr["cycles"] = hdr["cycles_enabled"] = hdr["cycles_running"] = cum  # running totals, as the counters read
    hdr["instructions"] = hdr["instructions_enabled"] = hdr["instructions_running"] = points
    hdr["pid"] = hdr["tid"] = sim.trace.pid
    hdr["fields"] = int(pattern.fields)
    hdr["filter"] = int(pattern.branch_filter)
    timed = bool(pattern.fields & Fields.INFO)
    for k, at in enumerate(points.tolist()):
        s, _ = sim.sample(at, prev, pattern.fields, timed, first + k)
        prev = at
        nr = s.nr
        hdr["nr"][k] = nr
        hdr["lbr_bytes"][k] = nr * 24
        if pattern.fields & Fields.FROM:
            records["from"][k][:nr] = s.from_[::-1]  # the kernel's order: newest first
        if pattern.fields & Fields.TO:
            records["to"][k][:nr] = s.to[::-1]
        if timed and s.lbr_cycles is not None:
            records["info"][k][:nr] = s.lbr_cycles[::-1].astype(np.uint64) << np.uint64(INFO_CYCLES_SHIFT)
    return records


def host_samples(records: np.ndarray) -> np.ndarray:
    """One host sample at each LBR sample: the function rows of `report` and `top` (no timer sees a single-stepped
    program at work)."""
    hdr = records["hdr"]
    samples = np.zeros(len(records), SAMPLE_DTYPE)
    samples["time_ns"] = hdr["time_ns"]
    samples["host_ip"] = hdr["ip"]
    samples["pid"] = hdr["pid"]
    samples["tid"] = hdr["tid"]
    samples["stack_id"] = -1
    return samples


def write(path: Path, run: SimulatedRun, frequency: int, keep_old: bool = False) -> None:
    """The recording: meta (marked simulated), the host samples, the LBR records, the process's maps (an older
    file at `path` becomes PATH.old with keep_old, as record's)."""
    meta = {"backend": BACKEND, "frequency": frequency, "event": "simulated cycles (single-step ground truth)",
            "lbr": run.lbr_meta()}
    w = Writer(path, meta, keep_old)
    w.add(run.samples, np.zeros(0, SCHED_DTYPE))
    if len(run.records):
        w.add_lbr(run.records, run.depth, int(run.pattern.fields))
    w.add_snapshot(recording.snapshot(vms=[], processes=run.processes))
    duration = float(run.cycles) / CLOCK_HZ
    w.close({"duration_s": duration, "samples": len(run.samples), "guest_samples": 0,
             "lost": {"samples": [], "sched": []}, recording.VMS_KEY: []})
