"""The guest processes of a vCPU (or a VM), with its steal and idle rows."""

from __future__ import annotations

from collections import defaultdict

from textual.binding import Binding

from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show.screen import VmTableScreen


class ProcessScreen(VmTableScreen):
    BINDINGS = [Binding("enter", "drill", "functions"), Binding("f", "flame", "flame")]

    def action_flame(self) -> None:
        key = self.selected()
        self.app.open_view("flame", self.vm, key if key in self.processes else None)
    columns = ("process", "pid", "samples", "%")

    def __init__(self, vm: str, vcpu: int | None) -> None:
        super().__init__(vm)
        self.vcpu = vcpu
        self.processes: set[str] = set()  # the guest processes among the rows (they have functions)

    def title_text(self, an: ProfileSource) -> str:
        return f"VM {self.vm} vcpu{self.vcpu}: guest processes, steal and idle (Enter: functions)"

    def vm_rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        total = an.guest_summary(self.vm, self.vcpu).total_samples or 1.0
        agg: dict[tuple[str, int | None], float] = defaultdict(float)
        self.processes.clear()
        for r in an.guest_rows(self.vm, self.vcpu):
            agg[(r.process or f"{r.function} {r.module}", r.pid)] += r.samples
            if r.process and r.kind in (RowKind.FUNCTION, RowKind.UNKNOWN):
                self.processes.add(r.process)
        return [(name, (name, pid if pid is not None else "", int(round(n)), 100 * n / total))
                for (name, pid), n in agg.items() if n >= 0.5]

    def drill(self, key: str | None) -> None:
        # guest processes have functions below them; steal and idle rows do not
        if key is not None and key in self.processes:
            self.app.open_view("function", self.vm, self.vcpu, key)
