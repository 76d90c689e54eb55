"""Run-time prediction for a target machine (paper 004): counts here × costs there.

A program that runs to completion is run once on the machine at hand (the *reference*)
and counted: its compute (instructions, or user CPU time where there is no PMU), its
system calls by kind, page faults, voluntary context switches and processes created
(:mod:`vmprof_tui.estimate.predict_measure`).  A target machine publishes what one of
each operation costs there (:mod:`vmprof_tui.estimate.predict_costs`).  The prediction
is the sum of count × cost over every term, shown term by term (:func:`estimate`).

This module holds the two file formats (versioned JSON, parsed with checks: a hand-edited
or corrupt file gives one clear :class:`PredictError`) and the arithmetic.  docs/predict.md
describes both.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmprof_tui import bounded_json, files
from vmprof_tui.estimate.syscall_names import syscall_name, syscall_names

COUNTS_FORMAT = "vmprof-predict-counts"
COSTS_FORMAT = "vmprof-predict-costs"
VERSION = 1

COMPUTE_USER_CPU = "user-cpu-time"
COMPUTE_PMU = "pmu-instructions"
COMPUTE_PTRACE = "ptrace-single-step"
COMPUTE_METHODS = (COMPUTE_USER_CPU, COMPUTE_PMU, COMPUTE_PTRACE)

# The compute loop of predict_costs: instructions per iteration (fixed by its machine code).
LOOP_INSTRUCTIONS = 4

# The operations `vmprof predict costs` measures; each is seconds per operation.
COST_NAMES = ("compute_loop", "null_syscall", "open_close", "read_4k", "read_64k", "write_4k", "write_64k",
              "mmap_munmap", "fork_exit", "fork_exec_exit", "minor_fault", "major_fault", "context_switch")

# Measured where a target has them (the demo VM's cost program): a stat of a path, an fcntl lock, and a 4 KiB
# overwrite made durable (pwrite64 + fdatasync); without them those calls are charged a null syscall, as a
# fallback.  memory_loop (a pointer chase, seconds per load) is measured everywhere by this version; a file
# without it has no memory term.
OPTIONAL_COSTS = ("memory_loop", "stat", "fcntl", "write_sync")


# What `costs --probe` measures: the target's speed and wait share just before a run (see with_probe).
PROBE_COSTS = ("compute_loop", "memory_loop")


class PredictError(RuntimeError):
    """One line for the user: what is wrong and what to do."""


# ---------------------------------------------------------------------------
# the two files


@dataclass
class SyscallCount:
    nr: int
    calls: int
    bytes: int = 0


@dataclass
class Counts:
    """What one run of a command did on the reference machine (the COUNTS file)."""

    command: list[str]
    exit_status: int
    wall_s: float
    user_s: float
    system_s: float
    compute_method: str
    instructions: int | None
    syscalls: dict[str, SyscallCount]
    minor_faults: int
    major_faults: int
    voluntary_switches: int
    involuntary_switches: int
    processes_created: int
    threads_created: int
    reference: dict[str, Any]  # host, kernel, cpus, compute_loop_s (seconds per loop iteration there)
    notes: list[str] = field(default_factory=list)

    @property
    def reference_loop_s(self) -> float:
        return float(self.reference["compute_loop_s"])

    @property
    def memory_share(self) -> float:
        """The share of the compute CPU time that behaves like the memory loop (measure --memory-probe), or 0."""
        return float((self.reference.get("memory") or {}).get("share") or 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": COUNTS_FORMAT, "version": VERSION,
            "command": self.command, "exit_status": self.exit_status,
            "time": {"wall_s": self.wall_s, "user_s": self.user_s, "system_s": self.system_s},
            "compute": {"method": self.compute_method, "instructions": self.instructions,
                        "user_cpu_s": self.user_s},
            "syscalls": {name: {"nr": c.nr, "calls": c.calls, "bytes": c.bytes}
                         for name, c in sorted(self.syscalls.items(), key=lambda kv: -kv[1].calls)},
            "faults": {"minor": self.minor_faults, "major": self.major_faults},
            "context_switches": {"voluntary": self.voluntary_switches, "involuntary": self.involuntary_switches},
            "processes": {"created": self.processes_created, "threads": self.threads_created},
            "reference": self.reference,
            "notes": self.notes,
        }

    @property
    def syscall_total(self) -> int:
        return sum(c.calls for c in self.syscalls.values())


@dataclass
class CostStat:
    """Seconds per operation over repetitions."""

    median: float
    min: float
    max: float
    repeat: int

    def to_json(self) -> dict[str, float | int]:
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max, "repeat": self.repeat}


@dataclass
class Costs:
    """What one operation costs on a target (the COSTS file)."""

    target: dict[str, Any]  # name, host, kernel, cpus, cgroup quota if any, measured_at
    costs: dict[str, CostStat]
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.target.get("name") or self.target.get("host") or "target")

    def to_json(self) -> dict[str, Any]:
        return {"format": COSTS_FORMAT, "version": VERSION, "target": self.target,
                "costs": {k: v.to_json() for k, v in self.costs.items()}, "notes": self.notes}


def write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        files.write_file(path, json.dumps(data, indent=1) + "\n")
    except OSError as e:
        raise PredictError(f"cannot write {path}: {e.strerror}") from None


def _load(path: Path, fmt: str, what: str) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PredictError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PredictError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = bounded_json.loads(text, str(path))
    except bounded_json.JSONLimitError as e:
        raise PredictError(f"{e}; is it a {what} file?") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PredictError(f"{path} is not a {what} file (format {got!r}, expected {fmt!r})")
    if data.get("version") != VERSION:
        raise PredictError(f"{path}: {what} format version {data.get('version')!r} is not supported "
                           f"(this vmprof reads version {VERSION})")
    return data


class _Reader:
    """Typed access to a parsed file; any mismatch is one PredictError naming the file and key."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    def get(self, dotted: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        node: Any = self.data
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                if optional:
                    return None
                raise PredictError(f"{self.path}: missing {dotted}")
            node = node[key]
        if node is None and optional:
            return None
        if isinstance(node, bool) or not isinstance(node, kind):
            raise PredictError(f"{self.path}: {dotted} is {node!r}, not a {_kind_name(kind)}")
        return node

    def number(self, dotted: str, *, optional: bool = False, positive: bool = False) -> float | None:
        v = self.get(dotted, (int, float), optional=optional)
        if v is None:
            return None
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            raise PredictError(f"{self.path}: {dotted} is {v!r}, not a {'positive' if positive else 'non-negative'} "
                               "finite number")
        return float(v)

    def count(self, dotted: str, *, optional: bool = False) -> int | None:
        v = self.get(dotted, int, optional=optional)
        if v is not None and v < 0:
            raise PredictError(f"{self.path}: {dotted} is {v}, not a count")
        return v


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "integer", float: "number", str: "string", dict: "object", list: "list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def load_counts(path: Path) -> Counts:
    r = _Reader(path, _load(path, COUNTS_FORMAT, "vmprof predict counts"))
    command = r.get("command", list)
    if not all(isinstance(a, str) for a in command):
        raise PredictError(f"{path}: command must be a list of strings")
    method = r.get("compute.method", str)
    if method not in COMPUTE_METHODS:
        raise PredictError(f"{path}: compute.method {method!r} is not one of {', '.join(COMPUTE_METHODS)}")
    instructions = r.count("compute.instructions", optional=True)
    if method != COMPUTE_USER_CPU and instructions is None:
        raise PredictError(f"{path}: compute.method is {method} but compute.instructions is missing")
    syscalls: dict[str, SyscallCount] = {}
    for name, entry in r.get("syscalls", dict).items():
        e = _Reader(path, {"s": entry})
        syscalls[str(name)] = SyscallCount(nr=e.count("s.nr") or 0, calls=e.count("s.calls") or 0,
                                           bytes=e.count("s.bytes", optional=True) or 0)
    r.number("reference.compute_loop_s", positive=True)
    r.number("reference.memory_loop_s", optional=True, positive=True)
    if (r.number("reference.memory.share", optional=True) or 0) > 1:
        raise PredictError(f"{path}: reference.memory.share is above 1 (a share of the CPU time)")
    notes = r.get("notes", list, optional=True) or []
    return Counts(
        command=command, exit_status=r.get("exit_status", int),
        wall_s=r.number("time.wall_s") or 0.0, user_s=r.number("time.user_s") or 0.0,
        system_s=r.number("time.system_s") or 0.0, compute_method=method, instructions=instructions,
        syscalls=syscalls, minor_faults=r.count("faults.minor") or 0, major_faults=r.count("faults.major") or 0,
        voluntary_switches=r.count("context_switches.voluntary") or 0,
        involuntary_switches=r.count("context_switches.involuntary") or 0,
        processes_created=r.count("processes.created") or 0, threads_created=r.count("processes.threads") or 0,
        reference=r.get("reference", dict), notes=[str(n) for n in notes])


