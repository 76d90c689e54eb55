"""What one operation costs on this machine (`vmprof predict costs`), run on or inside a target.

Every cost is wall time per operation, measured in loops long enough (``min_time`` per
repetition, many scheduler periods) that a CPU quota or a neighbour's share of the CPU shows
up in it as it would in a program's run time (or, with without_wait, wall time less the measuring thread's
wait for its CPU, that share kept apart as the costs' steal share).  The loops are a few lines of x86-64 machine
code (the assembly source is in cost_code.py; ``tests/test_predict.py`` reassembles it and compares),
called through ctypes from an executable mapping, so no interpreter overhead sits inside a
measured loop, no compiler is needed on the target, and the compute loop has a known number
of instructions per iteration (4).  Process creation and exec are measured from a minimal
static ELF written at run time (cost_code.forker_elf), so that fork copies a small process,
as make or a shell would, not this Python interpreter.
"""

from __future__ import annotations

import contextvars
import ctypes
import mmap
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from vmprof_tui.estimate.cost_code import PAGE, forker_elf, snippets
from vmprof_tui.estimate.machine import cgroup_cpu_limit, machine_description, my_schedstat, wait_share
from vmprof_tui.estimate.predict import COST_NAMES, Costs, CostStat, PredictError

NR_PREAD64, NR_PWRITE64 = 17, 18
MADV_NOHUGEPAGE = 15


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise PredictError(f"predict costs: {what} failed: {os.strerror(-rc) if rc > -4096 else rc}")


# ---------------------------------------------------------------------------
# the timing discipline


def _stat(values: list[float]) -> CostStat:
    return CostStat(median=statistics.median(values), min=min(values), max=max(values), repeat=len(values))


def _calibrate(run: Callable[[int], float], min_time: float, start: int = 16) -> int:
    """Operations per chunk so that one chunk takes about min_time / 4."""
    n = start
    while True:
        dt = run(n)
        if dt >= min_time / 16 or n >= 1 << 40:
            return max(1, int(n * (min_time / 4) / max(dt, 1e-9)))
        n *= 4


def _repeat(chunk: Callable[[], tuple[float, int]], repeat: int, min_time: float) -> CostStat:
    """Per repetition, chunks until min_time of measured time: seconds per operation."""
    values = []
    for _ in range(repeat):
        total, ops = 0.0, 0
        while ops == 0 or total < min_time:
            dt, n = chunk()
            total += dt
            ops += n
        values.append(total / ops)
    return _stat(values)


def wait_free_clock() -> float:
    """Wall time less this thread's run-queue wait so far: what a loop takes with its CPU to itself (the wait,
    other work's share of the CPU, is then a term of its own, as a VM's steal is)."""
    return time.perf_counter() - my_schedstat()[1] / 1e9


# the clock of the operation costs, set by measure_costs/measure_probe for their own run (a context variable:
# a measurement in another thread keeps its own)
_clock: contextvars.ContextVar[Callable[[], float]] = contextvars.ContextVar("clock", default=time.perf_counter)


def _now() -> float:
    return _clock.get()()


def _timed(fn: Callable[..., int], *args: int, check: bool = True, clock: Callable[[], float] = _now) -> float:
    t0 = clock()
    rc = fn(*args)
    dt = clock() - t0
    if check:
        _check(rc, "a measurement loop")
    return dt


def _loop_cost(fn: Callable[..., int], args: tuple[int, ...], repeat: int, min_time: float,
               check: bool = True, clock: Callable[[], float] = _now) -> CostStat:
    n = _calibrate(lambda k: _timed(fn, k, *args, check=check, clock=clock), min_time)
    return _repeat(lambda: (_timed(fn, n, *args, check=check, clock=clock), n), repeat, min_time)


# ---------------------------------------------------------------------------
# the operations


def time_compute_loop(repeat: int = 5, min_time: float = 0.2, cpu_time: bool = False) -> CostStat:
    """Seconds per iteration of the compute loop (4 instructions: add, xor, sub, jnz): wall time on a target
    (a quota, steal or a neighbour's share belongs in it), or this thread's CPU time for a reference, whose
    counted CPU seconds it is the yardstick of (other work on its CPU must not stretch it)."""
    clock = time.thread_time if cpu_time else _now
    return _loop_cost(snippets().compute_loop, (), repeat, min_time, check=False, clock=clock)  # returns its sum


