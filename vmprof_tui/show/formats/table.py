"""The papers' table: a header with totals and ratios, then `Samples %Ratio Process Module Function` rows.

At a terminal (or given --width N or COLUMNS) the table fits that width, never wider, the long column last as perf puts
it: the function column gets its width first, the process and module columns what is left (down to a floor),
and a name longer than its column ends in an ellipsis instead of widening every line.  To a pipe or a file
(without --width or COLUMNS) every name is whole and each column as wide as its longest name, as perf --stdio.

The rows are laid out here rather than by `rich.table.Table`: every cell is one line at a fixed width, so a row is
only padding and cutting (with rich's own cell-width functions), while rich measures and renders each cell as a
renderable, which is far slower on large profiles (docs/performance.md).
"""

from __future__ import annotations

from operator import attrgetter

from rich.cells import cell_len, set_cell_size

from vmprof_tui.analyse.shares import Profile, Row
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.stacks import process_name
from vmprof_tui.show.text import fill, wrap

ONE_PROFILE = False


def header(profile: Profile, cols: int | None = 80) -> list[str]:
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
    lines = fill([part for f in fields for part in wrap(f, cols, "")], cols or 1 << 30) + [f"{names} = {values}"]
    return lines + [line for n in profile.notes for line in wrap(f"note: {n}", cols, "      ")]


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


CAPS = (9, 8, 24, 28)  # Samples, %Ratio, Process, Module: the widest each gets at a width
FLOORS = (10, 12)  # Process, Module: the narrowest they are cut to before the function column is (60 columns: 4)
FUNCTION_MIN = 16  # the function column's width before process and module get what is left


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None, cols: int | None = None) -> str:
    """The table of one profile in `cols` columns, or with whole names (cols None)."""
    rows = sort_rows(profile.shown_rows, sort)[:limit]
    total = profile.total_samples or 1.0
    cells = [("Samples", "%Ratio", "Process", "Module", "Function")]
    processes: dict[tuple, str] = {}  # rows are many, their processes few
    cells += [(str(int(round(r.samples))), f"{100.0 * r.samples / total:.3f}",
               processes.get((r.process, r.pid)) or processes.setdefault((r.process, r.pid), process_name(r) or ""),
               r.module, demangle(r.function)) for r in rows]
    columns: list = list(zip(*cells, strict=True))
    del cells  # a column is let go once fitted: cells of many rows are large
    plain = ["".join(texts).isascii() for texts in columns]  # then a cell's width is its length (the usual case)
    longest = [max(map(len if p else cell_len, texts)) for p, texts in zip(plain, columns, strict=True)]
    widths = longest if cols is None else column_widths(longest, cols)
    fitted = []
    for i, (w, p) in enumerate(zip(widths, plain, strict=True)):
        fitted.append(_fit_column(columns[i], w, p, right=i < 2))
        columns[i] = None
    body = ["  ".join(row).rstrip() for row in zip(*fitted, strict=True)]
    return "\n".join(header(profile, cols) + body) + "\n"


def column_widths(longest: list[int], cols: int, function_min: int = FUNCTION_MIN) -> list[int]:
    """The five columns' widths in `cols` columns (lines end 2 short of it): every column as wide as its longest
    cell, capped; the function takes what is left, at least `function_min` (or its longest) before the process
    and module columns are narrowed to make room, and they no further than FLOORS; then the function is cut."""
    widths = [min(cap, n) for cap, n in zip(CAPS, longest, strict=False)]
    room = cols - sum(w + 2 for w in widths) - 2  # what the function column gets
    need = min(function_min, longest[4])
    for floors in (FLOORS, (4, 4)):  # then, in a very narrow terminal, narrower still
        for i, floor in zip((3, 2), floors[::-1], strict=True):  # module first: the longer names, the less read
            if room < need and widths[i] > floor:
                give = min(need - room, widths[i] - floor)
                widths[i] -= give
                room += give
    widths.append(max(1, min(room, longest[4])))
    return widths


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
    return "\n".join(render_profile(p, inp.sort, inp.limit, inp.cols) for p in inp.profiles)
