"""Counting one run of a command and its children (`vmprof predict measure`).

* System calls by number, with bytes moved by read/write-like calls: bpf/syscalls.bpf.c, raw
  tracepoints sys_enter/sys_exit, for the tgids of the tree (filled from sched_process_fork).
* Page faults, context switches, user and system CPU time: the rusage wait4 returns for the
  command, which includes every descendant that was waited for (getrusage RUSAGE_CHILDREN
  semantics; a process orphaned and reaped by init is missed: see docs/predict.md).
* Compute: the PMU's `instructions` counter (user mode, inherited by children) where a PMU
  exists; exact ptrace single-stepping of every task of the tree when asked (the paper's
  method; slow, small programs only: docs/performance.md); otherwise the user CPU time.
* The reference's speed: the compute loop of predict_costs, timed here before the run, so
  that a target's costs give a ratio (counts and costs need not come from one machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import statistics
import time
from dataclasses import dataclass

from vmprof_tui.collect.bpf import BPF_DIR
from vmprof_tui.estimate import predict_costs
from vmprof_tui.estimate.machine import machine_description
from vmprof_tui.estimate.predict import (
    BYTE_CALLS,
    COMPUTE_PMU,
    COMPUTE_PTRACE,
    COMPUTE_USER_CPU,
    Counts,
    PredictError,
    SyscallCount,
)
from vmprof_tui.estimate.syscall_names import syscall_name, syscall_names
from vmprof_tui.libc import LIBC

BPF_FILE = BPF_DIR / "syscalls.bpf.c"
NR_SLOTS = 512


@dataclass
class Run:
    status: int  # exit status, or -signal
    wall_s: float
    rusage: os.struct_rusage | None  # None only if the child could not be waited for
    instructions: int | None = None


def resolve_command(argv: list[str]) -> str:
    """The executable argv[0] names, as execvp would find it; PredictError if none."""
    if not argv:
        raise PredictError("predict measure: no command given (put it after --)")
    name = argv[0]
    if "/" in name:
        if not os.path.exists(name):
            raise PredictError(f"predict measure: command not found: {name}")
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise PredictError(f"predict measure: not an executable file: {name}")
        return os.path.abspath(name)
    found = shutil.which(name)
    if not found:
        raise PredictError(f"predict measure: command not found: {name}")
    return found


# ---------------------------------------------------------------------------
# the BPF syscall counter


class SyscallCounter:
    """bpf/syscalls.bpf.c loaded with bcc: per-number calls and bytes of the tracked tree."""

    def __init__(self) -> None:
        from vmprof_tui.collect.backends import BackendError, load_backend
        from vmprof_tui.collect.bpf import CollectError, _import_bcc, check_privileges, kernel_build_dir

        try:
            check_privileges()
            bcc = _import_bcc()
        except CollectError as e:
            raise PredictError(f"predict measure: counting system calls with BPF: {e}") from None
        if not kernel_build_dir().exists():
            raise PredictError(f"predict measure: bcc needs a kernel headers tree at {kernel_build_dir()}: "
                               "run tools/bootstrap.sh")
        try:
            tgid_offset = load_backend().offsets["TASK_TGID"]
        except (BackendError, KeyError) as e:
            raise PredictError(f"predict measure: cannot find task_struct.tgid in the kernel's BTF: {e}") from None
        try:
            self.bpf = bcc.BPF(text=BPF_FILE.read_text(),
                               cflags=[f"-DTASK_TGID={tgid_offset}", f"-DNR_SLOTS={NR_SLOTS}"])
        except Exception as e:  # noqa: BLE001 - bcc raises bare Exception on compile/load errors
            raise PredictError(f"predict measure: loading bpf/syscalls.bpf.c failed: {str(e).splitlines()[0]}") \
                from None
        self.names = syscall_names()
        flags = self.bpf["byte_nrs"]
        by_name = {v: k for k, v in self.names.items()}
        for name in BYTE_CALLS:
            if name in by_name and by_name[name] < NR_SLOTS:
                flags[ctypes.c_int(by_name[name])] = ctypes.c_uint8(1)

    def track(self, tgid: int) -> None:
        self.bpf["tracked"][ctypes.c_uint32(tgid)] = ctypes.c_uint8(1)

    def read(self) -> tuple[dict[str, SyscallCount], int, int, int]:
        """(syscalls by name, processes created, threads created, children missed)."""
        out: dict[str, SyscallCount] = {}
        table = self.bpf["counts"]
        for nr in range(NR_SLOTS):
            per_cpu = table[ctypes.c_int(nr)]
            calls = sum(v.calls for v in per_cpu)
            if calls:
                name = syscall_name(nr, self.names) if nr < NR_SLOTS - 1 else "syscall_other"
                out[name] = SyscallCount(nr=nr, calls=calls, bytes=sum(v.bytes for v in per_cpu))
        forks = self.bpf["forks"]
        procs = sum(forks[ctypes.c_int(0)])
        threads = sum(forks[ctypes.c_int(1)])
        dropped = sum(self.bpf["dropped"][ctypes.c_int(0)])
        return out, int(procs), int(threads), int(dropped)

    def reset(self) -> None:
        for name in ("counts", "forks", "dropped"):
            self.bpf[name].clear()
        self.bpf["tracked"].clear()

    def close(self) -> None:
        self.bpf.cleanup()


# ---------------------------------------------------------------------------
# the PMU instructions counter


def open_instructions_counter(pid: int) -> int:
    """A user-mode `instructions` counter on `pid`, inherited by its children, enabled at its exec."""
    from vmprof_tui.collect import perf_event as cap

    attr = cap.make_attr(cap.PERF_COUNT_HW_INSTRUCTIONS, user_only=True, disabled=True)
    attr.flags |= (1 << 1) | (1 << 12)  # inherit, enable_on_exec
    attr.read_format = 0  # with inherit, only the plain value may be read
    return cap.perf_event_open(attr, pid=pid, cpu=-1)


def pmu_instructions_available() -> bool:
    from vmprof_tui.collect import perf_event as cap

    try:
        fd = cap.perf_event_open(cap.make_attr(cap.PERF_COUNT_HW_INSTRUCTIONS), pid=0, cpu=-1)
    except OSError:
        return False
    os.close(fd)
    return True


# ---------------------------------------------------------------------------
# ptrace: exact single-step counting of every task of the tree


PTRACE_TRACEME, PTRACE_SINGLESTEP, PTRACE_SETOPTIONS, PTRACE_GETEVENTMSG = 0, 9, 0x4200, 0x4201
PTRACE_O_TRACEFORK, PTRACE_O_TRACEVFORK, PTRACE_O_TRACECLONE, PTRACE_O_TRACEEXEC = 2, 4, 8, 16
PTRACE_O_EXITKILL = 1 << 20
EVENT_FORK, EVENT_VFORK, EVENT_CLONE, EVENT_EXEC = 1, 2, 3, 4
WALL = 0x40000000


def _libc() -> ctypes.CDLL:
    return LIBC


def _single_step_tree(root: int, max_steps: int) -> tuple[int, int, os.struct_rusage]:
    """Step every task of the tree rooted at `root` (stopped at its exec) to the end.
    Returns (instructions, root's wait status, root's rusage).  A stop that is a trap after
    a step counts one retired user instruction (a `rep` string instruction traps once per
    iteration: counted per iteration), and so does each task's exit (its last instruction, the
    exit syscall, retires but the task is gone before the trap); fork/clone/exec event stops, the
    new tasks' first SIGSTOP and signal-delivery stops do not count."""
    libc = _libc()
    opts = PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL
    if libc.ptrace(PTRACE_SETOPTIONS, root, None, ctypes.c_void_p(opts)) != 0:
        raise PredictError(f"predict measure: PTRACE_SETOPTIONS failed: {os.strerror(ctypes.get_errno())}")
    live = {root}
    started: set[int] = {root}
    steps = 0
    root_status, root_usage = 0, None
    msg = ctypes.c_ulong()
    libc.ptrace(PTRACE_SINGLESTEP, root, None, None)
    while live:
        tid, status, usage = os.wait4(-1, WALL)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            if os.WIFEXITED(status):
                steps += 1  # the exit syscall instruction retired; the task ended before its trap
            live.discard(tid)
            if tid == root:
                root_status, root_usage = status, usage
            continue
        if not os.WIFSTOPPED(status):
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        deliver = 0
        if event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
            libc.ptrace(PTRACE_GETEVENTMSG, tid, None, ctypes.byref(msg))
            live.add(msg.value)
        elif event == EVENT_EXEC:
            pass
        elif tid not in started:  # a new task's first stop (SIGSTOP)
            started.add(tid)
            live.add(tid)
        elif sig == signal.SIGTRAP:
            steps += 1
            if steps > max_steps:
                for t in live:
                    with contextlib.suppress(OSError):
                        os.kill(t, signal.SIGKILL)
                raise PredictError(f"predict measure: more than {max_steps:,} instructions to single-step "
                                   "(about 20 us each): use --instructions user-cpu, or raise --max-steps")
        else:
            deliver = sig
        started.add(tid)
        libc.ptrace(PTRACE_SINGLESTEP, tid, None, ctypes.c_void_p(deliver))
    assert root_usage is not None
    return steps, root_status, root_usage


