"""Every chain that leads to one function (perf's caller view), from the window's call paths."""

from __future__ import annotations

from vmprof_tui.analyse.callgraph import callers
from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show.screen import NO_STACKS, TableScreen


class CallersScreen(TableScreen):
    """Every chain that leads to one function, outermost first (perf's caller view)."""

    columns = ("samples", "%", "chain")

    def __init__(self, vm: str | None, function: str) -> None:
        super().__init__()
        self.vm, self.function = vm, function

    def prepare(self, an: ProfileSource) -> None:
        an.call_paths(self.vm)  # the window's call paths, made once in the worker thread

    def title_text(self, an: ProfileSource) -> str:
        ws = an.call_paths(self.vm)
        where = f"VM {self.vm}" if self.vm else "host"
        if ws is None:
            return NO_STACKS
        return f"{where}: callers of {self.function} (of {ws.samples} samples with a call path)"

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        ws = an.call_paths(self.vm)
        if ws is None:
            return []
        total = ws.samples or 1
        return [(" ; ".join(chain), (n, 100 * n / total, " → ".join(chain))) for chain, n in
                callers(ws, self.function)]
