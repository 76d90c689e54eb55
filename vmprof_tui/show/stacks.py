"""The frames of each profile row, root first: the one place that says what the stacks of the stack formats
(collapsed, pprof, speedscope, svg) are.

    host level   process [pid] -> function            a VM's row: [VM] -> VM/process [pid] -> function
    guest level  [VM] -> VM/process [pid] -> function  steal and idle rows: [VM] -> [steal] (outside)

A guest process frame carries its VM's name because pprof and speedscope merge frames by name: `compute [1]`
of three VMs would otherwise be one node.  Names are demangled (the mangled symbol is kept as
``Frame.system_name``); an unresolved function is named by its module, ``[libcrypto.so.3]``, as perf does.
Call-stack frames, once recorded, go between the process frame and the function frame in ``row_frames``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from vmprof_tui.analyse.analysis import Analysis, Profile, Row
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.resolve.resolver import UNKNOWN


@dataclass(frozen=True)
class Frame:
    name: str  # what users read
    module: str = ""
    system_name: str = ""  # the mangled symbol, when name is its demangled form


@dataclass(frozen=True)
class Stack:
    frames: tuple[Frame, ...]  # root first
    samples: float
    row: Row


def function_name(row: Row) -> str:
    """The function of a row as users read it: demangled, `[module]` when unresolved."""
    if row.kind is RowKind.UNKNOWN:
        if not row.module:
            return UNKNOWN
        return row.module if row.module.startswith("[") else f"[{row.module}]"  # [kernel.kallsyms] as it is
    return demangle(row.function)


def process_name(row: Row) -> str | None:
    """`name [pid]` of a row's process (None when it has none)."""
    if not row.process:
        return None
    return f"{row.process} [{row.pid}]" if row.pid is not None else row.process


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


def _vm_rows(an: Analysis, row: Row, cpu: int | None) -> list[Row]:
    """A host-level VM row split into the rows of its vCPU threads' samples (guest functions, and the VMM or
    KVM working for the vCPU); [row] when they do not add up to it."""
    if row.kind is not RowKind.VM or row.pid is None:
        return [row]
    sel = an.in_vm & (an.samples["pid"] == row.pid)
    if cpu is not None:
        sel &= an.samples["cpu"] == cpu
    if int(np.count_nonzero(sel)) != int(round(row.samples)):
        return [row]
    return an.aggregate(sel)


def profile_stacks(an: Analysis | None, profile: Profile, cpu: int | None = None,
                   limit: int | None = None) -> list[Stack]:
    """The stacks of one profile, largest row first (at most `limit` rows); VM rows of the host level are
    split when an Analysis is given."""
    rows = sorted(profile.rows, key=lambda r: -r.samples)[:limit]
    if an is not None and profile.level == "host":
        rows = [g for r in rows for g in _vm_rows(an, r, cpu)]
    return [Stack(row_frames(r), r.samples, r) for r in rows if r.samples > 0]


def stacks(an: Analysis | None, profiles: list[Profile], cpu: int | None = None,
           limit: int | None = None) -> Iterator[tuple[Profile, list[Stack]]]:
    for p in profiles:
        yield p, profile_stacks(an, p, cpu, limit)
