"""JSON report (contract in docs/formats.md)."""

from __future__ import annotations

import json

from vmprof_tui.analyse.shares import Profile
from vmprof_tui.show.formats import ReportInput, joined
from vmprof_tui.show.formats.table import sort_rows

ONE_PROFILE = True

def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None) -> str:
    doc = profile.to_json()
    total = profile.total_samples
    doc["rows"] = [r.to_json(total) for r in sort_rows(profile.shown_rows, sort)[:limit]]
    return json.dumps(doc, indent=1) + "\n"


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