def load_costs(path: Path) -> Costs:
    r = _Reader(path, _load(path, COSTS_FORMAT, "vmprof predict costs"))
    target = r.get("target", dict)
    entries = r.get("costs", dict)
    unsupported = r.get("target.unsupported", dict, optional=True) or {}
    probe = target.get("probe") is True  # `costs --probe`: the loops only
    missing = [n for n in (PROBE_COSTS if probe else COST_NAMES) if n not in entries and n not in unsupported]
    if missing:
        raise PredictError(f"{path}: costs lack {', '.join(missing)} (measure them with vmprof predict costs)")
    costs = {}
    for name in (PROBE_COSTS if probe else (*COST_NAMES, *(n for n in OPTIONAL_COSTS if n in entries))):
        if name not in entries:  # the target has no such operation (target.unsupported says why)
            costs[name] = CostStat(0.0, 0.0, 0.0, 0)
            continue
        costs[name] = CostStat(median=r.number(f"costs.{name}.median_s", positive=True) or 0.0,
                               min=r.number(f"costs.{name}.min_s") or 0.0, max=r.number(f"costs.{name}.max_s") or 0.0,
                               repeat=r.count(f"costs.{name}.repeat") or 0)
    notes = r.get("notes", list, optional=True) or []
    return Costs(target=target, costs=costs, notes=[str(n) for n in notes])