# ---------------------------------------------------------------------------
# one run


def run_command(argv: list[str], counter: SyscallCounter | None, method: str, max_steps: int) -> Run:
    """Fork, register the child with the counters, release it to exec the command, wait.

    The child blocks on a pipe until it is registered (BPF tgid, PMU counter); the release is
    the pipe's EOF, so the child's read returns 0 bytes and its only syscall left before the
    command is the execve (counted, as it should be).  An exec failure comes back on a
    close-on-exec pipe."""
    path = resolve_command(argv)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    libc = _libc() if method == COMPUTE_PTRACE else None
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(go_w)
            os.close(err_r)
            if libc is not None:
                libc.ptrace(PTRACE_TRACEME, 0, None, None)
            os.read(go_r, 1)
            os.execv(path, argv)
        except OSError as e:
            os.write(err_w, str(e.errno or errno.ENOEXEC).encode())
        finally:
            os._exit(127)
    os.close(go_r)
    os.close(err_w)
    pmu_fd = -1
    try:
        if counter is not None:
            counter.track(pid)
        if method == COMPUTE_PMU:
            pmu_fd = open_instructions_counter(pid)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    t0 = time.perf_counter()
    os.close(go_w)  # release
    instructions = None
    if method == COMPUTE_PTRACE:
        _, st = os.waitpid(pid, WALL)  # stopped at the exec, or exited if the exec failed
        if os.WIFSTOPPED(st):
            instructions, status, usage = _single_step_tree(pid, max_steps)
        else:
            status, usage = st, None
    else:
        _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    failure = os.read(err_r, 64)
    os.close(err_r)
    if failure:
        code = int(failure.decode() or errno.ENOEXEC)
        raise PredictError(f"predict measure: cannot execute {argv[0]}: {os.strerror(code)}")
    if pmu_fd >= 0:
        instructions = int.from_bytes(os.read(pmu_fd, 8), "little")
        os.close(pmu_fd)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    return Run(status=code, wall_s=wall, rusage=usage, instructions=instructions)


