"""A profile's rows as columns (analyse/row_table.py) give what the rows as a list give: rounding to whole
samples, filters, sums, ratios, the --sort orders, and the JSON and CSV text (a report of a large recording is
made from the columns; the list is the reference)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.row_table import RowTable
from vmprof_tui.analyse.shares import Profile, Row, row_ratios, whole_rows
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput, csvfmt, jsonfmt
from vmprof_tui.show.formats.table import SORT_KEYS

F, U = RowKind.FUNCTION, RowKind.UNKNOWN


def some_rows() -> list[Row]:
    """Ties of samples and names, names out of ASCII and mangled, rows without a process or pid, the host's idle
    task, unresolved rows, VM rows and fractional virtual rows (one a numpy float)."""
    rows = [Row(5.0, "b", "libc.so.6", "app", 10, kernel=2.0), Row(5.0, "a", "libc.so.6", "app", 11),
            Row(5.0, "a", "[kernel.kallsyms]", "app", 10, kernel=5.0), Row(3.0, "_ZN3foo3barEv", "x", "db", 7),
            Row(3.0, "é_func", "mod\"ule", "wörker", 3, kernel=1.0), Row(2.0, "idle", "[kernel.kallsyms]", "swapper",
                                                                          0, kernel=2.0),
            Row(1.0, "[unknown]", "(guest RIP unknown)", None, None, "web", U), Row(0.4, "tiny", "m", "app", 10),
            Row(7.0, "[web]", "(VM1)", "qemu", 500, "web", RowKind.VM),
            Row(np.float64(2.5), "[idle]", "(cpu idle)", kind=RowKind.CPU_IDLE),
            Row(0.6, "[steal]", "(outside)", None, None, "web", RowKind.STEAL_OUTSIDE),
            Row(0.7, "[halt poll]", "(kvm)", None, None, "web", RowKind.HALT_POLL)]
    rows += [Row(float(n % 4 + 1), f"f{n % 5}", "m", "app", 10 + n % 3, kernel=float(n % 2)) for n in range(20)]
    return rows


def reference_order(rows: list[Row], sort: str) -> list[Row]:
    """The --sort orders as the report sorted Row objects."""
    if sort in ("function", "name"):
        return sorted(rows, key=lambda r: (demangle(r.function), r.module, r.process or "", -r.samples))
    if sort == "process":
        return sorted(rows, key=lambda r: (r.process or "", r.pid or 0, -r.samples, r.function))
    if sort == "pid":
        return sorted(rows, key=lambda r: (r.pid if r.pid is not None else -1, -r.samples, r.function))
    if sort == "module":
        return sorted(rows, key=lambda r: (r.module, -r.samples, r.function))
    return sorted(sorted(rows, key=lambda r: r.function), key=lambda r: r.samples, reverse=True)


def test_row_table_rounds_sums_and_orders_as_the_rows() -> None:
    rows = some_rows()
    table = RowTable.of_rows(rows)
    assert table.rows() == rows
    assert [type(r.samples) for r in table.rows()] == [type(r.samples) for r in rows]  # numpy floats stay so
    assert table.whole().rows() == whole_rows(rows)
    assert table.total() == sum(r.samples for r in rows)
    assert table.unresolved() == sum(r.samples for r in rows if r.kind is U)
    assert table.virtual_samples() == Profile("host", None, None, 1.0, 1.0, 0, {}, rows).virtual_samples
    for level in ("host", "guest"):
        assert table.ratios(level) == row_ratios(level, rows)
        assert list(table.ratios(level)) == list(row_ratios(level, rows))
    for sort in SORT_KEYS:
        assert table.take(table.order(sort)).rows() == reference_order(rows, sort), sort


def test_row_table_filters_as_the_rows() -> None:
    rows = some_rows()
    table = RowTable.of_rows(rows)
    tests = [lambda r: r.process in ("app", None), lambda r: str(r.pid) in ("10", "None"),
             lambda r: r.kind is RowKind.VM or (r.kind in (F, U) and not (r.vm is None and r.pid == 0))]
    for some in ([tests[0]], tests[:2], tests[2:], tests):
        want = [r for r in rows if all(t(r) for t in some)]
        got = table.passing(some)
        assert got.rows() == want
        assert got.ratios("host") == row_ratios("host", want) and got.total() == sum(r.samples for r in want)


def profile(rows: list[Row], total: float) -> Profile:
    return Profile("guest", "web", 1, total, 2.0, 3, {"os": 50.0, "user": 50.0}, rows, 1, ["a \"rows\": [], note"])


@pytest.mark.parametrize("total", [40.0, np.float64(40.0), 0.0])
def test_json_rows_are_json_dumps_of_the_rows(total: float) -> None:
    """Written a block at a time by hand, the JSON is json.dumps of the profile (rows in --sort order, numpy's
    rounding of ratios where the total or a row's samples are numpy floats)."""
    for rows in (some_rows(), []):
        p = profile(rows, total)
        for sort, limit in (("samples", None), ("module", 5)):
            doc = p.to_json()
            doc["rows"] = [r.to_json(total) for r in reference_order(p.shown_rows, sort)[:limit]]
            assert jsonfmt.render_profile(p, sort, limit) == json.dumps(doc, indent=1) + "\n"


def test_a_filtered_profiles_sums_are_of_the_type_the_rows_give() -> None:
    """Filtered, the columns' total and ratios are numpy floats where a row's samples are (Python's sum of the rows
    gives one then), so the JSON rounds a tie as the rows do (0.0075: 0.008 as numpy rounds, 0.007 as Python)."""
    import dataclasses

    from vmprof_tui.cli.report import filtered

    rows = [Row(3.0, "a", "m", "app", 10), Row(np.float64(39997.0), "[idle]", "(cpu idle)", kind=RowKind.CPU_IDLE),
            Row(5.0, "b", "m", "other", 11)]
    keep = [("process app or none", lambda r: r.process in ("app", None))]
    texts = []
    for kept in (rows, RowTable.of_rows(rows)):
        f = filtered(Profile("host", None, None, 40005.0, 1.0, 0, {}, kept), keep)
        whole = f.rows.whole() if isinstance(f.rows, RowTable) else whole_rows(f.rows)
        texts.append(jsonfmt.render_profile(dataclasses.replace(f, rows=whole)))
        assert type(f.total_samples) is np.float64
    assert texts[0] == texts[1] and '"ratio": 0.008' in texts[0]


def test_csv_rows_are_the_rows() -> None:
    rows = some_rows()
    p = profile(rows, 40.0)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(csvfmt.COLUMNS)
    for r in reference_order(p.shown_rows, "pid"):
        w.writerow((p.level, r.vm or p.vm or "", p.vcpu, int(round(r.samples)), f"{100.0 * r.samples / 40.0:.3f}",
                    demangle(r.function), r.module, r.process or "", "" if r.pid is None else r.pid))
    assert csvfmt.render(ReportInput(None, [p], sort="pid")) == out.getvalue()  # type: ignore[arg-type]


@pytest.mark.parametrize("cols", [None, 120])
def test_table_numbers_wider_than_their_titles_are_whole(cols: int | None) -> None:
    """A count of more digits than 'Samples' has letters (an hour of a 64-CPU host at 10 kHz has ten) and a ratio
    of 100.000 get columns wide enough for them, at any width (they were cut with an ellipsis)."""
    from vmprof_tui.show.formats.table import render_profile

    rows = [Row(2_304_000_123.0, "main", "prog", "prog", 7, None, RowKind.FUNCTION, 0.0),
            Row(3.0, "other", "prog", "prog", 7, None, RowKind.FUNCTION, 0.0)]
    text = render_profile(profile(rows, 2_304_000_126.0), cols=cols)
    top = next(line for line in text.splitlines() if "main" in line)
    assert top.split()[:2] == ["2304000123", "100.000"], top
    assert "…" not in text


def test_extended_table_holds_both_tables_rows_in_order() -> None:
    rows = some_rows()
    first, second = RowTable.of_rows(rows[:9]), RowTable.of_rows(rows[9:])
    extended = first.extended(second)
    assert extended is first  # in place: a large table is not held twice
    assert extended.rows() == rows
    assert extended.whole().rows() == whole_rows(rows)
    assert RowTable.of_rows(rows[:3]).extended(RowTable.of_rows([])).rows() == rows[:3]


def test_the_last_column_unpadded_gives_the_lines_the_padded_one_gave() -> None:
    """The table's function column is last and fitted without padding (table._fit_last: a name thousands of
    characters long padded every line to its length, which each line's rstrip then took off): every line is the same
    text as with the padded cell, for names that fit, are cut, are wide (non-ASCII), blank or end in spaces."""
    from vmprof_tui.show.formats.table import _fit_column, _fit_last

    texts = ["main", "", "   ", "trailing  ", "x" * 40, "\u6f22\u5b57\u540d\u524d" * 5, "caf\u00e9 ", "a\tb\t"]
    for w in (1, 2, 5, 12, 39, 40, 41, 200):
        for plain in (True, False):
            mine = [t for t in texts if t.isascii()] if plain else texts
            for prefix in ("   12  0.100  proc [1]  mod", "   12  0.100  proc [1]      "):
                padded = [f"{prefix}  {t}".rstrip() for t in _fit_column(mine, w, plain, right=False)]
                assert [f"{prefix}  {t}".rstrip() for t in _fit_last(mine, w, plain)] == padded, (w, plain)


@pytest.mark.parametrize("cols", [None, 60, 200])
def test_table_rows_without_the_last_columns_padding_are_the_padded_lines_stripped(
        cols: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' lines are joined without a strip where every function cell is unpadded and not blank: the same
    text as the function column padded to its longest name and each line stripped, with a blank function, one ending
    in spaces, a very long one, and in blocks of a few rows."""
    from vmprof_tui.show.formats import table

    rows = some_rows() + [Row(4.0, "", "blank.so", "app", 12), Row(4.0, "ends in spaces  ", "m", "app", 12),
                          Row(1.0, "T<" * 900 + ">" * 900, "big.so", "app", 12)]
    monkeypatch.setattr(table, "BLOCK", 5)  # blocks with the blank function and without it
    text = table.render_profile(profile(rows, 70.0), cols=cols)
    monkeypatch.setattr(table, "_fit_last", lambda texts, w, plain: table._fit_column(texts, w, plain, right=False))
    padded = table.render_profile(profile(rows, 70.0), cols=cols)
    assert text.splitlines() == [line.rstrip() for line in padded.splitlines()] and text.endswith("\n")
    assert not any(line != line.rstrip() for line in text.splitlines())
