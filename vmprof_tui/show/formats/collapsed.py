"""Collapsed stacks ("frame;frame;frame count"), the input of FlameGraph and speedscope.

Frames run from the outermost context inwards: VM, guest process, module, function at
the guest level; host process (or VM), module, function at the host level.
"""

from __future__ import annotations

from vmprof_tui.analyse.analysis import Profile
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.show.formats import ReportInput, joined

ONE_PROFILE = True

def _frame(text: str) -> str:
    return text.replace(";", ":").replace("\n", " ").strip() or "?"


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None) -> str:
    lines = []
    for r in sorted(profile.rows, key=lambda r: -r.samples)[:limit]:
        n = int(round(r.samples))
        if n <= 0:
            continue
        if profile.level == "guest":
            frames = [r.vm or profile.vm or "vm", r.process or r.function, r.module, r.function]
        elif r.kind is RowKind.VM:  # a host-level VM row: the VM is the whole stack
            frames = [r.function]
        else:
            frames = [r.process or "?", r.module, r.function]
        lines.append(";".join(_frame(f) for f in frames) + f" {n}")
    return "\n".join(lines) + "\n"


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
