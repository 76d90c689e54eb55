"""`vmprof record`: write the chunks of one collection session into a recording until stopped.

Drain every 100 ms, flush (fsync) a chunk every 500 ms: a killed recorder loses at most the
unflushed half second.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.collect.session import Chunk, CollectionSession, read_kallsyms
from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import SAMPLE_GUEST
from vmprof_tui.record.recording import RecordingError
from vmprof_tui.record.writer import WriteFailed, Writer

DRAIN_S, FLUSH_S = 0.1, 0.5


@dataclass
class Progress:
    elapsed_s: float = 0.0
    samples: int = 0
    guest: int = 0
    lost: int = 0
    vms: list[str] = field(default_factory=list)

    def count_lost(self, lost: dict[str, list[int]]) -> None:
        self.lost = sum(sum(lost.get(k, [])) for k in ("samples", "sched", "stacks", "ustacks"))

    def summary(self) -> str:
        return f"samples {self.samples}, guest {self.guest}, lost {self.lost}, duration {self.elapsed_s:.1f}"


class Recorder:
    """Consumer of a CollectionSession that writes everything into one file."""

    def __init__(self, out: Path, session: CollectionSession, keep_old: bool = False) -> None:
        self.out = out
        self.keep_old = keep_old  # a file already at `out` becomes OUT.old (vmprof record), else it is replaced
        self.session = session
        self.progress = Progress()
        self.kept = (0, 0.0)  # (samples, seconds) synced to the file so far

    @property
    def attached(self):  # noqa: ANN201 - threading.Event
        return self.session.attached

    def run(self, duration_s: float | None, should_stop: Callable[[], bool],
            on_progress: Callable[[Progress], None] | None = None) -> Progress:
        session = self.session
        if session.vm_names:
            session.check_vm_names()  # before the file is created
        self.writer = Writer(self.out, session.meta(), self.keep_old, codec="auto")
        try:
            session.start()
        except Exception:
            self.writer.abandon(keep=False)
            raise
        failed: WriteFailed | None = None
        try:
            self._write(session.poll(), first=True)
            last_flush = last_progress = time.monotonic()
            while True:
                time.sleep(DRAIN_S)
                now = time.monotonic()
                done = should_stop() or (duration_s is not None and now - session.started_at >= duration_s)
                if done:
                    break
                self._write(session.poll())
                if now - last_flush >= FLUSH_S:
                    self._flush()
                    last_flush = now
                if on_progress and now - last_progress >= 1.0:
                    self.progress.count_lost(session.lost())
                    on_progress(self.progress)
                    last_progress = now
        except WriteFailed as e:
            failed = e
        finally:
            if failed is None:
                try:
                    self._finish(on_progress)
                except WriteFailed as e:
                    failed = e
        if failed is not None:
            raise RecordingError(self._abandon(failed)) from None
        return self.progress

    def _flush(self) -> None:
        self.writer.flush()
        self.kept = (self.progress.samples, self.progress.elapsed_s)

    def _abandon(self, failed: WriteFailed) -> str:
        """Stop sampling after a failed write (a full disk) and keep what was synced: the line that says so."""
        if self.session.started:
            with contextlib.suppress(Exception):  # the session's own trouble would hide the disk's
                self.session.finish()
        samples, seconds = self.kept
        self.writer.abandon(keep=samples > 0)
        if not samples:
            return f"{failed}; {self.writer.nothing_kept()}"
        return (f"{failed}; {self.out} keeps the first {seconds:.1f} s ({samples} samples), not the recording's end "
                "(totals, the host's kallsyms: host kernel functions stay unnamed); vmprof report reads it")

    def _write(self, chunk: Chunk, first: bool = False) -> None:
        w, session = self.writer, self.session
        if chunk.lbr is not None and len(chunk.lbr):
            w.add_lbr(chunk.lbr, session.lbr.nr, session.lbr.fields)
        w.add(chunk.samples, chunk.sched, chunk.stacks, chunk.host_stacks, chunk.ustacks)
        for vm in chunk.new_vms:
            if vm.bundle and Path(vm.bundle, "bundle.json").exists():
                w.add_bundle(vm.name, Path(vm.bundle))
        if first or chunk.new_vms:
            w.add_snapshot(recording.snapshot(vms=[vm.to_json() for vm in session.vms_seen.values()]))
        if chunk.processes:
            w.add_snapshot(recording.snapshot(processes=chunk.processes))
        p = self.progress
        p.elapsed_s = chunk.elapsed_s
        p.samples += len(chunk.samples)
        p.guest += int(np.count_nonzero(chunk.samples["flags"] & SAMPLE_GUEST))
        p.vms = sorted(vm.name for vm in session.vms_seen.values())

    def _finish(self, on_progress: Callable[[Progress], None] | None) -> None:
        lost: dict = {"samples": [], "sched": []}
        if self.session.started:
            chunk, lost = self.session.finish()
            self._write(chunk)
            self.progress.count_lost(lost)
        else:
            self.session.close()
        if on_progress:
            on_progress(self.progress)
        self._flush()  # the samples first: what a full disk would leave of the end below
        self.writer.add_snapshot(recording.snapshot(kallsyms=read_kallsyms()))
        self.writer.close({"duration_s": self.progress.elapsed_s, "samples": self.progress.samples,
                           "guest_samples": self.progress.guest, "lost": lost,
                           "end_monotonic_ns": time.monotonic_ns(),
                           "vmm_exits": self.session.vmm_exits,
                           recording.VMS_KEY: [vm.to_json() for vm in self.session.vms_seen.values()]})
