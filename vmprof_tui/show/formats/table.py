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

from collections.abc import Iterator
from operator import attrgetter

from rich.cells import cell_len, set_cell_size

from vmprof_tui.analyse.shares import Profile, Row, process_name
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput
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
    return "".join(profile_parts(profile, sort, limit, cols))


TITLES = ("Samples", "%Ratio", "Process", "Module", "Function")
BLOCK = 16384  # rows laid out at once: a report can have a million rows, whose cells would be 700 MB at once


def profile_parts(profile: Profile, sort: str = "samples", limit: int | None = None,
                  cols: int | None = None) -> Iterator[str]:
    """render_profile's text in parts, BLOCK rows each: the names are read twice (once to measure the columns, once
    to lay them out) rather than all cells held at once."""
    rows = sort_rows(profile.shown_rows, sort)[:limit]
    total = profile.total_samples or 1.0
    processes: dict[tuple, str] = {}  # rows are many, their processes few

    def columns(block: list[Row], names_only: bool = False) -> list[list[str]]:
        names = [[processes.get((r.process, r.pid)) or processes.setdefault((r.process, r.pid), process_name(r) or "")
                  for r in block], [r.module for r in block], [demangle(r.function) for r in block]]
        if names_only:
            return names
        numbers = [[str(int(round(r.samples))) for r in block], [f"{100.0 * r.samples / total:.3f}" for r in block]]
        return numbers + names

    plain = [True] * len(TITLES)  # then a cell's width is its length (the usual case)
    longest = [len(t) for t in TITLES]
    if rows:  # the numbers' longest cells are those of the row with the most samples
        most = max(rows, key=attrgetter("samples"))
        longest[:2] = (max(a, len(b)) for a, b in zip(longest, columns([most])[:2], strict=False))
    for at in range(0, len(rows), BLOCK):
        for i, texts in enumerate(columns(rows[at:at + BLOCK], names_only=True), 2):
            plain[i] = plain[i] and "".join(texts).isascii()  # ASCII texts measured before: their length is their width
            longest[i] = max(longest[i], max(map(len if plain[i] else cell_len, texts)))
    widths = longest if cols is None else column_widths(longest, cols)

    def lines(block: list[list[str]]) -> str:
        fitted = [_fit_column(texts, w, p, right=i < 2)
                  for i, (texts, w, p) in enumerate(zip(block, widths, plain, strict=True))]
        return "".join("  ".join(row).rstrip() + "\n" for row in zip(*fitted, strict=True))

    yield "\n".join(header(profile, cols)) + "\n"
    yield lines([[t] for t in TITLES])
    for at in range(0, len(rows), BLOCK):
        yield lines(columns(rows[at:at + BLOCK]))


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


def _fit_column(texts: list[str], w: int, plain: bool, right: bool) -> list[str]:
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
    return "".join(render_parts(inp))


def render_parts(inp: ReportInput) -> Iterator[str]:
    """render's text in parts (the report writes them as they come)."""
    for n, p in enumerate(inp.profiles):
        if n:
            yield "\n"
        yield from profile_parts(p, inp.sort, inp.limit, inp.cols)
