"""The host's rows: host kernel, VMM and other processes, and one [VM] row per VM."""

from __future__ import annotations

from textual.binding import Binding

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats.table import column_widths
from vmprof_tui.show.screen import SCROLLBAR, BlockKeys, TableScreen
from vmprof_tui.show.stacks import process_name
from vmprof_tui.show.text import cut


class HostScreen(BlockKeys, TableScreen):
    BINDINGS = [Binding("c", "callers", "callers"), Binding("f", "flame", "flame"), *BlockKeys.BINDINGS]
    columns = ("samples", "%", "process", "module", "function")

    def action_callers(self) -> None:
        if key := self.selected():
            self.app.open_view("callers", None, key)

    def action_flame(self) -> None:
        self.app.open_view("flame", None)

    def title_text(self, an: ProfileSource) -> str:
        return "Host: host kernel, VMM and other processes, and one [VM] row per VM"

    def fit(self, rows: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
        """In a terminal too narrow for every name, the function column gets its width first, as in `report`'s
        table (column_widths): long process and module names are cut before it is (at 80 columns a module column
        sized to its longest name pushed the function off the screen)."""
        cols = self.app.size.width - SCROLLBAR
        texts = [[str(c) if i > 1 else f"{c:.1f}" if isinstance(c, float) else str(c) for i, c in enumerate(r)]
                 for _k, r in rows]
        longest = [max([len(name)] + [len(t[i]) for t in texts]) for i, name in enumerate(self.columns)]
        if not rows or cols <= 0 or sum(n + 2 for n in longest) <= cols:
            return rows
        widths = column_widths(longest, cols, cols // 3)  # a screen is read by its functions: a third at least
        return [(k, (*r[:2], *(cut(t, w) for t, w in zip(text[2:], widths[2:], strict=True))))
                for (k, r), text in zip(rows, texts, strict=True)]

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        # sorted by samples and not filtered, the first rows are all the table holds; otherwise every row
        by_samples = self.columns[self.sort_column] in ("samples", "%") and not self.filter
        shown, all_rows = an.host_rows(self.max_rows if by_samples else None)
        self.hidden_rows = all_rows - len(shown)
        total = an.host_summary().total_samples or 1.0
        return [(f"{r.function}\0{r.module}\0{r.pid}", (int(round(r.samples)), 100 * r.samples / total,
                                                      process_name(r) or "", r.module, demangle(r.function)))
                for r in shown]
