"""Call graphs of a recording made with `vmprof record -g`: weighted stacks, perf's children and callers
views, and the counts of stacks that ended early.

resolve → **analyse**: built on an `Analysis` (which has resolved the samples' leaf names and loaded the
guest bundles) and `resolve.stacks` (frames per distinct stack).  Paths run from the outermost context
inwards, as the flat profiles do: at the guest level VM → guest process → frames; at the host level
host process → user frames → kernel frames, and for the samples of a VM, `[VM]` → guest process →
guest frames (or the host frames of its vCPU thread, when KVM or the VMM ran on the vCPU's behalf).
A stack that ended early carries a marker frame right after its context (``[partial]`` for a guest
chain, ``[truncated]`` for a host user chain), so no flame graph shows it as complete.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.shares import Row
from vmprof_tui.resolve.resolver import UNKNOWN
from vmprof_tui.resolve.stacks import Frame, SampleStacks, Stack, resolve_stacks

PARTIAL, TRUNCATED = "[partial]", "[truncated]"


def frame_label(f: Frame) -> str:
    if f.function != UNKNOWN:
        return f.function
    return f.module if f.module.startswith("[") else f"[{f.module}]"


@dataclass
class WeightedStacks:
    """Distinct paths of one profile (host or one VM) with their sample counts."""
    level: str
    paths: list[tuple[str, ...]]  # outermost first
    counts: np.ndarray  # samples per path
    stacks: list[Stack | None]  # the resolved stack behind each path (None: a sample without one)
    contexts: list[int]  # how many leading labels of each path are context (VM, process, marker), not frames
    # a sample of each path: its index into Analysis.samples, or read a piece at a time into the whole recording's
    first: list[int] = field(default_factory=list)
    samples: int = 0
    without_stack: int = 0  # samples that have no stack record (lost, or recorded without -g)
    partial: Counter = field(default_factory=Counter)  # object -> samples whose guest chain ended early there
    truncated: Counter = field(default_factory=Counter)  # object -> samples whose host user chain stopped there
    resolve_notes: list[str] = field(default_factory=list)  # what resolving the stacks found (resolve.stacks)

    def add(self, path: tuple[str, ...], context: int, n: int, stack: Stack | None, first: int) -> None:
        """One more distinct path (its counts are already in `counts`), and what ended early on it."""
        self.paths.append(path)
        self.stacks.append(stack)
        self.contexts.append(context)
        self.first.append(first)
        if stack is None:
            self.without_stack += n
            return
        for what, obj in ended_early(stack):
            getattr(self, what)[obj] += n

    def notes(self) -> list[str]:
        out = []
        if self.partial:
            out.append(f"{sum(self.partial.values())} of {self.samples} samples have a partial "
                       f"{'guest ' if self.level == 'guest' else ''}stack (a read failed, a return address was no "
                       f"code, or unwinding stopped early), by object: {_by_object(self.partial)}")
        if self.truncated:
            out.append(f"{sum(self.truncated.values())} of {self.samples} samples have a truncated host user stack "
                       f"(no frame pointers), by object: {_by_object(self.truncated)}")
        if self.without_stack:
            out.append(f"{self.without_stack} of {self.samples} samples have no stack record (its ring buffer "
                       "was full, or the recording was made without -g): leaf only")
        return out + self.resolve_notes


def ended_early(stack: Stack) -> list[tuple[str, str]]:
    """Where a stack ended early, as WeightedStacks counts it: ("partial" or "truncated", the object)."""
    obj = stack.broken_in or UNKNOWN
    return [(what, obj) for what, early in (("partial", stack.partial), ("truncated", stack.truncated)) if early]


def _by_object(c: Counter) -> str:
    return ", ".join(f"{obj} {n}" for obj, n in c.most_common(8))


def call_graph(an: Analysis) -> CallGraph:
    """The call graph of an analysis, built once (several profiles, formats and screens ask for it): kept with
    the analysis (Analysis.derived), so it goes when the analysis goes."""
    graph = an.derived.get("call_graph")
    if graph is None:
        graph = an.derived["call_graph"] = CallGraph(an)
    return graph  # type: ignore[return-value]


def call_paths(an: Analysis, vm: str | None) -> WeightedStacks | None:
    """The VM's (or, for None, the host's) call paths; None when the analysis has no call stacks or no such VM."""
    graph = call_graph(an)
    if not graph.recorded or (vm is not None and vm not in an.vm_names()):
        return None
    return graph.weighted("guest", vm) if vm is not None else graph.weighted("host")


class CallGraph:
    """The stacks of an Analysis's samples, resolved once."""

    def __init__(self, an: Analysis) -> None:
        self.an = an
        rec = an.rec
        if rec.stacks is None:
            self.resolved = SampleStacks(np.full(len(an.samples), -1, np.int64))
        else:
            self.resolved = resolve_stacks(an.samples, rec.stacks, rec.host_stacks, an.resolver, rec.processes(),
                                           an.vm_by_pid, rec.ustacks)

    @property
    def recorded(self) -> bool:
        """True when the recording has stacks (vmprof record -g)."""
        return self.an.rec.stacks is not None

    def weighted(self, level: str, vm: str | None = None, vcpu: int | None = None,
                 cpu: int | None = None, split: bool = False) -> WeightedStacks:
        """The call paths of the host level or of one VM; split: one entry per path, CPU and thread."""
        an, s = self.an, self.an.samples
        if level == "guest":
            sel = np.zeros(len(s), bool)
            for tl in an.vm_timelines(vm, vcpu):
                sel |= an.vcpus.thread_mask(tl)
            sel &= an.is_guest
        else:
            sel = np.ones(len(s), bool) if cpu is None else s["cpu"] == cpu
            if an.cpu_idle_ns():  # as the host profile: idle comes from sched events, not idle samples
                sel &= s["pid"] != 0
        idx = np.nonzero(sel)[0]
        stack_of = self.resolved.stack_of[idx]
        # one group per (context, stack); context: VM and guest process, or host process
        ctx_code = np.where(an.in_vm[idx], -1 - an.vm_code[idx], an.proc_key[idx])
        proc = an.proc_key[idx]
        keys = [ctx_code, proc, stack_of, np.where(stack_of < 0, an.key[idx], -1)]
        if split:
            keys += [s["cpu"][idx].astype(np.int64), s["tid"][idx].astype(np.int64)]
        keys = np.column_stack(keys)
        distinct, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
        out = WeightedStacks(level, [], counts, [], [], samples=len(idx),
                             resolve_notes=self.resolved.notes + self.resolved.level_notes.get(level, []))
        for key, f, n in zip(distinct.tolist(), first.tolist(), counts.tolist(), strict=True):
            sid, i = key[2], int(idx[f])
            stack = self.resolved.stacks[sid] if sid >= 0 else None
            out.add(*path_of(an, i, level, stack), n, stack, i)
        return out


