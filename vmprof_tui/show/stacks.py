"""The frames of each profile row, root first: the one place that says what the stacks of the stack formats
(collapsed, pprof, speedscope, svg) are.

    host level   process [pid] -> function            a VM's row: [VM] -> VM/process [pid] -> function
    guest level  [VM] -> VM/process [pid] -> function  steal and idle rows: [VM] -> [steal] (outside)

A guest process frame carries its VM's name because pprof and speedscope merge frames by name: `compute [1]`
of three VMs would otherwise be one node.  Names are demangled (the mangled symbol is kept as
``Frame.system_name``); an unresolved function is named by its module, ``[libcrypto.so.3]``, as perf does.
With call stacks (a recording made with -g) the function rows are replaced by their call paths
(`analyse.callgraph`): the process frame, a ``[partial]``/``[truncated]`` marker when the chain ended
early, then the frames from the outermost call to the sampled function; each path is split by CPU and
thread, which its Stack carries as labels (cpu, vcpu, tid), and its frames carry addresses and mappings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from vmprof_tui.analyse.analysis import Analysis, vm_rows
from vmprof_tui.analyse.callgraph import FirstSample, call_graph, first_sample
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import Profile, Row, process_name
from vmprof_tui.analyse.stream_callgraph import StreamedCallGraph
from vmprof_tui.analyse.stream_stacks import StreamedStacks
from vmprof_tui.mapping import Mapping
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.resolve.resolver import UNKNOWN
from vmprof_tui.resolve.stacks import Stack as CallStack


@dataclass(frozen=True, slots=True)  # slots: a host profile of a 64-CPU host has a million stacks of them
class Frame:
    name: str  # what users read
    module: str = ""
    system_name: str = ""  # the mangled symbol, when name is its demangled form
    # where a call-stack frame is (0 / None for the frames of rows); not part of its identity, so that
    # formats that merge frames by name see one frame per function
    address: int = field(default=0, compare=False)
    mapping: Mapping | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Stack:
    frames: tuple[Frame, ...]  # root first
    samples: float
    row: Row
    labels: tuple[tuple[str, int], ...] = ()  # call-stack paths: cpu, vcpu, tid


def function_name(row: Row) -> str:
    """The function of a row as users read it: demangled, `[module]` when unresolved."""
    if row.kind is RowKind.UNKNOWN:
        if not row.module:
            return UNKNOWN
        return row.module if row.module.startswith("[") else f"[{row.module}]"  # [kernel.kallsyms] as it is
    return demangle(row.function)


def function_frame(row: Row) -> Frame:
    if row.kind in (RowKind.FUNCTION, RowKind.UNKNOWN):
        name = function_name(row)
        return Frame(name, row.module, row.function if name != row.function and row.kind is RowKind.FUNCTION else "")
    return Frame(f"{row.function} {row.module}", row.module)  # [steal] (outside), [idle] (cpu idle), ...


def row_frames(row: Row) -> tuple[Frame, ...]:
    if row.kind is RowKind.VM:  # a host-level VM row that could not be split
        return (Frame(row.function, row.module),)
    frames = [Frame(f"[{row.vm}]")] if row.vm else []
    proc = process_name(row)
    if proc is not None:
        frames.append(Frame(f"{row.vm}/{proc}" if row.vm else proc))
    frames.append(function_frame(row))
    return tuple(frames)


def call_frame(label: str, f: object) -> Frame:
    """A frame of a call path (`resolve.stacks.Frame` behind it, or a marker)."""
    function = getattr(f, "function", label)
    name = demangle(function) if function != UNKNOWN else label
    return Frame(name, getattr(f, "module", ""), function if name != function else "", getattr(f, "address", 0),
                 getattr(f, "mapping", None))


def path_stacks(an: Analysis, profile: Profile, cpu: int | None) -> list[Stack]:
    """The function (and host-level VM) rows of a profile as call paths, largest first."""
    ws = call_graph(an).weighted(profile.level, profile.vm, profile.vcpu, cpu, split=True)
    return sorted_paths(profile, zip(ws.paths, ws.contexts, ws.counts.tolist(), ws.stacks,
                                     (first_sample(an, i) for i in ws.first), strict=True))


def sorted_paths(profile: Profile, paths: Iterable[tuple[tuple[str, ...], int, int, CallStack | None, FirstSample]]
                 ) -> list[Stack]:
    """Call paths (path, context, samples, stack, first sample: WeightedStacks split by CPU and thread) as the
    profile's stacks, largest first (analyse/stream_callgraph.py gives them summed over a recording's pieces)."""
    # the profile's rows say which paths it holds (report's --comm/--pid/--dso/-K/-U leave some out)
    functions = {(r.function, r.module, r.process, r.pid) for r in profile.rows
                 if r.kind in (RowKind.FUNCTION, RowKind.UNKNOWN)}
    vmms = {r.pid for r in profile.rows if r.kind is RowKind.VM}
    out = []
    for path, ctx, n, stack, first in paths:
        row = replace(first.row, samples=float(n))
        vm_path = profile.level == "host" and first.in_vm
        if (first.pid not in vmms) if vm_path else ((row.function, row.module, row.process, row.pid) not in functions):
            continue
        if profile.level == "host" and not first.in_vm:
            row.vm = None  # as the host profile's rows: a VMM's other threads are host rows
        if stack is None:
            frames = row_frames(row)
        else:
            base = 2 if profile.level == "guest" or first.in_vm else 1  # VM and process, or process
            markers = tuple(Frame(label) for label in path[base:ctx])
            calls = tuple(call_frame(label, f) for label, f in zip(path[ctx:], stack.frames, strict=True))
            frames = row_frames(row)[:-1] + markers + calls
        labels = (("cpu", first.cpu), ("tid", first.tid)) + ((("vcpu", first.vcpu),) if first.vcpu is not None
                                                              else ())
        out.append(Stack(frames, float(n), row, labels))
    return sorted(out, key=lambda st: -st.samples)


def profile_stacks(an: Analysis | StreamedStacks | None, profile: Profile, cpu: int | None = None,
                   limit: int | None = None) -> list[Stack]:
    """The stacks of one profile, largest row first (at most `limit` rows); VM rows of the host level are
    split when an Analysis is given; with call stacks recorded, function and VM rows are call paths."""
    if an is not None and an.rec.stacks is not None:  # call_graph(an).recorded, without building the graph
        kept = [r for r in profile.rows if r.kind not in (RowKind.FUNCTION, RowKind.UNKNOWN, RowKind.VM)]
        rows = [Stack(row_frames(r), r.samples, r) for r in kept if r.samples > 0]
        # a recording read a piece at a time has its paths summed (analyse/stream_callgraph.py)
        paths = sorted_paths(profile, an.split_paths(profile.level, profile.vm, profile.vcpu)) \
            if isinstance(an, StreamedCallGraph) else path_stacks(an, profile, cpu)
        return sorted(paths + rows, key=lambda st: -st.samples)[:limit]
    rows = sorted(profile.rows, key=lambda r: -r.samples)[:limit]
    if an is not None and profile.level == "host":
        # a streamed analysis (analyse/stream_stacks.py) splits VM rows from its sums
        split = an.vm_rows if isinstance(an, StreamedStacks) else lambda r, c: vm_rows(an, r, c)
        rows = [g for r in rows for g in split(r, cpu)]
    return [Stack(row_frames(r), r.samples, r) for r in rows if r.samples > 0]


def stacks(an: Analysis | StreamedStacks | None, profiles: list[Profile], cpu: int | None = None,
           limit: int | None = None) -> Iterator[tuple[Profile, list[Stack]]]:
    for p in profiles:
        yield p, profile_stacks(an, p, cpu, limit)
