"""How much of a program's CPU time behaves like the memory loop (`vmprof predict measure --memory-probe`).

The compute term of an estimate scales the reference's CPU seconds by what the target takes for the same work.
A pure arithmetic loop sees a target's CPU share and clock; a program whose time goes to cache and TLB misses
also sees what the target does to its caches (a neighbour on the same CPU evicting them, a VM's two-level page
walks).  The model is linear: a share m of the program's CPU time scales like the memory loop (a pointer chase
over more than a core's L2, predict_costs.MemoryChain), the rest like the compute loop.  m is measured, not
guessed: the program and the memory loop each run alone and beside a neighbour on their CPU that evicts the
caches at every switch (it writes a byte of every cache line of twice the L3, over and over: a stream, which
the prefetchers make fast, so a time slice of it sweeps the whole L3, where a pointer chase as the neighbour
evicts only a small part of it per slice); if the loop is slowed by s_m and
the program by s_p, then s_p - 1 = m (s_m - 1), so m = (s_p - 1) / (s_m - 1), kept within 0..1.  Alone and
beside alternate, twice (up to five times while the loop is not slowed 1.5x: the L3 was busy with the machine's
other work even for the loop alone), so that a drift of the machine falls on both, and the fastest of each is used: the
machine's other tenants share the L3 and only ever slow a run (docs/predict.md: how far, measured here).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from vmprof_tui.estimate import predict_costs
from vmprof_tui.estimate.predict import PredictError

ROUNDS, MAX_ROUNDS = 2, 5  # more rounds while the loop alone has not had a moment with its lines in the L3
MIN_LOOP_SLOWDOWN = 0.5  # below this the eviction did not happen (or the loop missed the L3 alone): no share
NEIGHBOUR_BYTES = 64 << 20  # the evicting neighbour's working set where the L3's size cannot be read


def neighbour_bytes(cpu: int) -> int:
    """Twice the L3 of `cpu` (sysfs), so that a time slice of the neighbour's stream evicts all of it."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache/index3/size").read_text().strip()
        size = int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text)
    except (OSError, ValueError, IndexError, KeyError):
        return NEIGHBOUR_BYTES
    return max(2 * size, 1 << 20)


@contextlib.contextmanager
def _pinned(cpu: int) -> Iterator[None]:
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


@contextlib.contextmanager
def _evicting_neighbour(cpu: int) -> Iterator[None]:
    """A process on `cpu` writing a byte of every cache line of twice its L3, over and over, until killed;
    ready once its first sweep (which also faults its pages in) is done."""
    size = neighbour_bytes(cpu)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.sched_setaffinity(0, {cpu})
            mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
            touch = predict_costs.snippets().touch_write
            touch(addr, size // predict_costs.LINE, predict_costs.LINE)
            os.write(ready_w, b"1")
            while True:
                touch(addr, size // predict_costs.LINE, predict_costs.LINE)
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        if os.read(ready_r, 1) != b"1":
            raise PredictError("predict measure --memory-probe: the cache-evicting neighbour did not start")
        yield
    finally:
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _program_cpu_s(argv: list[str], cpu: int) -> float:
    """The CPU seconds (user + system) of one uncounted run of argv pinned to `cpu`."""
    try:
        with _pinned(cpu):  # the child inherits the affinity (no preexec_fn in a process with threads)
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        raise PredictError(f"predict measure --memory-probe: cannot run {argv[0]}: {e.strerror}") from None
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise PredictError(f"predict measure --memory-probe: {argv[0]} exited with status {p.returncode} "
                           "(the probe times whole runs: run a command that succeeds)")
    return ru.ru_utime + ru.ru_stime


def memory_share(argv: list[str], chain: predict_costs.MemoryChain) -> dict[str, object]:
    """The reference.memory entry of a COUNTS file: share, the two slowdowns and how they were found."""
    cpu = min(os.sched_getaffinity(0))
    prog: dict[str, list[float]] = {"alone": [], "beside": []}
    loop: dict[str, list[float]] = {"alone": [], "beside": []}
    rounds = 0
    while rounds < ROUNDS or (rounds < MAX_ROUNDS and min(loop["beside"]) / min(loop["alone"]) < 1 + MIN_LOOP_SLOWDOWN):
        rounds += 1
        for where in ("alone", "beside"):
            with _evicting_neighbour(cpu) if where == "beside" else contextlib.nullcontext():
                prog[where].append(_program_cpu_s(argv, cpu))
                with _pinned(cpu):
                    loop[where].append(predict_costs.time_memory_loop(5, 0.05, cpu_time=True, chain=chain).min)
    s_p = min(prog["beside"]) / max(min(prog["alone"]), 1e-9)
    s_m = min(loop["beside"]) / min(loop["alone"])
    share = min(1.0, max(0.0, (s_p - 1) / (s_m - 1))) if s_m - 1 >= MIN_LOOP_SLOWDOWN else 0.0
    return {"share": share, "program_slowdown": s_p, "loop_slowdown": s_m, "rounds": rounds,
            "program_cpu_s": prog, "loop_s": loop,
            "method": "CPU time alone and beside a cache-evicting neighbour on the same CPU: "
                      "(program slowdown - 1) / (memory loop slowdown - 1)"}