def with_probe(costs: Costs, probe: Costs) -> Costs:
    """The costs with the probe's loops and wait share: the speed of the target's CPU and other work's share of it
    move within minutes on a shared machine, so they are taken just before the run the estimate is for, the
    operations' costs from the full measurement.  Both must be without the wait (costs --without-wait)."""
    for c in (costs, probe):
        if c.target.get("costs_exclude_steal") is not True:
            raise PredictError(f"--probe: the costs of {c.name} include the wait for the CPU: measure them with "
                               "vmprof predict costs --without-wait")
    if ("vm" in costs.target) != ("vm" in probe.target):
        raise PredictError(f"--probe: the probe and the costs of {costs.name} are of different targets (a host's "
                           "probe comes from costs --probe there, a demo VM's from its cost program)")
    merged = {**costs.costs, **{k: v for k, v in probe.costs.items() if k in PROBE_COSTS}}
    # the reference loops a VM's costs timed on the host then are of another moment: the counts' own are nearer
    target = {k: v for k, v in costs.target.items() if k not in ("reference_compute_loop_s", "reference_memory_loop_s")}
    target |= {"steal_share": probe.target.get("steal_share", 0.0), "probed_at": probe.target.get("measured_at")}
    return Costs(target=target, costs=merged, notes=[*costs.notes, f"compute and memory loops and the wait share "
                                                                   f"from a probe at {target['probed_at']}"])


# ---------------------------------------------------------------------------
# the estimate

