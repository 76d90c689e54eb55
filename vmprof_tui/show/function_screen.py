"""The functions of one guest process."""

from __future__ import annotations

from textual.binding import Binding

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.screen import BlockKeys, VmTableScreen


class FunctionScreen(BlockKeys, VmTableScreen):
    BINDINGS = [Binding("c", "callers", "callers"), Binding("f", "flame", "flame"), *BlockKeys.BINDINGS]
    columns = ("function", "module", "samples", "% of process")

    def action_callers(self) -> None:
        if key := self.selected():
            self.app.open_view("callers", self.vm, key)

    def action_flame(self) -> None:
        self.app.open_view("flame", self.vm, self.process)

    def __init__(self, vm: str, vcpu: int | None, process: str) -> None:
        super().__init__(vm)
        self.vcpu, self.process = vcpu, process

    def title_text(self, an: ProfileSource) -> str:
        return f"VM {self.vm} vcpu{self.vcpu} process {self.process}: functions"

    def vm_rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        mine = [r for r in an.guest_rows(self.vm, self.vcpu) if r.process == self.process]
        total = sum(r.samples for r in mine) or 1.0
        return [(r.function, (demangle(r.function), r.module, int(round(r.samples)), 100 * r.samples / total))
                for r in mine]