MEMORY_BYTES, LINE = 4 << 20, 64  # the memory loop's working set: above a core's L2, within the L3


class MemoryChain:
    """A random cycle through the cache lines of MEMORY_BYTES (each line holds the address of the next), in a
    mapping of small pages (huge pages refused: a target's TLB misses are part of what the loop measures)."""

    def __init__(self, size: int = MEMORY_BYTES, seed: int = 37) -> None:
        import numpy as np

        self._mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._mem.madvise(MADV_NOHUGEPAGE)
        lines = size // LINE
        order = np.random.default_rng(seed).permutation(lines)
        words = np.frombuffer(self._mem, dtype=np.uint64)
        self.start = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
        words[order * (LINE // 8)] = self.start + np.roll(order, -1).astype(np.uint64) * LINE
        del words

    def run(self, n: int) -> int:
        return snippets().memory_loop(n, self.start)


def time_memory_loop(repeat: int = 5, min_time: float = 0.2, cpu_time: bool = False,
                     chain: MemoryChain | None = None) -> CostStat:
    """Seconds per load of the memory loop (a pointer chase over MEMORY_BYTES): the clock as time_compute_loop's."""
    clock = time.thread_time if cpu_time else _now
    c = chain or MemoryChain()
    return _loop_cost(lambda n: c.run(n), (), repeat, min_time, check=False, clock=clock)


def _faults() -> tuple[int, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_majflt


def _minor_fault_chunk(pages: int) -> tuple[float, int]:
    """A page's life in a program: the first write faults it in (zeroed), and it is freed at munmap
    or exit.  Both are timed (mmap/munmap calls amortised over `pages`)."""
    t0 = _now()
    m = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(MADV_NOHUGEPAGE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        f0 = _faults()[0]
        snippets().touch_write(addr, pages, PAGE)
        faults = _faults()[0] - f0
    finally:
        m.close()
    dt = _now() - t0
    if faults < pages:
        raise PredictError(f"predict costs: touching {pages} fresh pages made only {faults} minor faults "
                           "(transparent huge pages?)")
    return dt, faults


def _write_pass(fd: int, buf: ctypes.Array, size: int, length: int) -> tuple[float, int]:
    """A written page's life in a program: appended to an empty file (a new page-cache page, as
    an output, object or temporary file gets) and freed when the file is truncated; both timed.
    Overwriting pages already cached would be cheaper than what programs mostly do."""
    n = length // size
    t0 = _now()
    rc = snippets().rw_loop(n, fd, ctypes.addressof(buf), size, NR_PWRITE64, length)
    os.ftruncate(fd, 0)
    dt = _now() - t0
    _check(rc, "the write loop")
    return dt, n


class _MajorFaults:
    """Reads of a file's pages through a mapping after its cache was dropped (posix_fadvise
    DONTNEED; MADV_RANDOM stops read-ahead, so each page is one fault and one disk read)."""

    def __init__(self, path: Path, pages: int) -> None:
        self.pages = pages
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(self.fd, os.urandom(PAGE) * pages)
        os.fsync(self.fd)

    def chunk(self) -> tuple[float, int]:
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        # writable only so that ctypes can take its address; the pages are only read
        m = mmap.mmap(self.fd, self.pages * PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            m.madvise(mmap.MADV_RANDOM)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            f0 = _faults()[1]
            t0 = _now()
            snippets().touch_read(addr, self.pages, PAGE)
            dt = _now() - t0
            majors = _faults()[1] - f0
        finally:
            m.close()
        return dt, majors

    def close(self) -> None:
        os.close(self.fd)


def _process_cost(exe: Path, argc: int, iterations: int, repeat: int, min_time: float) -> CostStat:
    """Seconds per (fork, [exec,] exit, wait) of the minimal static process, its own start subtracted."""
    argv_base = [str(exe)]
    argv = [str(exe), *(["x"] * (argc - 1))]

    def run(args: list[str]) -> float:
        t0 = _now()
        rc = subprocess.run(args, stdin=subprocess.DEVNULL).returncode
        dt = _now() - t0
        if rc != 0:
            raise PredictError(f"predict costs: the fork/exec measurement program exited with status {rc}")
        return dt

    def chunk() -> tuple[float, int]:
        return max(run(argv) - run(argv_base), 1e-9), iterations

    return _repeat(chunk, repeat, min_time)


def _context_switch(repeat: int, min_time: float) -> CostStat:
    """Half a pipe round trip between two processes on one CPU, minus the 1-byte write and read
    it contains (timed in one process on one pipe, where nothing blocks)."""
    s = snippets()
    buf = ctypes.create_string_buffer(8)
    addr = ctypes.addressof(buf)
    r, w = os.pipe()
    # wall time even without wait: the partner's turn on the shared CPU is a run-queue wait of this thread
    base = _loop_cost(s.pingpong, (r, w, addr, 1), repeat, min_time, clock=time.perf_counter)  # no switch
    os.close(r)
    os.close(w)
    cpus = os.sched_getaffinity(0)
    one = {min(cpus)}
    os.sched_setaffinity(0, one)
    try:
        a_r, a_w = os.pipe()
        b_r, b_w = os.pipe()
        # the partner answers `n` round trips per request; requests are counts on a control pipe
        c_r, c_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(c_w)
                while True:
                    head = os.read(c_r, 8)
                    if len(head) < 8:
                        break
                    n = int.from_bytes(head, "little")
                    if s.pingpong(n, a_r, b_w, addr, 0) < 0:
                        break
            finally:
                os._exit(0)
        os.close(c_r)
        try:
            def rounds(n: int) -> float:
                os.write(c_w, n.to_bytes(8, "little"))
                return _timed(s.pingpong, n, b_r, a_w, addr, 1, clock=time.perf_counter)

            n = _calibrate(rounds, min_time)
            trips = _repeat(lambda: (rounds(n), n), repeat, min_time)
        finally:
            os.close(c_w)
            os.waitpid(pid, 0)
            for fd in (a_r, a_w, b_r, b_w):
                os.close(fd)
    finally:
        os.sched_setaffinity(0, cpus)
    half = [(t - base.median) / 2 for t in (trips.median, trips.min, trips.max)]
    return CostStat(median=max(half[0], 1e-9), min=max(half[1], 1e-9), max=max(half[2], 1e-9), repeat=trips.repeat)


def _write_sync_chunk(fd: int, buf: ctypes.Array) -> tuple[float, int]:
    """A 4 KiB overwrite made durable (pwrite64 + fdatasync), as a database's journal and pages are: a wait for
    the disk, long beside the interpreter's microsecond around it."""
    t0 = _now()
    for _ in range(8):
        os.pwrite(fd, bytes(buf[:4096]), 0)
        os.fdatasync(fd)
    return _now() - t0, 8


def measure_costs(name: str | None = None, directory: Path | None = None, repeat: int = 5, min_time: float = 0.2,
                  progress: Callable[[str, CostStat], None] | None = None, without_wait: bool = False) -> Costs:
    """Time one of each operation here.  `directory` holds the files read, written and faulted in
    (a disk file system: on tmpfs there are no major faults).  without_wait: each cost is timed on
    wait_free_clock (context_switch excepted) and the wait share of the whole run is the costs' steal share, a
    term of its own in an estimate (as a VM's costs are without its steal)."""
    if repeat < 1 or min_time <= 0:
        raise PredictError("predict costs: --repeat must be at least 1 and --min-time positive")
    s = snippets()
    parent = directory or Path("/var/tmp")
    try:
        work = Path(tempfile.mkdtemp(prefix="vmprof-costs-", dir=parent))
    except OSError as e:
        raise PredictError(f"predict costs: cannot create a scratch directory in {parent}: {e.strerror}") from None
    notes: list[str] = []
    out: dict[str, CostStat] = {}

    def done(key: str, stat: CostStat) -> None:
        out[key] = stat
        if progress:
            progress(key, stat)

    files: list[int] = []
    clock_set = _clock.set(wait_free_clock if without_wait else time.perf_counter)
    try:
        sched0 = my_schedstat()  # the wait around the compute loop: the part of the costs that scales CPU time
        done("compute_loop", time_compute_loop(repeat, min_time))
        done("memory_loop", time_memory_loop(repeat, min_time))
        steal = wait_share(sched0, my_schedstat())
        done("null_syscall", _loop_cost(s.null_loop, (), repeat, min_time))
        small = work / "open-me"
        small.write_bytes(b"x")
        path_buf = ctypes.create_string_buffer(bytes(small))
        done("open_close", _loop_cost(s.open_close_loop, (ctypes.addressof(path_buf),), repeat, min_time))
        big = 64 << 20
        rbuf = ctypes.create_string_buffer(65536)
        rfd = os.open(work / "read-me", os.O_RDWR | os.O_CREAT, 0o600)
        files.append(rfd)
        os.write(rfd, os.urandom(1 << 20) * (big >> 20))
        wfd = os.open(work / "write-me", os.O_WRONLY | os.O_CREAT, 0o600)
        files.append(wfd)
        for size in (4096, 65536):
            args = (rfd, ctypes.addressof(rbuf), size, NR_PREAD64, big)
            done(f"read_{size >> 10}k", _loop_cost(s.rw_loop, args, repeat, min_time))
        for size in (4096, 65536):
            done(f"write_{size >> 10}k", _repeat(lambda size=size: _write_pass(wfd, rbuf, size, big), repeat, min_time))
        done("mmap_munmap", _loop_cost(s.mmap_loop, (65536,), repeat, min_time))
        exe = work / "forker"
        exe.write_bytes(forker_elf(1))
        exe.chmod(0o700)
        t_one = min(_process_cost(exe, 2, 1, 1, 0.0).median for _ in range(3))  # one fork, roughly
        iters = max(10, min(100_000, int(min_time / 4 / max(t_one, 1e-6))))
        exe.write_bytes(forker_elf(iters))
        done("fork_exit", _process_cost(exe, 2, iters, repeat, min_time))
        done("fork_exec_exit", _process_cost(exe, 3, iters, repeat, min_time))
        done("minor_fault", _repeat(lambda: _minor_fault_chunk(4096), repeat, min_time))
        major = _MajorFaults(work / "fault-me", 2048)
        try:
            probe_dt, probe_n = major.chunk()
            if probe_n < major.pages // 2:
                notes.append(f"dropping the page cache of a file in {parent} did not give major faults "
                             f"({probe_n} of {major.pages} pages; tmpfs?): major_fault is a page read from cache")
                done("major_fault", _repeat(lambda: _ratio_chunk(major.chunk, major.pages), repeat, min_time))
            else:
                done("major_fault", _repeat(major.chunk, repeat, min_time))
        finally:
            major.close()
        done("write_sync", _repeat(lambda: _write_sync_chunk(wfd, rbuf), repeat, min_time))
        done("context_switch", _context_switch(repeat, min_time))
        if without_wait:
            steal = wait_share(sched0, my_schedstat())
    finally:
        _clock.reset(clock_set)
        for fd in files:
            os.close(fd)
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    assert set(out) == {*COST_NAMES, "memory_loop", "write_sync"}
    target = {"name": name or os.uname().nodename, **machine_description(), **cgroup_cpu_limit(),
              "steal_share": steal, **({"costs_exclude_steal": True} if without_wait else {}),
              "affinity": sorted(os.sched_getaffinity(0)), "repeat": repeat, "min_time_s": min_time}
    return Costs(target=target, costs=out, notes=notes)


def measure_probe(repeat: int = 3, min_time: float = 0.1) -> Costs:
    """The target's state now (`predict costs --probe`): the compute and memory loops on the wait-free clock and
    the wait share over them, for with_probe just before a run."""
    sched0, clock_set = my_schedstat(), _clock.set(wait_free_clock)
    try:
        out = {"compute_loop": time_compute_loop(repeat, min_time), "memory_loop": time_memory_loop(repeat, min_time)}
    finally:
        _clock.reset(clock_set)
    target = {"name": os.uname().nodename, **machine_description(), "probe": True, "costs_exclude_steal": True,
              "steal_share": wait_share(sched0, my_schedstat()), "affinity": sorted(os.sched_getaffinity(0)),
              "repeat": repeat, "min_time_s": min_time}
    return Costs(target=target, costs=out)


def _ratio_chunk(chunk: Callable[[], tuple[float, int]], pages: int) -> tuple[float, int]:
    dt, _ = chunk()
    return dt, pages
