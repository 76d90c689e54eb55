"""The flat stack formats of `vmprof report` (collapsed, pprof, speedscope, svg without call stacks) of a recording
read a piece at a time: what they read beyond the profiles, summed like the profiles' rows (analyse/stream.py).

Their stacks are the profile's rows (show/stacks.py), and at the host level each VM's row is split into the rows
of its vCPU threads' samples (guest functions, and the VMM or KVM working for a vCPU: analysis.vm_rows).  Those
rows add across pieces as any rows do: per VMM process, its vCPU threads' samples by name code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.analysis import Analysis, kernel_mode
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import Row
from vmprof_tui.analyse.stream import PIECE_ROWS, StreamedAnalysis, _Rows
from vmprof_tui.collect import backends
from vmprof_tui.record.stream import Scanned


class StreamedStacks(StreamedAnalysis):
    """A StreamedAnalysis that also sums, at the host level, the rows of each VM's vCPU threads (vm_rows)."""

    split_vm_rows = True  # False: not summed (a subclass whose report reads no vm_rows)

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None, level: str = "host",
                 vm: str | None = None, piece_rows: int = PIECE_ROWS,
                 keep: Callable[[np.ndarray], np.ndarray] | None = None, kernel: bool = True,
                 cpu: int | None = None, time_range: tuple[float, float] | None = None) -> None:
        self.vm_parts: dict[int, tuple[int, _Rows]] = {}  # VMM pid -> its vCPU threads' samples: count, rows
        meta = scanned.rec.meta
        self.frequency = int(meta.get("frequency", 1000))  # what pprof's comments say of the sampling
        self.backend = meta.get("backend", backends.NONE)
        super().__init__(scanned, guest_bundles, level, vm, piece_rows, keep, kernel, cpu=cpu, time_range=time_range)

    def _add(self, an: Analysis, lo: int) -> None:
        super()._add(an, lo)
        if self.level != "host" or not self.split_vm_rows:
            return
        s = an.samples
        vmm = np.array(sorted(an.vm_by_pid), np.int64)
        on = an.in_vm if self.cpu is None else an.in_vm & (s["cpu"] == self.cpu)
        sel = np.flatnonzero(on & arrays.member(s["pid"].astype(np.int64), vmm))
        by_pid = dict(arrays.group_by(s["pid"], sel))
        groups = list(by_pid.values())
        if self.kernel:
            groups += [g[kernel_mode(s["flags"][g])] for g in groups]
        rows = an.row_counts_of(groups) if groups else []
        for i, (pid, g) in enumerate(by_pid.items()):
            count, summed = self.vm_parts.get(pid, (0, _Rows()))
            summed.add(rows[i], rows[i + len(by_pid)] if self.kernel else None)
            self.vm_parts[pid] = (count + len(g), summed)

    def vm_rows(self, row: Row, cpu: int | None) -> list[Row]:
        """analysis.vm_rows: a host-level VM row split into the rows of its vCPU threads' samples; [row] when
        they do not add up to it."""
        if row.kind is not RowKind.VM or row.pid is None or cpu != self.cpu or row.pid not in self.vm_parts:
            return [row]
        count, summed = self.vm_parts[row.pid]
        if count != int(round(row.samples)):
            return [row]
        return self._rows(summed, self.vm_by_pid.get(row.pid), by_vm=False)