# How each syscall is charged.  Process creation is charged per process (fork+exit, which
# includes the child's exit and the parent's wait), exec per exec; the syscalls those costs
# already contain are charged nothing, so nothing is counted twice.
IN_PROCESS_TERM = frozenset({"clone", "clone3", "fork", "vfork", "exit", "exit_group", "wait4", "waitid"})
EXEC_CALLS = frozenset({"execve", "execveat"})
OPEN_CALLS = frozenset({"open", "openat", "openat2", "creat"})
READ_CALLS = frozenset({"read", "pread64", "readv", "preadv", "preadv2"})
WRITE_CALLS = frozenset({"write", "pwrite64", "writev", "pwritev", "pwritev2"})
# Charged the measured null syscall (getppid) as the measured cost of their kind: the second
# half of a measured pair (close of open+close, munmap of mmap+munmap) or trivially cheap.
NULL_LIKE = frozenset({"getppid", "getpid", "gettid", "getuid", "geteuid", "getgid", "getegid", "close", "munmap"})
STAT_CALLS = frozenset({"stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2"})
SYNC_CALLS = frozenset({"fsync", "fdatasync"})
# Syscalls whose positive return value is a byte count (the BPF counter sums them).
BYTE_CALLS = READ_CALLS | WRITE_CALLS | frozenset({"sendfile", "copy_file_range", "splice", "recvfrom", "sendto",
                                                   "recvmsg", "sendmsg"})


@dataclass(frozen=True)
class UnitCosts:
    """Per-operation seconds derived from a COSTS file (read/write: per call + per byte)."""

    loop_s: float  # one compute-loop iteration
    null: float
    open: float  # open+close minus the close (charged as null)
    read_call: float
    read_byte: float
    write_call: float
    write_byte: float
    mmap: float  # mmap+munmap minus the munmap (charged as null)
    fork_exit: float
    exec: float  # fork+exec+exit minus fork+exit
    minor_fault: float
    major_fault: float
    context_switch: float
    stat: float | None = None  # OPTIONAL_COSTS, where measured
    fcntl: float | None = None
    sync: float | None = None  # fsync/fdatasync: write_sync minus the 4 KiB write


def unit_costs(c: Costs, which: str = "median") -> UnitCosts:
    """The unit costs from each cost's median (or its min or max over the repetitions: the spread)."""
    m = {k: getattr(v, which) for k, v in c.costs.items()}

    def call_and_byte(small: str, large: str) -> tuple[float, float]:
        per_byte = max(0.0, (m[large] - m[small]) / (65536 - 4096))
        return max(0.0, m[small] - 4096 * per_byte), per_byte

    read_call, read_byte = call_and_byte("read_4k", "read_64k")
    write_call, write_byte = call_and_byte("write_4k", "write_64k")
    null = m["null_syscall"]
    return UnitCosts(loop_s=m["compute_loop"], null=null, open=max(0.0, m["open_close"] - null),
                     read_call=read_call, read_byte=read_byte, write_call=write_call, write_byte=write_byte,
                     mmap=max(0.0, m["mmap_munmap"] - null), fork_exit=m["fork_exit"],
                     exec=max(0.0, m["fork_exec_exit"] - m["fork_exit"]), minor_fault=m["minor_fault"],
                     major_fault=m["major_fault"], context_switch=m["context_switch"],
                     stat=m.get("stat"), fcntl=m.get("fcntl"),
                     sync=max(0.0, m["write_sync"] - m["write_4k"]) if "write_sync" in m else None)


@dataclass(frozen=True)
class Term:
    group: str  # compute, syscall, fault, process, switch
    name: str
    count: float
    unit: str
    cost_s: float  # seconds per unit (for byte-moving calls: the per-call part)
    seconds: float
    basis: str  # which measured cost, or "fallback: ..."
    fallback: bool = False