def choose_method(requested: str) -> str:
    if requested == "pmu" or requested == "auto":
        if pmu_instructions_available():
            return COMPUTE_PMU
        if requested == "pmu":
            raise PredictError("predict measure: no hardware PMU here (perf_event_open of `instructions` fails): "
                               "use --instructions user-cpu (default) or ptrace")
        return COMPUTE_USER_CPU
    return {"ptrace": COMPUTE_PTRACE, "user-cpu": COMPUTE_USER_CPU}[requested]


def measure(argv: list[str], instructions: str = "auto", max_steps: int = 5_000_000,
            syscalls: bool = True, repeat: int = 1, loop_repeat: int = 5, memory_probe: bool = False) -> Counts:
    """Count `repeat` runs of argv (and its children) on this machine; keep the median run.

    The run kept is the one with the median user CPU time (the compute term, and the figure
    most disturbed by whatever else the machine runs); every run's times are kept in
    reference.runs so that the spread is visible."""
    resolve_command(argv)
    method = choose_method(instructions)
    counter = SyscallCounter() if syscalls else None
    runs: list[tuple[Run, tuple[dict[str, SyscallCount], int, int, int]]] = []
    loops: list[float] = []  # the reference's loops in CPU time, before and after every run (interleaved)
    mems: list[float] = []
    chain = predict_costs.MemoryChain()

    def time_loop() -> None:
        stat = predict_costs.time_compute_loop(repeat=loop_repeat, min_time=0.05, cpu_time=True)
        loops.extend((stat.median, stat.min, stat.max))
        stat = predict_costs.time_memory_loop(repeat=loop_repeat, min_time=0.05, cpu_time=True, chain=chain)
        mems.extend((stat.median, stat.min, stat.max))

    try:
        time_loop()
        for _ in range(max(1, repeat)):
            if counter is not None:
                counter.reset()
            run = run_command(argv, counter, method, max_steps)
            runs.append((run, counter.read() if counter is not None else ({}, 0, 0, 0)))
            time_loop()
    finally:
        if counter is not None:
            counter.close()
    medians = loops[0::3]
    memory = {}
    if memory_probe:
        from vmprof_tui.estimate.memory_probe import memory_share

        memory = {"memory": memory_share(argv, chain)}
    ordered = sorted(runs, key=lambda r: r[0].rusage.ru_utime if r[0].rusage else 0.0)
    run, (by_name, procs, threads, dropped) = ordered[(len(ordered) - 1) // 2]
    notes = []
    if run.status != 0:
        notes.append(f"the command exited with status {run.status}; counts are of that run")
    if not syscalls:
        notes.append("system calls were not counted (--no-syscalls): the estimate has no syscall terms")
    if dropped:
        notes.append(f"{dropped} child processes were not tracked (the BPF map was full): their syscalls are missing")
    if method == COMPUTE_USER_CPU:
        notes.append("no PMU instructions counter used: the compute term is the user CPU time of the tree")
    if len(runs) > 1:
        notes.append(f"the median of {len(runs)} runs by user CPU time")
    ru = run.rusage
    times = [{"wall_s": r.wall_s, "user_s": r.rusage.ru_utime if r.rusage else 0.0,
              "system_s": r.rusage.ru_stime if r.rusage else 0.0} for r, _ in runs]
    return Counts(
        command=list(argv), exit_status=run.status, wall_s=run.wall_s,
        user_s=ru.ru_utime if ru else 0.0, system_s=ru.ru_stime if ru else 0.0,
        compute_method=method, instructions=run.instructions, syscalls=by_name,
        minor_faults=ru.ru_minflt if ru else 0, major_faults=ru.ru_majflt if ru else 0,
        voluntary_switches=ru.ru_nvcsw if ru else 0, involuntary_switches=ru.ru_nivcsw if ru else 0,
        processes_created=procs, threads_created=threads,
        reference={**machine_description(), "compute_loop_s": statistics.median(medians),
                   "compute_loop_min_s": min(loops), "compute_loop_max_s": max(loops),
                   "compute_loop_clock": "thread CPU time", "compute_loop_samples": medians,
                   "memory_loop_s": statistics.median(mems[0::3]), "memory_loop_min_s": min(mems),
                   "memory_loop_max_s": max(mems), **memory, "runs": times},
        notes=notes)
