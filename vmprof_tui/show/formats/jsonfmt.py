"""JSON report (contract in docs/formats.md).

Written a block of rows at a time from the rows as columns (analyse/row_table.py), each row's text made here in
the layout `json.dumps(doc, indent=1)` gives it: a million rows as dicts and json's encoder (pure Python with
an indent) were most of a large report's memory and time."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as quoted

import numpy as np

from vmprof_tui.analyse.row_table import RowTable
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.formats.table import BLOCK, Names, names, ordered, whole_samples

ONE_PROFILE = True
ROW = ('  {{\n   "samples": {},\n   "ratio": {!r},\n   "function": {},\n   "symbol": {},\n   "module": {},\n'
       '   "process": {},\n   "pid": {},\n   "vm": {}\n  }}')
ROWS_KEY = '\n "rows": [],'  # where json.dumps puts the rows: a key's quotes, never a string's (escaped)


def profile_parts(profile: Profile, sort: str = "samples", limit: int | None = None) -> Iterator[str]:
    """json.dumps of Profile.to_json with its rows by `sort`, the first `limit`, indented by 1, in parts."""
    text = json.dumps(dataclasses.replace(profile, rows=[]).to_json(), indent=1) + "\n"
    head, tail = text.split(ROWS_KEY, 1)
    rows, index = ordered(profile, sort, limit)
    if not len(index):
        yield text
        return
    total = profile.total_samples

    def texts(ids: np.ndarray, none: str | None = None) -> Names:
        """The JSON texts of a string column (none: the text of "")."""
        return names(ids[index], rows.strings).map(lambda t: none if none is not None and not t else quoted(t))

    function = names(rows.func[index], rows.strings).map(lambda t: quoted(demangle(t)))
    symbol, module = texts(rows.func), texts(rows.module)
    process, vm = texts(rows.process, none="null"), texts(rows.vm, none="null")
    yield head + '\n "rows": [\n'
    for start in range(0, len(index), BLOCK):
        at = index[start:start + BLOCK]
        ratios = _ratios(rows, at, total) if total else [0.0] * len(at)
        pids = ["null" if pid < 0 else pid for pid in rows.pid[at].tolist()]
        func = rows.func[at]
        yield ",\n" if start else ""
        yield ",\n".join(ROW.format(*row) for row in zip(
            whole_samples(rows.samples[at]), ratios, function.of(func), symbol.of(func), module.of(rows.module[at]),
            process.of(rows.process[at]), pids, vm.of(rows.vm[at]), strict=True))
    yield "\n ]," + tail


def _ratios(rows: RowTable, at: np.ndarray, total: float) -> list[float]:
    """Row.to_json's round(100 * samples / total, 3): numpy's rounding where the samples or the total are numpy
    floats (a streamed profile's total: 0.0075 gives 0.008), Python's elsewhere (0.007)."""
    ratio = 100.0 * rows.samples[at] / total
    if isinstance(total, np.floating):
        return np.round(ratio, 3).tolist()
    return np.where(rows.numpy_samples[at], np.round(ratio, 3), [round(r, 3) for r in ratio.tolist()]).tolist()


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None) -> str:
    return "".join(profile_parts(profile, sort, limit))


def render_parts(inp: ReportInput) -> Iterator[str]:
    """Each profile's text, one after the other, separated by a blank line."""
    for n, p in enumerate(inp.profiles):
        if n:
            yield "\n"
        yield from profile_parts(p, inp.sort, inp.limit)


def render(inp: ReportInput) -> str:
    return "".join(render_parts(inp))