@dataclass
class Estimate:
    target: str
    terms: list[Term]
    compute_basis: str
    notes: list[str]
    low_s: float = 0.0  # the prediction with every cost at its fastest and slowest repetition
    high_s: float = 0.0
    steal_share: float = 0.0  # of the target's time, measured while its costs were (a VM beside a neighbour)

    @property
    def total_s(self) -> float:
        return sum(t.seconds for t in self.terms)

    def group_s(self, group: str) -> float:
        return sum(t.seconds for t in self.terms if t.group == group)

    @property
    def fallback_s(self) -> float:
        return sum(t.seconds for t in self.terms if t.fallback)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "predicted_s": self.total_s, "low_s": self.low_s, "high_s": self.high_s,
                "steal_share": self.steal_share, "steal_s": self.total_s * self.steal_share,
                "compute": self.compute_basis,
                "by_group_s": {g: self.group_s(g) for g in GROUPS}, "fallback_s": self.fallback_s,
                "terms": [t.__dict__ for t in self.terms], "notes": self.notes}


GROUPS = ("compute", "syscall", "fault", "process", "switch")


def _syscall_term(name: str, c: SyscallCount, u: UnitCosts) -> Term:
    n = c.calls
    if name in IN_PROCESS_TERM:
        return Term("syscall", name, n, "calls", 0.0, 0.0, "in the fork+exit cost of each process")
    if name in EXEC_CALLS:
        return Term("syscall", name, n, "calls", u.exec, n * u.exec, "exec")
    if name in OPEN_CALLS:
        return Term("syscall", name, n, "calls", u.open, n * u.open, "open (open+close minus a null call)")
    if name in READ_CALLS:
        return Term("syscall", name, n, "calls", u.read_call, n * u.read_call + c.bytes * u.read_byte,
                    f"read: per call + {c.bytes} bytes")
    if name in WRITE_CALLS:
        return Term("syscall", name, n, "calls", u.write_call, n * u.write_call + c.bytes * u.write_byte,
                    f"write: per call + {c.bytes} bytes")
    if name == "mmap":
        return Term("syscall", name, n, "calls", u.mmap, n * u.mmap, "mmap (mmap+munmap minus a null call)")
    if name in STAT_CALLS and u.stat is not None:
        return Term("syscall", name, n, "calls", u.stat, n * u.stat, "stat of a path")
    if name == "fcntl" and u.fcntl is not None:
        return Term("syscall", name, n, "calls", u.fcntl, n * u.fcntl, "fcntl lock or unlock")
    if name in SYNC_CALLS and u.sync is not None:
        return Term("syscall", name, n, "calls", u.sync, n * u.sync, "fdatasync of a 4 KiB write")
    if name in NULL_LIKE:
        return Term("syscall", name, n, "calls", u.null, n * u.null, "null syscall")
    return Term("syscall", name, n, "calls", u.null, n * u.null, "fallback: null syscall cost", fallback=True)


def operation_terms(counts: Counts, u: UnitCosts) -> list[Term]:
    """Every term but compute: the counted operations at the unit costs `u`."""
    terms = []
    names = syscall_names()
    for name, c in sorted(counts.syscalls.items(), key=lambda kv: -kv[1].calls):
        if c.calls or c.bytes:
            terms.append(_syscall_term(name if not name.startswith("syscall_") else
                                       syscall_name(c.nr, names), c, u))
    terms.append(Term("fault", "minor page faults", counts.minor_faults, "faults", u.minor_fault,
                      counts.minor_faults * u.minor_fault, "minor fault (anonymous page, first write)"))
    terms.append(Term("fault", "major page faults", counts.major_faults, "faults", u.major_fault,
                      counts.major_faults * u.major_fault, "major fault (one page read from disk)"))
    terms.append(Term("process", "processes created", counts.processes_created, "processes", u.fork_exit,
                      counts.processes_created * u.fork_exit, "fork+exit+wait"))
    if counts.threads_created:
        terms.append(Term("process", "threads created", counts.threads_created, "threads", u.fork_exit,
                          counts.threads_created * u.fork_exit, "fallback: fork+exit cost", fallback=True))
    terms.append(Term("switch", "voluntary context switches", counts.voluntary_switches, "switches",
                      u.context_switch, counts.voluntary_switches * u.context_switch, "pipe ping-pong switch"))
    return terms


