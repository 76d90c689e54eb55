"""`vmprof report --children` and `--callers FUNCTION`: perf's callee and caller views as tables.

The header is the profile table's (level, totals, ratios, notes), followed by the notes of the stacks
themselves (how many were partial or truncated, and in which objects).
"""

from __future__ import annotations

from vmprof_tui.analyse.callgraph import WeightedStacks, callers, children
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.show.formats.table import header
from vmprof_tui.show.text import cut, wrap

NUMBERS = 40  # the columns before a children row's function: "Children Self %Children %Self  "
CHAIN_AT = 20  # the columns before a callers row's chain: "Samples %Ratio  "


def _head(profile: Profile, ws: WeightedStacks, cols: int | None) -> list[str]:
    lines = header(profile, cols) + [line for n in ws.notes() for line in wrap(f"note: {n}", cols, "      ")]
    return lines + wrap(f"Call graph: {ws.samples} samples with a call path (percentages below are of these)", cols)


def render_children(profile: Profile, ws: WeightedStacks, limit: int | None = None, cols: int | None = None) -> str:
    """Per function: Children (samples with it on the stack) and Self (samples with it as the leaf); in `cols`
    columns (a name longer than the rest ends in an ellipsis) or with whole names (None)."""
    total = ws.samples or 1
    rows = children(ws)[:limit]
    lines = _head(profile, ws, cols)
    room = None if cols is None else cols - NUMBERS
    lines.append(f"{'Children':>9} {'Self':>9} {'%Children':>10} {'%Self':>8}  Function")
    for r in rows:
        lines.append(f"{r.total:>9} {r.self_samples:>9} {100.0 * r.total / total:>10.3f} "
                     f"{100.0 * r.self_samples / total:>8.3f}  {cut(r.function, room)}")
    return "\n".join(lines) + "\n"


def render_callers(profile: Profile, ws: WeightedStacks, function: str, limit: int | None = None,
                   cols: int | None = None) -> str:
    """Every distinct chain that leads to `function`, outermost first, with its samples; in `cols` columns (a
    chain longer than the rest is cut at its outer end, where the function stays in view) or whole (None)."""
    chains = callers(ws, function)
    total = ws.samples or 1
    reached = sum(n for _c, n in chains)
    lines = _head(profile, ws, cols)
    room = None if cols is None else cols - CHAIN_AT
    lines += wrap(f"Callers of {function}: {reached} samples ({100.0 * reached / total:.3f}%)", cols)
    lines.append(f"{'Samples':>9} {'%Ratio':>8}  Chain (outermost first)")
    for chain, n in chains[:limit]:
        text = " → ".join(chain)
        if room is not None and len(text) > room:
            text = "…" + text[len(text) - room + 1:]
        lines.append(f"{n:>9} {100.0 * n / total:>8.3f}  {text}")
    return "\n".join(lines) + "\n"
