"""How much of a program's CPU time behaves like the memory loop (`vmprof predict measure --memory-probe`).

The compute term of an estimate scales the reference's CPU seconds by what the target takes for the same work.
A pure arithmetic loop sees a target's CPU share and clock; a program whose time goes to cache and TLB misses
also sees what the target does to its caches (a neighbour on the same CPU evicting them, a VM's two-level page
walks).  The model is linear: a share m of the program's CPU time scales like the memory loop (a pointer chase
over more than a core's L2, predict_costs.MemoryChain), the rest like the compute loop.  m is measured, not
guessed: the program and the memory loop each run alone and beside a neighbour on their CPU that evicts the
caches at every switch (a pointer chase over twice the loop's working set); if the loop is slowed by s_m and
the program by s_p, then s_p - 1 = m (s_m - 1), so m = (s_p - 1) / (s_m - 1), kept within 0..1.  Alone and
beside alternate, twice, and the medians are used, so that a drift of the machine falls on both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
from collections.abc import Iterator

from vmprof_tui.estimate import predict_costs
from vmprof_tui.estimate.predict import PredictError

ROUNDS = 2
MIN_LOOP_SLOWDOWN = 0.05  # below this the neighbour changed nothing measurable: no share can be found


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
    """A process on `cpu` chasing pointers through twice the memory loop's working set until killed."""
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {cpu})
            chain = predict_costs.MemoryChain(2 * predict_costs.MEMORY_BYTES, seed=38)
            while True:
                chain.run(1 << 22)
        finally:
            os._exit(0)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _program_cpu_s(argv: list[str], cpu: int) -> float:
    """The CPU seconds (user + system) of one uncounted run of argv pinned to `cpu`."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    except OSError as e:
        raise PredictError(f"predict measure --memory-probe: cannot run {argv[0]}: {e.strerror}") from None
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def memory_share(argv: list[str], chain: predict_costs.MemoryChain) -> dict[str, object]:
    """The reference.memory entry of a COUNTS file: share, the two slowdowns and how they were found."""
    cpu = min(os.sched_getaffinity(0))
    prog: dict[str, list[float]] = {"alone": [], "beside": []}
    loop: dict[str, list[float]] = {"alone": [], "beside": []}
    for _ in range(ROUNDS):
        for where in ("alone", "beside"):
            with _evicting_neighbour(cpu) if where == "beside" else contextlib.nullcontext():
                prog[where].append(_program_cpu_s(argv, cpu))
                with _pinned(cpu):
                    loop[where].append(predict_costs.time_memory_loop(3, 0.1, cpu_time=True, chain=chain).median)
    s_p = statistics.median(prog["beside"]) / max(statistics.median(prog["alone"]), 1e-9)
    s_m = statistics.median(loop["beside"]) / statistics.median(loop["alone"])
    share = min(1.0, max(0.0, (s_p - 1) / (s_m - 1))) if s_m - 1 >= MIN_LOOP_SLOWDOWN else 0.0
    return {"share": share, "program_slowdown": s_p, "loop_slowdown": s_m,
            "program_cpu_s": prog, "loop_s": loop,
            "method": "CPU time alone and beside a cache-evicting neighbour on the same CPU: "
                      "(program slowdown - 1) / (memory loop slowdown - 1)"}