def compute_cpu_s(counts: Counts, reference: Costs | None) -> tuple[float, str]:
    """The reference CPU seconds the compute term scales, and how they were found.

    Without the reference's costs: the user CPU time.  With them: the run's whole CPU time
    (user + system, which the kernel keeps exactly) minus what its counted operations cost at
    the reference's prices; that residual is the program's own work.  The user/system split
    alone is not exact (the kernel divides the exact total by tick samples), and kernel work
    no term models (exec's mapping, exit's teardown) then scales with the compute loop instead
    of being lost.  Major faults are left in: their cost is mostly a wait, not CPU time."""
    if reference is None:
        return counts.user_s, "user CPU time"
    cpu = counts.user_s + counts.system_s
    explained = sum(t.seconds for t in operation_terms(counts, unit_costs(reference))
                    if t.name != "major page faults")
    if explained > cpu:  # the reference's prices overstate this program's operations
        return counts.user_s, (f"user CPU time (its operations at {reference.name}'s costs, {explained:.3f} s, "
                               f"exceed its CPU time {cpu:.3f} s)")
    return cpu - explained, f"CPU time {cpu:.3f} s minus its operations at {reference.name}'s costs {explained:.3f} s"


def compute_ratio(counts: Counts, costs: Costs, which: str = "median", loop: str = "compute") -> tuple[float, str]:
    """Target seconds per reference CPU second, from the compute loop (or the memory loop).  A COSTS file that
    timed the reference's loop itself, interleaved with the target's (`predict costs --vm`: the host before and
    after the VM), on the host the counts come from (natively), gives the ratio of the same moment; otherwise
    the counts' own loop."""
    there = getattr(costs.costs[f"{loop}_loop"], which)
    own = costs.target.get(f"reference_{loop}_loop_s")
    same_host = costs.target.get("host") == counts.reference.get("host") and "vm" not in counts.reference
    if isinstance(own, (int, float)) and own > 0 and same_host:
        return there / own, f"reference {loop} loop {own * 1e9:.3f} ns timed interleaved with the target's"
    ref = float(counts.reference[f"{loop}_loop_s"])
    return there / ref, f"reference {loop} loop {ref * 1e9:.3f} ns (from the counts)"


def memory_share(counts: Counts, costs: Costs) -> float:
    """The counts' memory share where the target and the reference both have a memory loop, else 0."""
    has_ref = counts.reference.get("memory_loop_s") or costs.target.get("reference_memory_loop_s")
    return counts.memory_share if "memory_loop" in costs.costs and has_ref else 0.0


def _terms(counts: Counts, costs: Costs, compute: str, reference: Costs | None, which: str) -> tuple[list[Term], str]:
    u = unit_costs(costs, which)
    if compute == "instructions":
        if counts.instructions is None:
            raise PredictError("the counts have no instruction count (measured with the user-CPU-time method): "
                               "use --compute cpu-time")
        per_insn = u.loop_s / LOOP_INSTRUCTIONS
        terms = [Term("compute", f"instructions ({counts.compute_method})", counts.instructions,
                      "instructions", per_insn, counts.instructions * per_insn,
                      "compute loop: seconds per instruction")]
        basis = f"instructions × target seconds per compute-loop instruction ({counts.compute_method})"
    elif compute == "cpu-time":
        ratio, ref_what = compute_ratio(counts, costs, which)
        cpu_s, what = compute_cpu_s(counts, reference)
        name = "user CPU time" if reference is None else "CPU time minus operations"
        # the share that behaves like the memory loop scales with it, the rest with the compute loop
        share = memory_share(counts, costs)
        terms = [Term("compute", name, cpu_s * (1 - share), "reference CPU s", ratio, cpu_s * (1 - share) * ratio,
                      "compute loop: target s per reference CPU s")]
        basis = f"{what} × {ratio:.3f} (target compute loop {u.loop_s * 1e9:.3f} ns/iteration vs {ref_what})"
        if share:
            mratio, mref = compute_ratio(counts, costs, which, "memory")
            terms.append(Term("compute", "memory-bound part", cpu_s * share, "reference CPU s", mratio,
                              cpu_s * share * mratio, "memory loop: target s per reference CPU s"))
            basis += f"; {100 * share:.0f}% of it × {mratio:.3f} (memory loop, vs {mref})"
    else:
        raise PredictError(f"unknown compute method {compute!r}: use auto, cpu-time or instructions")
    return terms + operation_terms(counts, u), basis


