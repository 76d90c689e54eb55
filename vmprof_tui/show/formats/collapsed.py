"""Collapsed stacks ("frame;frame;frame count"), the input of FlameGraph's flamegraph.pl, inferno and
speedscope.  The frames are those of `show.stacks` (root first); equal stacks are one line.  At the guest
level without --vm every VM's stacks are in the one file, each under its `[VM]` frame.
"""

from __future__ import annotations

from collections import Counter

from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.stacks import Stack, stacks

ONE_PROFILE = False


def frame_text(text: str) -> str:
    return text.replace(";", ":").replace("\n", " ").strip() or "?"


def folded(all_stacks: list[Stack]) -> Counter[str]:
    """Whole sample counts per folded stack (stacks that round to 0 samples are left out)."""
    out: Counter[str] = Counter()
    for st in all_stacks:
        out[";".join(frame_text(f.name) for f in st.frames)] += st.samples
    return Counter({k: int(round(v)) for k, v in out.items() if round(v) > 0})


def render(inp: ReportInput) -> str:
    counts = folded([st for _p, sts in stacks(inp.analysis, inp.profiles, inp.cpu, inp.limit) for st in sts])
    lines = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{k} {n}\n" for k, n in lines)