@dataclass(frozen=True, slots=True)
class FirstSample:
    """What the stack formats read of a path's first sample (show/stacks.py): its names as a row, and where and
    in which thread it was taken."""
    row: Row  # Analysis.row, of 0 samples
    in_vm: bool
    pid: int
    cpu: int
    tid: int
    vcpu: int | None


def first_sample(an: Analysis, i: int) -> FirstSample:
    tid = int(an.samples["tid"][i])
    return FirstSample(an.row(i, 0.0), bool(an.in_vm[i]), int(an.samples["pid"][i]), int(an.samples["cpu"][i]), tid,
                       an.vcpu_of_tid.get(tid, (0, None))[1])


def path_of(an: Analysis, i: int, level: str, stack: Stack | None) -> tuple[tuple[str, ...], int]:
    """The path of sample i (of `level`) with its stack, and how many of its leading labels are context."""
    process = str(an.process[i]) or "?"
    if level == "guest":
        context: tuple[str, ...] = (an.vm_name_of_code[an.vm_code[i]] or "vm", process)
    elif an.in_vm[i]:
        vm = f"[{an.vm_name_of_code[an.vm_code[i]]}]"
        context = (vm, process) if an.is_guest[i] else (vm, f"{process} (host)")
    else:
        context = (process,)
    if stack is None:
        return context + (frame_label(Frame(str(an.func[i]), str(an.module[i]), 0)),), len(context)
    context += ((PARTIAL,) if stack.partial else ()) + ((TRUNCATED,) if stack.truncated else ())
    return context + tuple(frame_label(f) for f in stack.frames), len(context)


@dataclass
class ChildrenRow:
    function: str
    total: int  # samples with the function anywhere on the stack (perf's "Children")
    self_samples: int  # samples with the function as the leaf (perf's "Self")


def children(ws: WeightedStacks) -> list[ChildrenRow]:
    """perf report --children: per function, the samples it is on the stack of, and those it is the leaf of."""
    total: Counter = Counter()
    own: Counter = Counter()
    for path, ctx, n in zip(ws.paths, ws.contexts, ws.counts.tolist(), strict=True):
        frames = path[ctx:]
        for f in set(frames):
            total[f] += n
        if frames:
            own[frames[-1]] += n
    return sorted((ChildrenRow(f, t, own[f]) for f, t in total.items()), key=lambda r: (-r.total, -r.self_samples,
                                                                                       r.function))


def callers(ws: WeightedStacks, function: str) -> list[tuple[tuple[str, ...], int]]:
    """perf's caller view of one function: each distinct chain that leads to it (context and frames from the
    outermost to the function), with its samples; recursion counts a sample once, at the outermost call."""
    chains: Counter = Counter()
    for path, ctx, n in zip(ws.paths, ws.contexts, ws.counts.tolist(), strict=True):
        frames = path[ctx:]
        if function in frames:
            chains[path[:ctx] + frames[:frames.index(function) + 1]] += n
    return chains.most_common()
