"""The papers' table: a header with totals and ratios, then `Samples %Ratio Function Module` rows."""

from __future__ import annotations

from vmprof_tui.analyse.analysis import Profile, Row
from vmprof_tui.show.formats import ReportInput, joined

ONE_PROFILE = False

def header(profile: Profile) -> list[str]:
    where = "host" if profile.level == "host" else f"guest {profile.vm}" + (
        f" vcpu{profile.vcpu}" if profile.vcpu is not None else "")
    total = profile.total_samples
    unresolved = 100.0 * profile.unresolved_samples / total if total else 0.0
    keys = list(profile.ratios)
    names = ":".join(k.upper() if k != "steal" else "steal" for k in keys)
    values = ":".join(f"{profile.ratios[k]:.1f}" for k in keys)
    lines = [f"Level: {where}   Total samples: {int(round(total))}   Duration: {profile.duration_s:.2f} s   "
             f"Lost samples: {profile.lost_samples}   Unresolved: {unresolved:.1f}%",
             f"{names} = {values}"]
    lines += [f"note: {n}" for n in profile.notes]
    return lines


def sort_rows(rows: list[Row], sort: str) -> list[Row]:
    if sort == "name":
        return sorted(rows, key=lambda r: (r.function, r.module, r.process or ""))
    return sorted(rows, key=lambda r: (-r.samples, r.function))


def render_profile(profile: Profile, sort: str = "samples", limit: int | None = None) -> str:
    rows = sort_rows(profile.rows, sort)[:limit]
    total = profile.total_samples or 1.0
    fw = max([len("Function")] + [len(r.function) for r in rows])
    mw = max([len("Module")] + [len(r.module) for r in rows])
    lines = header(profile)
    lines.append(f"{'Samples':>9} {'%Ratio':>8}  {'Function':<{fw}}  {'Module':<{mw}}  Process")
    for r in rows:
        proc = "" if r.process is None else (f"{r.process}" + (f" [{r.pid}]" if r.pid is not None else ""))
        lines.append(f"{int(round(r.samples)):>9} {100.0 * r.samples / total:>8.3f}  {r.function:<{fw}}  "
                     f"{r.module:<{mw}}  {proc}")
    return "\n".join(lines) + "\n"


def render(inp: ReportInput) -> str:
    return joined(inp, render_profile)
