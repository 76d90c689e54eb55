"""The papers' table: a header with totals and ratios, then `Samples %Ratio Process Module Function` rows.

A `rich` table at the terminal's width (COLUMNS, else the terminal, else 80 columns), the long column last as
perf puts it: a name longer than its column ends in an ellipsis instead of widening every line.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from vmprof_tui.analyse.analysis import Profile, Row
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput, joined
from vmprof_tui.show.stacks import process_name
from vmprof_tui.show.text import fill, width

ONE_PROFILE = False


def header(profile: Profile, cols: int = 80) -> list[str]:
    where = "host" if profile.level == "host" else f"guest {profile.vm}" + (
        f" vcpu{profile.vcpu}" if profile.vcpu is not None else "")
    total = profile.total_samples
    unresolved = 100.0 * profile.unresolved_samples / total if total else 0.0
    virtual = profile.virtual_samples or 0.0
    what = "idle" if profile.level == "host" else "steal and idle"
    keys = list(profile.ratios)
    names = ":".join(k.upper() if k != "steal" else "steal" for k in keys)
    values = ":".join(f"{profile.ratios[k]:.1f}" for k in keys)
    fields = [f"Level: {where}", f"Total samples: {int(round(total))}",
              f"({int(round(virtual))} of them {what} from sched events)",
              f"Duration: {profile.duration_s:.2f} s", f"Lost samples: {profile.lost_samples}",
              f"Unresolved: {unresolved:.1f}%"]
    lines = fill(fields, cols) + [f"{names} = {values}"]
    lines += [f"note: {n}" for n in profile.notes]
    return lines


SORT_KEYS = ("samples", "process", "pid", "module", "function", "name")  # perf's sort keys; name = function


def sort_rows(rows: list[Row], sort: str) -> list[Row]:
    """Rows by samples (largest first), or grouped by process, pid, module or function (then by samples)."""
    if sort in ("function", "name"):
        return sorted(rows, key=lambda r: (demangle(r.function), r.module, r.process or "", -r.samples))
    if sort == "process":
        return sorted(rows, key=lambda r: (r.process or "", r.pid or 0, -r.samples, r.function))
    if sort == "pid":
        return sorted(rows, key=lambda r: (r.pid if r.pid is not None else -1, -r.samples, r.function))
    if sort == "module":
        return sorted(rows, key=lambda r: (r.module, -r.samples, r.function))
    return sorted(rows, key=lambda r: (-r.samples, r.function))


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None, cols: int | None = None) -> str:
    cols = cols or width()
    rows = sort_rows(profile.shown_rows, sort)[:limit]
    total = profile.total_samples or 1.0
    cells = [(str(int(round(r.samples))), f"{100.0 * r.samples / total:.3f}", process_name(r) or "", r.module,
              demangle(r.function)) for r in rows]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="", padding=(0, 2, 0, 0))
    # every column as wide as its longest cell (process and module capped); the function takes what is left
    used = 0
    for i, (name, cap) in enumerate((("Samples", 9), ("%Ratio", 8), ("Process", 24), ("Module", 28))):
        w = min(cap, max([len(name)] + [len(c[i]) for c in cells]))
        used += w + 2
        table.add_column(name, justify="right" if i < 2 else "left", no_wrap=True, overflow="ellipsis",
                         min_width=w, max_width=w)
    table.add_column("Function", no_wrap=True, overflow="ellipsis", max_width=max(16, cols - used - 2))
    for c in cells:
        table.add_row(*c)
    out = io.StringIO()
    Console(file=out, width=cols, color_system=None, highlight=False, markup=False, emoji=False,
            legacy_windows=False).print(table)
    body = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join(header(profile, cols) + body) + "\n"


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
