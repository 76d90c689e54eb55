"""CSV report: one header, then one line per row with the level's identity in every line (at the guest level
without --vm every VM's rows follow one another under the one header, so pandas and DuckDB read numbers)."""

from __future__ import annotations

import csv
import io

from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.formats.table import sort_rows

COLUMNS = ("level", "vm", "vcpu", "samples", "ratio", "function", "module", "process", "pid")

ONE_PROFILE = False


def render(inp: ReportInput) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for profile in inp.profiles:
        total = profile.total_samples or 1.0
        for r in sort_rows(profile.shown_rows, inp.sort)[:inp.limit]:
            w.writerow((profile.level, r.vm or profile.vm or "", "" if profile.vcpu is None else profile.vcpu,
                        int(round(r.samples)), f"{100.0 * r.samples / total:.3f}", demangle(r.function), r.module,
                        r.process or "", "" if r.pid is None else r.pid))
    return out.getvalue()
