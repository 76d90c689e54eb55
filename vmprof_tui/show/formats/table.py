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

from collections.abc import Callable, Iterator

import numpy as np
from rich.cells import cell_len, set_cell_size

from vmprof_tui.analyse.row_table import RowTable, as_table, object_array
from vmprof_tui.analyse.shares import Profile
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


def ordered(profile: Profile, sort: str, limit: int | None) -> tuple[RowTable, np.ndarray]:
    """The profile's rows as columns, and the index of the rows shown by samples (largest first, then by
    function), or grouped by process, pid, module or function (then by samples); the first `limit`."""
    rows = as_table(profile.rows)
    shown = np.flatnonzero(rows.samples >= 0.5)
    return rows, shown[rows.order(sort, shown)[:limit]]


class Names:
    """The texts of a column's keys (string ids, or process_key's), of the rows shown: rows are many, their
    names fewer, so each is made once and the rows look theirs up a block at a time."""

    def __init__(self, keys: np.ndarray, texts: list[str]) -> None:
        self.keys, self.texts = keys, texts  # keys sorted, each once
        self._array = object_array(texts)

    def map(self, how: Callable[[str], str]) -> Names:
        return Names(self.keys, [how(t) for t in self.texts])

    def of(self, keys: np.ndarray) -> list[str]:
        """The texts of these keys."""
        return self._array[np.searchsorted(self.keys, keys)].tolist()


def names(ids: np.ndarray, strings: np.ndarray) -> Names:
    """The Names of a string column's ids."""
    distinct = np.unique(ids)
    return Names(distinct, strings[distinct].tolist())


def process_key(rows: RowTable, at: np.ndarray) -> np.ndarray:
    """A row's process and pid as one key."""
    return (rows.process[at].astype(np.int64) << 32) | (rows.pid[at].astype(np.int64) + 1)


def process_names(rows: RowTable, at: np.ndarray) -> Names:
    """`name [pid]` of each process_key of these rows (shares.process_name; "" when it has none)."""
    keys = np.unique(process_key(rows, at))
    return Names(keys, [(f"{n} [{pid}]" if pid >= 0 else n) if n else "" for n, pid in zip(
        rows.strings[keys >> 32].tolist(), ((keys & 0xFFFFFFFF) - 1).tolist(), strict=True)])


def whole_samples(samples: np.ndarray) -> list[int]:
    """int(round(s)) of each."""
    return np.round(samples).astype(np.int64).tolist()


CAPS = (24, 28)  # Process, Module: the widest each gets at a width (numbers are never cut)
FLOORS = (10, 12)  # Process, Module: the narrowest they are cut to before the function column is (60 columns: 4)
FUNCTION_MIN = 16  # the function column's width before process and module get what is left


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None, cols: int | None = None) -> str:
    """The table of one profile in `cols` columns, or with whole names (cols None)."""
    return "".join(profile_parts(profile, sort, limit, cols))


TITLES = ("Samples", "%Ratio", "Process", "Module", "Function")
BLOCK = 16384  # rows laid out at once: a report can have a million rows, whose cells would be 700 MB at once


def profile_parts(profile: Profile, sort: str = "samples", limit: int | None = None,
                  cols: int | None = None) -> Iterator[str]:
    """render_profile's text in parts, BLOCK rows each.  The rows are columns (row_table.RowTable); each
    distinct name is measured and fitted to its column once."""
    rows, index = ordered(profile, sort, limit)
    total = profile.total_samples or 1.0

    def numbers(at: np.ndarray) -> list[list[str]]:
        return [list(map(str, whole_samples(rows.samples[at]))),
                [f"{x:.3f}" for x in (100.0 * rows.samples[at] / total).tolist()]]

    columns = [process_names(rows, index), names(rows.module[index], rows.strings),
               names(rows.func[index], rows.strings).map(demangle)]
    plain = [True] * len(TITLES)  # then a cell's width is its length (the usual case)
    longest = [len(t) for t in TITLES]
    if len(index):  # the numbers' longest cells are those of the row with the most samples
        most = index[np.argmax(rows.samples[index])]
        longest[:2] = (max(a, len(b[0])) for a, b in zip(longest[:2], numbers(np.array([most])), strict=True))
        for i, c in enumerate(columns, 2):
            plain[i] = "".join(c.texts).isascii()  # ASCII texts: their length is their width
            longest[i] = max(longest[i], max(map(len if plain[i] else cell_len, c.texts)))
    widths = longest if cols is None else column_widths(longest, cols)
    process, module = (Names(c.keys, _fit_column(c.texts, w, p, right=False))
                       for c, w, p in zip(columns[:2], widths[2:4], plain[2:4], strict=True))
    function = Names(columns[2].keys, _fit_last(columns[2].texts, widths[4], plain[4]))

    def lines(block: list[list[str]]) -> str:
        return "".join("  ".join(row).rstrip() + "\n" for row in zip(*block, strict=True))

    def row_lines(block: list[list[str]]) -> str:
        """lines() of rows whose last cells are _fit_last's: where none is blank, each ends in a non-space, so
        there is nothing to strip."""
        if all(block[-1]):
            return "\n".join(map("  ".join, zip(*block, strict=True))) + "\n"
        return lines(block)

    yield "\n".join(header(profile, cols)) + "\n"
    yield lines([_fit_column([t], w, p, right=i < 2) for i, (t, w, p) in enumerate(zip(TITLES, widths, plain,
                                                                                         strict=True))])
    for start in range(0, len(index), BLOCK):
        at = index[start:start + BLOCK]
        cells = [_fit_column(texts, w, True, right=True) for texts, w in zip(numbers(at), widths, strict=False)]
        yield row_lines([*cells, process.of(process_key(rows, at)), module.of(rows.module[at]),
                         function.of(rows.func[at])])


def column_widths(longest: list[int], cols: int, function_min: int = FUNCTION_MIN) -> list[int]:
    """The five columns' widths in `cols` columns (lines end 2 short of it): every column as wide as its longest
    cell, the names' capped; the function takes what is left, at least `function_min` (or its longest) before the
    process and module columns are narrowed to make room, and they no further than FLOORS; then the function is
    cut."""
    widths = longest[:2] + [min(cap, n) for cap, n in zip(CAPS, longest[2:4], strict=True)]
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


def _fit_last(texts: list[str], w: int, plain: bool) -> list[str]:
    """_fit_column(texts, w, plain, right=False) without the padding that each line's rstrip takes off again: the
    function column is last, and one name thousands of characters long (a C++ template) made every line as long."""
    if not plain:
        return [(set_cell_size(t, w - 1) + "…" if cell_len(t) > w else t).rstrip() for t in texts]
    return [(t if len(t) <= w else t[:w - 1] + "…").rstrip() for t in texts]


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