def estimate(counts: Counts, costs: Costs, compute: str = "auto", reference: Costs | None = None,
             steal: float | None = None) -> Estimate:
    """Predicted run time of the counted program on the machine `costs` describes.

    compute: "auto" (the counts' own method), "cpu-time" (reference CPU seconds, see
    compute_cpu_s, × the target's time for what took one CPU second on the reference, from the
    compute loop timed on both), or "instructions" (instructions × the target's time per loop
    instruction: the paper's method; assumes the program's CPI equals the loop's).
    reference: the costs of the machine the counts come from (for the cpu-time term).
    steal: the target's steal share now, if known apart from the costs: the costs (wall times, which hold the
    steal of their own measurement, target.steal_share) are rescaled by (1 - theirs) / (1 - steal).
    The range (low_s, high_s) is the same sum with every cost at its fastest and slowest repetition."""
    notes: list[str] = []
    if compute == "auto":
        compute = "cpu-time" if counts.compute_method == COMPUTE_USER_CPU else "instructions"
    terms, basis = _terms(counts, costs, compute, reference, "median")
    low = sum(t.seconds for t in _terms(counts, costs, compute, reference, "min")[0])
    high = sum(t.seconds for t in _terms(counts, costs, compute, reference, "max")[0])
    unsupported = costs.target.get("unsupported") or {}
    for cost, count in (("fork_exit", counts.processes_created + counts.threads_created),
                        ("fork_exec_exit", sum(c.calls for n, c in counts.syscalls.items() if n in EXEC_CALLS)),
                        ("context_switch", counts.voluntary_switches)):
        if cost in unsupported and count:
            notes.append(f"{costs.name} has no {cost} ({unsupported[cost]}): {count} counted charged nothing")
    measured = costs.target.get("steal_share")
    measured = float(measured) if isinstance(measured, (int, float)) and 0 <= measured < 1 else 0.0
    if steal is not None and not 0 <= steal < 1:
        raise PredictError(f"--steal {steal} is not a share between 0 and 1")
    share = measured if steal is None else steal
    # costs without steal (a VM's: its vCPU thread's CPU time) are stretched by the steal share; wall-time costs
    # hold the steal of their own measurement, replaced by another share if one is given
    scale = (1 / (1 - share) if costs.target.get("costs_exclude_steal") is True
             else (1 - measured) / (1 - share))
    if scale != 1:
        terms = [replace(t, cost_s=t.cost_s * scale, seconds=t.seconds * scale) for t in terms]
        low, high = low * scale, high * scale
    if steal is not None:
        notes.append(f"steal share {100 * steal:.1f}% (the costs were measured at {100 * measured:.1f}%)")
    steal = share
    if compute == "cpu-time" and counts.compute_method != COMPUTE_USER_CPU:
        notes.append("compute from CPU time although the counts also hold instructions")
    if counts.exit_status != 0:
        notes.append(f"the counted run exited with status {counts.exit_status}")
    par = (counts.user_s + counts.system_s) / counts.wall_s if counts.wall_s > 0 else 0.0
    if par > 1.2:
        notes.append(f"the counted run kept {par:.1f} CPUs busy on average: the prediction is for one CPU "
                     "(the sum of its work), not for the same parallelism")
    return Estimate(costs.name, terms, basis, notes, low_s=min(low, high), high_s=max(low, high), steal_share=steal)

