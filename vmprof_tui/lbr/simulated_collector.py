"""`vmprof top --lbr=simulate -- CMD`: the simulated LBR as a collector the collection session polls.

A collect.session.BranchCollector, as a PMU host's (lbr/collector.py) is: the session starts it, polls it at each
drain and stops it.  The command is single-stepped in a thread of its own (lbr/groundtruth.py); each poll samples
the instructions it retired since, exactly as `record --lbr=simulate` samples a whole run (lbr/simulate.py: the same
cost model, period, depth and filter, the same records), and stamps each record with the host's clock when the
program got there, so that a live window takes it in with the samples of the same moment.
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np

from vmprof_tui.lbr import groundtruth
from vmprof_tui.lbr.patterns import Pattern
from vmprof_tui.lbr.records import record_dtype
from vmprof_tui.lbr.simulate import CLOCK_HZ, DEFAULT_MAX_INSTRUCTIONS, SimulateError, host_samples, sample_records
from vmprof_tui.libc import LIBC
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE

PR_SET_NAME = 15
THREAD_NAME = b"lbr-simulate"  # the tracing thread's name in /proc (the kernel's comm of the thread)


class SimulatedCollector:
    """A collect.session.BranchCollector on any machine (see the module's docstring)."""

    def __init__(self, command: list[str], pattern: Pattern, period: int, depth: int = 16,
                 max_instructions: int = DEFAULT_MAX_INSTRUCTIONS) -> None:
        self.command, self.pattern, self.period = list(command), pattern, max(int(period), 1)
        self.nr = depth
        self.max_instructions = max_instructions
        self.error: str | None = None  # why the trace failed, for the screen's notes
        self.trace: groundtruth.Trace | None = None  # the whole trace, once the command ended or was stopped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._marks: list[tuple[int, int]] = []  # (instructions retired, host monotonic ns), every 4096
        self._rips = np.empty(0, np.uint64)
        self._code: dict[int, bytes] = {}
        self._pid = 0
        self._decoded: dict[int, tuple[int, int]] = {}
        self._branches: list[groundtruth.Branches] = []
        self._seen = 0  # steps whose branches are found (a branch at step j needs step j + 1)
        self._last = 0  # the step of the last sample
        self._threshold = self.period  # the cost-model cycles of the next sample
        self._samples = 0
        self._cum = np.zeros(1, np.int64)  # the cost model's cycles before each step traced so far
        self._own = np.empty(0, SAMPLE_DTYPE)

    @property
    def fields(self) -> int:
        return int(self.pattern.fields)

    def check(self) -> None:
        if not self.command or shutil.which(self.command[0]) is None:
            raise SimulateError(f"command not found: {self.command[0] if self.command else '(none)'}")

    def start(self) -> None:
        self.check()
        self._marks.append((0, time.monotonic_ns()))
        self._thread = threading.Thread(target=self._run, name="lbr-simulate", daemon=True)
        self._thread.start()

    def _run(self) -> None:  # ptrace: every request of a trace comes from the thread that forked the tracee
        LIBC.prctl(PR_SET_NAME, THREAD_NAME, 0, 0, 0)  # its CPU told apart from the screen's (benchmarks/tui.py)
        path = shutil.which(self.command[0]) or self.command[0]
        try:
            self.trace = groundtruth.trace(path, self.max_instructions, [path, *self.command[1:]],
                                           should_stop=self._stop.is_set, stop_at_limit=True,
                                           on_progress=self._progress)
        except (groundtruth.TraceError, OSError) as e:
            self.error = f"cannot single-step {self.command[0]}: {e}"

    def _progress(self, rips: np.ndarray, n: int, code: dict[int, bytes], pid: int) -> None:
        self._rips, self._code, self._pid = rips, code, pid
        self._marks.append((n, time.monotonic_ns()))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> np.ndarray:
        """The samples of the instructions retired since the last poll (and the host samples beside them)."""
        n, _t = self._marks[-1]
        empty = np.zeros(0, record_dtype(self.nr, self.pattern.fields))
        if n < 2:
            return empty
        t = groundtruth.Trace(self._rips[:n], self._code, 0, self._pid)
        try:
            self._branches.append(groundtruth.branches(t, max(self._seen - 1, 0), self._decoded))
        except groundtruth.TraceError as e:
            self.error = str(e)
            self._stop.set()
            return empty
        self._seen = n
        br = groundtruth.Branches(*(np.concatenate([getattr(b, k) for b in self._branches])
                                    for k in ("step", "from_", "to", "kind")))
        self._branches = [br]
        done = len(self._cum) - 1
        cum = np.empty(n + 1, np.int64)  # grown, not recomputed: a poll costs what ran since the last one
        cum[:done + 1] = self._cum
        cum[done + 1:] = self._cum[-1] + np.cumsum(groundtruth.cost_model(self._rips[done:n]))
        self._cum = cum
        sim = groundtruth.LbrSimulator(t, br, self.pattern.branch_filter, self.nr, cum)
        # sampled at step i when the cost model's cycles pass a multiple of the period there (as simulate());
        # a threshold past the cycles of step n-1 waits for the next poll
        thresholds = np.arange(self._threshold, int(sim.cum_cost[n - 1]) + 1, self.period, dtype=np.int64)
        if not len(thresholds):
            return empty
        self._threshold = int(thresholds[-1]) + self.period
        points = np.unique(np.searchsorted(sim.cum_cost, thresholds))
        points = points[points > self._last]
        records = sample_records(sim, points, self.pattern, self.nr, self._last, self._samples)
        marks = np.array(self._marks, dtype=np.int64)
        records["hdr"]["time_ns"] = np.interp(points, marks[:, 0], marks[:, 1]).astype(np.int64)
        self._own = np.concatenate([self._own, host_samples(records)])
        if len(points):
            self._last = int(points[-1])
        self._samples += len(points)
        return records

    def host_samples(self) -> np.ndarray:
        own, self._own = self._own, np.empty(0, SAMPLE_DTYPE)
        return own

    def stats(self) -> dict[str, int]:
        return {"samples": self._samples, "instructions": self._marks[-1][0]}

    def disable(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        self.disable()

    def meta(self) -> dict:
        """As simulate()'s recording says it (lbr.recording.simulated_note reads it), so far."""
        stopped = self.trace.stopped if self.trace is not None else None
        return {"pattern": self.pattern.name, "simulated": True, "depth": self.nr, "period_cycles": self.period,
                "clock_hz": CLOCK_HZ, "instructions": self._marks[-1][0] if self._marks else 0,
                "stopped": stopped or self.error, "command": self.command[:16]}
