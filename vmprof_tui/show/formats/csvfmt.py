"""CSV report: one row per table row, with the level's identity in every line."""

from __future__ import annotations

import csv
import io

from vmprof_tui.analyse.analysis import Profile
from vmprof_tui.show.formats import ReportInput, joined
from vmprof_tui.show.formats.table import sort_rows

COLUMNS = ("level", "vm", "vcpu", "samples", "ratio", "function", "module", "process", "pid")


ONE_PROFILE = False

def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    total = profile.total_samples or 1.0
    for r in sort_rows(profile.rows, sort)[:limit]:
        w.writerow((profile.level, r.vm or profile.vm or "", "" if profile.vcpu is None else profile.vcpu,
                    int(round(r.samples)), f"{100.0 * r.samples / total:.3f}", r.function, r.module,
                    r.process or "", "" if r.pid is None else r.pid))
    return out.getvalue()


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
