"""`vmprof-guest watch`: keep recording processes that start and exit during the host's recording.

A one-shot bundle only knows the processes alive when it is taken.  While the host
records, `watch` hooks process creation and exit (the paper hooks process exit),
captures each new process's command line and memory maps while it lives (again a
few times while young, since the dynamic loader maps libraries after exec), keeps
its object files open so they can be copied after it is gone, and records the
page-table root seen at exec and exit.  When the stop condition is met it takes a
final snapshot and writes one bundle with every process, live or exited.

Event sources, best first: BPF raw tracepoints sched_process_exec/fork/exit (also give
mm->pgd), the kernel's proc connector (netlink, standard library, needs root and
CONFIG_PROC_EVENTS), and polling /proc every 10 ms.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vmprof_guest import cr3, procfs
from vmprof_guest.assemble import Builder

if TYPE_CHECKING:
    from vmprof_guest.bpf import Event, Session

# Capture a new process at these ages (seconds), then every RESCAN_S while it lives.
CAPTURE_AGES = (0.0, 0.003, 0.010, 0.025, 0.060, 0.150, 0.400)
RESCAN_S = 2.0
POLL_S = 0.010


@dataclass
class Tracked:
    tgid: int
    source: str  # start | exec | fork | poll | end | event
    seen: float  # monotonic seconds
    comm: str = ""
    info: procfs.ProcInfo | None = None
    pgds: list[int] = field(default_factory=list)
    captures: int = 0
    next_capture: float = 0.0
    ended: str | None = None  # exit | exec (the image was replaced)
    begin_boot_ns: int | None = None
    exit_boot_ns: int | None = None

    def add_pgd(self, pgd: int) -> None:
        if pgd and pgd not in self.pgds:
            self.pgds.append(pgd)

    def record_info(self) -> procfs.ProcInfo:
        """What we know, even for a process that was gone before /proc could be read."""
        if self.info is not None:
            return self.info
        return procfs.ProcInfo(pid=self.tgid, name=self.comm, tids=[self.tgid])


@dataclass
class Stop:
    until_file: Path | None = None
    deadline: float | None = None
    signalled: bool = False

    @classmethod
    def parse(cls, value: str) -> Stop:
        try:
            seconds = float(value)
        except ValueError:
            return cls(until_file=Path(value))
        if seconds < 0:
            raise ValueError("--until SECONDS must not be negative")
        return cls(deadline=time.monotonic() + seconds)

    def reached(self) -> bool:
        if self.signalled:
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        return self.until_file is not None and self.until_file.exists()

    def describe(self) -> str:
        if self.until_file is not None:
            return f"until {self.until_file} exists"
        return f"for {max(0.0, (self.deadline or 0) - time.monotonic()):.1f} s"


class ProcConnector:
    """Process events from the kernel's proc connector (NETLINK_CONNECTOR, CN_IDX_PROC)."""

    NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC, LISTEN, IGNORE = 11, 1, 1, 1, 2
    FORK, EXEC, EXIT = 0x1, 0x2, 0x80000000

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, self.NETLINK_CONNECTOR)
        try:
            self.sock.bind((0, self.CN_IDX_PROC))
            self._send(self.LISTEN)
        except OSError:
            self.sock.close()
            raise

    def _send(self, op: int) -> None:
        payload = struct.pack("=I", op)
        cn = struct.pack("=IIIIHH", self.CN_IDX_PROC, self.CN_VAL_PROC, 0, 0, len(payload), 0) + payload
        self.sock.send(struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, os.getpid()) + cn)  # NLMSG_DONE

    def poll(self, timeout_s: float, handle: Callable[[str, int, int, int], None]) -> None:
        """handle(kind, tgid, pid, parent_tgid) for each event that arrives within timeout_s."""
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        while ready:
            try:
                data = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            pos = 0
            while pos + 16 <= len(data):
                length = struct.unpack_from("=I", data, pos)[0]
                if length < 16:
                    break
                self._parse(data[pos:pos + length], handle)
                pos += (length + 3) & ~3

    def _parse(self, msg: bytes, handle: Callable[[str, int, int, int], None]) -> None:
        if len(msg) < 52 + 8:
            return
        what = struct.unpack_from("=I", msg, 36)[0]
        if what == self.FORK and len(msg) >= 52 + 16:
            _ppid, ptgid, cpid, ctgid = struct.unpack_from("=IIII", msg, 52)
            handle("fork", ctgid, cpid, ptgid)
        elif what == self.EXEC:
            pid, tgid = struct.unpack_from("=II", msg, 52)
            handle("exec", tgid, pid, 0)
        elif what == self.EXIT:
            pid, tgid = struct.unpack_from("=II", msg, 52)
            handle("exit", tgid, pid, 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send(self.IGNORE)
        self.sock.close()


class Watcher:
    def __init__(self, builder: Builder, stop: Stop, use_bpf: bool = True, events: str = "auto",
                 log: Callable[[str], None] | None = None, pgd_methods: tuple[str, ...] = cr3.PGD_METHODS,
                 sched_window_s: float = 0.5, kallsyms: bytes | None = None) -> None:
        self.pgd_methods, self.sched_window_s = pgd_methods, sched_window_s
        self.kallsyms = kallsyms  # already read by the caller; cr3.collect would read it again
        self.builder = builder
        self.stop = stop
        self.use_bpf = use_bpf
        self.events = events  # auto | bpf | proc-connector | poll
        self.log = log or (lambda msg: print(f"vmprof-guest: {msg}", file=sys.stderr, flush=True))
        self.current: dict[int, Tracked] = {}
        self.finished: list[Tracked] = []
        self.session: Session | None = None
        self.connector: ProcConnector | None = None
        self.source = "poll"
        self.cr3: cr3.Cr3Result | None = None
        self.me = os.getpid()
        self.pending: list[Event] = []
        self.started = False  # the initial snapshot is done and the main loop runs
        self.bpf_failed = False

    # -- event handling ------------------------------------------------------------
    def _finish(self, t: Tracked, how: str, boot_ns: int | None = None) -> None:
        t.ended = t.ended or how
        t.exit_boot_ns = t.exit_boot_ns or boot_ns
        self.finished.append(t)

    def _begin(self, tgid: int, source: str, comm: str = "", pgd: int = 0, boot_ns: int | None = None,
               parent: int = 0, capture: bool = True) -> Tracked | None:
        if tgid == self.me:
            return None
        old = self.current.get(tgid)
        if old is not None and old.source == "start" and not self.started:
            # Seen by the initial snapshot and by an event queued before it: one process, not two.
            same = (source == "fork" or (source == "exec" and old.info is not None and old.info.name == comm[:15]))
            if same:
                old.add_pgd(pgd)
                old.source, old.begin_boot_ns = source, boot_ns
                return old
        if old is not None:
            self.current.pop(tgid)
            self._finish(old, "exec" if source == "exec" else "exit", boot_ns)
        t = Tracked(tgid=tgid, source=source, seen=time.monotonic(), comm=comm, begin_boot_ns=boot_ns)
        t.add_pgd(pgd)
        self.current[tgid] = t
        if source == "fork" and parent in self.current and self.current[parent].info is not None:
            # A forked child starts as a copy of its parent's address space.
            src = self.current[parent].info
            assert src is not None
            t.info = procfs.ProcInfo(pid=tgid, name=src.name, tids=[tgid], cmdline=src.cmdline, exe=src.exe,
                                     ppid=parent, start_ticks=0, maps=list(src.maps))
        if capture:
            self._capture(t)
        else:
            t.next_capture = time.monotonic() + CAPTURE_AGES[1]
        return t

    def _end(self, tgid: int, pgd: int = 0, boot_ns: int | None = None, comm: str = "") -> None:
        t = self.current.pop(tgid, None)
        if t is None:
            if tgid == self.me or not comm:
                return
            # Alive before the watch began and exited before we read it: keep what the event says.
            t = Tracked(tgid=tgid, source="event", seen=time.monotonic(), comm=comm)
        t.add_pgd(pgd)
        self._finish(t, "exit", boot_ns)

    def _handle_batch(self, batch: list[Event]) -> None:
        """Events in order; /proc is read for a new process only if it has not exec'd or exited since,
        else /proc would show the later image (or nothing)."""
        last_change = {e.tgid: i for i, e in enumerate(batch) if e.kind in ("exec", "exit")}
        for i, ev in enumerate(batch):
            changed = last_change.get(ev.tgid, -1) > i
            if ev.kind == "exec":
                self._begin(ev.tgid, "exec", ev.comm, ev.pgd, ev.boot_ns, capture=not changed)
            elif ev.kind == "fork" and ev.tgid != ev.ptgid and ev.pid == ev.tgid:
                self._begin(ev.tgid, "fork", ev.comm, ev.pgd, ev.boot_ns, parent=ev.ptgid, capture=not changed)
            elif ev.kind == "exit" and ev.pid == ev.tgid:
                self._end(ev.tgid, ev.pgd, ev.boot_ns, ev.comm)

    def on_bpf_event(self, ev: Event) -> None:
        self.pending.append(ev)

    def on_connector_event(self, kind: str, tgid: int, pid: int, ptgid: int) -> None:
        from vmprof_guest.bpf import Event

        comm = ""
        if kind == "exit" and tgid in self.current:
            comm = self.current[tgid].comm
        self.pending.append(Event(kind, tgid, pid, ptgid, 0, time.clock_gettime_ns(time.CLOCK_BOOTTIME), comm))

    def _drain(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            self._handle_batch(batch)

    def _capture(self, t: Tracked) -> None:
        info = procfs.read_process(t.tgid)
        now = time.monotonic()
        # the same process (not a reused pid); a forked child's copy of its parent has no start time
        same = info is not None and (t.info is None or not t.info.start_ticks
                                     or info.start_ticks == t.info.start_ticks)
        if same and (info.maps or t.info is None or not t.info.maps):
            t.info = info  # the latest complete view: libraries appear after exec, as the loader maps them
            self.builder.prepare(info)
        t.captures += 1
        age = now - t.seen
        later = [a for a in CAPTURE_AGES if a > age]
        t.next_capture = t.seen + later[0] if later else now + RESCAN_S

    def _recapture_due(self) -> None:
        now = time.monotonic()
        for t in list(self.current.values()):
            if now >= t.next_capture:
                self._capture(t)

    def _poll_proc(self) -> None:
        pids = set(procfs.list_pids())
        for tgid in pids - set(self.current) - {self.me}:
            self._begin(tgid, "poll")
        for tgid in set(self.current) - pids:
            self._end(tgid, 0, time.clock_gettime_ns(time.CLOCK_BOOTTIME))

    # -- the run -------------------------------------------------------------------
    def _open_events(self) -> None:
        notes = []
        if self.events in ("auto", "bpf") and self.use_bpf and not self.bpf_failed:
            from vmprof_guest import bpf

            try:
                if self.session is None:
                    self.session = bpf.Session.open()
                # Only the process hooks stay attached while the host measures: they run at fork,
                # exec and exit, never on system calls or context switches.
                self.session.detach_trigger()
                self.session.detach_switch()
                self.session.start_events(self.on_bpf_event)
                self.source = "bpf"
                return
            except bpf.BpfUnavailable as e:
                notes.append(f"BPF process events unavailable: {e}")
                if self.session is not None:
                    self.session.close()
                    self.session = None
        if self.events in ("auto", "proc-connector"):
            try:
                self.connector = ProcConnector()
                self.source = "proc-connector"
                for n in notes:
                    self.builder.note(n)
                self.builder.note("process events from the proc connector carry no mm->pgd: "
                                  "processes that start and end during the watch have no CR3")
                return
            except OSError as e:
                notes.append(f"proc connector unavailable: {e.strerror} (needs root and CONFIG_PROC_EVENTS)")
        self.source = "poll"
        for n in notes:
            self.builder.note(n)
        self.builder.note("processes were found by polling /proc every 10 ms; shorter-lived ones may be missing")

    def run(self) -> cr3.Cr3Result:
        old_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, lambda *_: setattr(self.stop, "signalled", True))
        try:
            if self.use_bpf and self.events in ("auto", "bpf"):
                from vmprof_guest import bpf

                try:
                    self.session = bpf.Session.open()
                except bpf.BpfUnavailable:
                    self.bpf_failed = True  # cr3.collect states the reason; events fall back without BPF
            self.cr3 = cr3.collect(use_bpf=self.use_bpf, session=self.session, pgd_methods=self.pgd_methods,
                                   sched_window_s=self.sched_window_s, kallsyms=self.kallsyms)
            self._open_events()
            self._initial_snapshot()
            self._wait_for_events()  # events queued meanwhile; merged with the snapshot's records
            self._drain()
            self.started = True
            how = self.cr3.method if self.cr3.page_offset_base is not None else "unavailable"
            self.log(f"watching (events: {self.source}; cr3: {how}) {self.stop.describe()}")
            while not self.stop.reached():
                self._wait_for_events()
                self._drain()
                self._recapture_due()
            self._wait_for_events(0)
            self._drain()
            return self.cr3
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)

    def _wait_for_events(self, timeout_s: float = POLL_S) -> None:
        if self.session is not None:
            self.session.poll_events(int(timeout_s * 1000))
        elif self.connector is not None:
            self.connector.poll(timeout_s, self.on_connector_event)
        elif self.started:
            time.sleep(timeout_s)
            self._poll_proc()

    def _initial_snapshot(self) -> None:
        assert self.cr3 is not None
        now = time.monotonic()
        for tgid, (pgd, comm) in self.cr3.pgds.items():
            if tgid != self.me:
                self.current[tgid] = t = Tracked(tgid=tgid, source="start", seen=now, comm=comm)
                t.add_pgd(pgd)
        for info in procfs.snapshot(with_maps=True):
            if info.pid == self.me:
                continue
            t = self.current.get(info.pid)
            if t is None:
                t = self.current[info.pid] = Tracked(tgid=info.pid, source="start", seen=now, comm=info.name)
            t.info = info
            t.next_capture = now + RESCAN_S
            self.builder.prepare(info)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        if self.connector is not None:
            self.connector.close()

    def finish(self) -> None:
        """Final snapshot, then one process record per tracked process (live or ended)."""
        assert self.cr3 is not None
        final: dict[int, int] = {}
        if self.session is not None:
            from vmprof_guest import bpf

            try:
                final = {tgid: pgd for tgid, (pgd, _comm) in self.session.leader_pgds(self.cr3.method).items()}
            except bpf.BpfUnavailable as e:
                self.builder.note(f"final CR3 walk failed ({e}); the values from the start of the watch stand")
        alive = set()
        for info in procfs.snapshot(with_maps=True):
            if info.pid == self.me:
                continue
            alive.add(info.pid)
            t = self.current.get(info.pid)
            if t is not None and t.info is not None and t.info.start_ticks and \
                    t.info.start_ticks != info.start_ticks:
                self.current.pop(info.pid)
                self._finish(t, "exit")  # the pid was reused
                t = None
            if t is None:
                t = self.current[info.pid] = Tracked(tgid=info.pid, source="end", seen=time.monotonic(),
                                                     comm=info.name)
            if info.maps or t.info is None:
                t.info = info
            t.add_pgd(final.get(info.pid, 0))
        for tgid in [k for k in self.current if k not in alive]:
            self._end(tgid)
        for t in [*self.finished, *self.current.values()]:
            info = t.record_info()
            if info.kernel_thread:
                roots: list[int] = []
            else:
                roots = []
                for pgd in t.pgds:
                    roots += [r for r in self.cr3.roots_for(pgd) if r not in roots]
            extra: dict = {"watch": t.source, "begin_boot_ns": t.begin_boot_ns}
            if t.ended:
                extra.update({"exited": True, "ended_by": t.ended, "exit_boot_ns": t.exit_boot_ns})
            self.builder.add_process(info, roots, extra)
