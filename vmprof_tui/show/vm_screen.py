"""A VM's vCPUs, with each one's shares and top function."""

from __future__ import annotations

from textual.binding import Binding

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.screen import VmTableScreen


class VmScreen(VmTableScreen):
    BINDINGS = [Binding("enter", "drill", "processes")]
    columns = ("vCPU", "tid", "guest %", "idle %", "steal %", "top function")
    default_sort = "vCPU"

    def title_text(self, an: ProfileSource) -> str:
        return f"VM {self.vm}: vCPUs (Enter: processes on the vCPU)"

    def vm_rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        out = []
        for vcpu, tid in an.vcpu_threads(self.vm):
            g = an.guest_summary(self.vm, vcpu)
            out.append((str(vcpu), (f"vcpu{vcpu}", tid, g.ratios["user"] + g.ratios["os"],
                                    g.ratios["idle"], g.ratios["steal"], demangle(g.top_function))))
        return out

    def drill(self, key: str | None) -> None:
        if key is not None:
            self.app.open_view("process", self.vm, int(key))
