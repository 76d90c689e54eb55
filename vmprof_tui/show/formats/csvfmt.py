"""CSV report: one header, then one line per row with the level's identity in every line (at the guest level
without --vm every VM's rows follow one another under the one header, so pandas and DuckDB read numbers).
Written a block of rows at a time from the rows as columns (analyse/row_table.py)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.formats.table import BLOCK, names, ordered, whole_samples

COLUMNS = ("level", "vm", "vcpu", "samples", "ratio", "function", "module", "process", "pid")

ONE_PROFILE = False


def render_parts(inp: ReportInput) -> Iterator[str]:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for profile in inp.profiles:
        rows, index = ordered(profile, inp.sort, inp.limit)
        total = profile.total_samples or 1.0
        vcpu = "" if profile.vcpu is None else profile.vcpu
        function = names(rows.func[index], rows.strings).map(demangle)
        vm = names(rows.vm[index], rows.strings).map(lambda v, of=profile.vm: v or of or "")
        module, process = names(rows.module[index], rows.strings), names(rows.process[index], rows.strings)
        for start in range(0, len(index), BLOCK):
            at = index[start:start + BLOCK]
            samples = rows.samples[at]
            w.writerows(zip([profile.level] * len(at), vm.of(rows.vm[at]), [vcpu] * len(at),
                            whole_samples(samples), [f"{x:.3f}" for x in (100.0 * samples / total).tolist()],
                            function.of(rows.func[at]), module.of(rows.module[at]), process.of(rows.process[at]),
                            ["" if pid < 0 else pid for pid in rows.pid[at].tolist()], strict=True))
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()


def render(inp: ReportInput) -> str:
    return "".join(render_parts(inp))
