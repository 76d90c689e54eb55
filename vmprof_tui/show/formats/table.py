"""The papers' table: a header with totals and ratios, then `Samples %Ratio Process Module Function` rows.

At the terminal's width (COLUMNS, else the terminal, else 80 columns), the long column last as perf puts it: a
name longer than its column ends in an ellipsis instead of widening every line.

The rows are laid out here rather than by `rich.table.Table`: every cell is one line at a fixed width, so a row is
only padding and cutting (with rich's own cell-width functions), while rich measures and renders each cell as a
renderable — 13 s for the 61,000 rows of a 600,000-sample recording, against a fraction of a second here.
"""

from __future__ import annotations

from operator import attrgetter

from rich.cells import cell_len, set_cell_size

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
    # two stable passes with plain keys: half the time of one pass with a tuple per row (260,000 rows)
    return sorted(sorted(rows, key=attrgetter("function")), key=attrgetter("samples"), reverse=True)


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None, cols: int | None = None) -> str:
    cols = cols or width()
    rows = sort_rows(profile.shown_rows, sort)[:limit]
    total = profile.total_samples or 1.0
    cells = [("Samples", "%Ratio", "Process", "Module", "Function")]
    processes: dict[tuple, str] = {}  # rows are many, their processes few
    cells += [(str(int(round(r.samples))), f"{100.0 * r.samples / total:.3f}",
               processes.get((r.process, r.pid)) or processes.setdefault((r.process, r.pid), process_name(r) or ""),
               r.module, demangle(r.function)) for r in rows]
    # every column as wide as its longest cell (process and module capped); the function takes what is left
    columns: list = list(zip(*cells, strict=True))
    del cells  # a column is let go once fitted: 260,000 rows are 50 MB of cells
    plain = ["".join(texts).isascii() for texts in columns]  # then a cell's width is its length (the usual case)
    longest = [max(map(len if p else cell_len, texts)) for p, texts in zip(plain, columns, strict=True)]
    widths = [min(cap, n) for cap, n in zip((9, 8, 24, 28), longest, strict=False)]
    widths.append(min(max(16, cols - sum(w + 2 for w in widths) - 2), longest[4]))
    fitted = []
    for i, (w, p) in enumerate(zip(widths, plain, strict=True)):
        fitted.append(_fit_column(columns[i], w, p, right=i < 2))
        columns[i] = None
    body = ["  ".join(row).rstrip() for row in zip(*fitted, strict=True)]
    return "\n".join(header(profile, cols) + body) + "\n"


def _fit_column(texts: tuple[str, ...], w: int, plain: bool, right: bool) -> list[str]:
    """Each text in exactly `w` cells: padded on the left if `right`, else on the right, or cut to w-1 cells and
    an ellipsis.  Plain (ASCII) columns without a call per cell: a report can have 260,000 rows."""
    if not plain:
        return [_fit(t, w, right) for t in texts]
    if right:
        return [t.rjust(w) if len(t) <= w else t[:w - 1] + "…" for t in texts]
    return [t.ljust(w) if len(t) <= w else t[:w - 1] + "…" for t in texts]


def _fit(text: str, w: int, right: bool) -> str:
    n = cell_len(text)
    if n > w:
        return set_cell_size(text, w - 1) + "…"
    return " " * (w - n) + text if right else text + " " * (w - n)


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
