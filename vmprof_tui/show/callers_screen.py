"""Every chain that leads to one function (perf's caller view), from the window's call paths."""

from __future__ import annotations

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import WeightedStacks, callers
from vmprof_tui.show.screen import TableScreen
from vmprof_tui.show.stacks import call_graph


def weighted(an: Analysis, vm: str | None) -> WeightedStacks | None:
    """The VM's (or, for None, the host's) call paths; None when the window has no call stacks."""
    graph = call_graph(an)
    if not graph.recorded or (vm is not None and vm not in an.vm_names()):
        return None
    return graph.weighted("guest", vm) if vm is not None else graph.weighted("host")


NO_STACKS = "no call stacks in this window: start vmprof top with -g (or replay a recording made with -g)"


class CallersScreen(TableScreen):
    """Every chain that leads to one function, outermost first (perf's caller view)."""

    columns = ("samples", "%", "chain")

    def __init__(self, vm: str | None, function: str) -> None:
        super().__init__()
        self.vm, self.function = vm, function

    def title_text(self, an: Analysis) -> str:
        ws = weighted(an, self.vm)
        where = f"VM {self.vm}" if self.vm else "host"
        if ws is None:
            return NO_STACKS
        return f"{where}: callers of {self.function} (of {ws.samples} samples with a call path)"

    def rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        ws = weighted(an, self.vm)
        if ws is None:
            return []
        total = ws.samples or 1
        return [(" ; ".join(chain), (n, 100 * n / total, " → ".join(chain))) for chain, n in
                callers(ws, self.function)]
