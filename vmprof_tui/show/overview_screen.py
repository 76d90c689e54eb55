"""The first screen of `vmprof top`: the host and one row per VM, and the plot of the VM under the cursor."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable
from textual_plotext import PlotextPlot

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.screen import HOST_KEY, TableScreen

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 20) -> str:
    vals = list(values)[-width:]
    return "".join(SPARK[min(int(v / 100 * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in vals)


@dataclass
class VmSummary:
    vcpus: int
    user: float
    kernel: float
    steal1: float
    steal2: float
    idle: float
    top_process: str
    top_function: str


def vm_summary(an: ProfileSource, vm: str) -> VmSummary:
    g = an.guest_summary(vm)
    total = g.total_samples or 1.0
    return VmSummary(len(an.vcpu_threads(vm)), g.ratios["user"], g.ratios["os"], 100 * g.steal1 / total,
                     100 * g.steal2 / total, g.ratios["idle"], g.top_process, demangle(g.top_function))


class OverviewScreen(TableScreen):
    BINDINGS = [Binding("enter", "drill", "drill down"), Binding("s", "steal", "steal"),
                Binding("t", "timeline", "timeline"), Binding("f", "flame", "flame")]
    columns = ("VM", "vCPUs", "user %", "kernel %", "steal % (t1/t2)", "idle %", "top process",
               "top function", "history (busy %)")
    default_sort = "VM"

    PLOT_FROM_HEIGHT = 26  # terminal rows from which the plot (14 rows) leaves the VM table room to show VMs

    def below_table(self) -> ComposeResult:
        yield PlotextPlot(id="plot")

    def on_resize(self, event: events.Resize) -> None:
        # in a small terminal the VM table is what matters: the plot goes until there is room for both
        self.query_one("#plot", PlotextPlot).display = event.size.height >= self.PLOT_FROM_HEIGHT

    def refresh_from(self, an: ProfileSource | None) -> None:
        super().refresh_from(an)
        if an is not None and self.ready:
            self.draw_plot()

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.draw_plot()

    def draw_plot(self) -> None:
        """user, steal and idle of the VM under the cursor (the first VM on the host row) over the last minutes."""
        history = self.app.usage
        vm = self.selected()
        if vm not in history:
            vm = next(iter(history), None)
        widget = self.query_one("#plot", PlotextPlot)
        plt = widget.plt
        plt.clear_figure()
        if vm is not None:
            points = list(history[vm])
            t_end = points[-1][0] if points else 0.0
            x = [t - t_end for t, *_ in points]
            for i, (label, colour) in enumerate((("user+kernel %", "green"), ("steal %", "red"),
                                                 ("idle %", "blue")), start=1):
                plt.plot(x, [p[i] for p in points], label=label, color=colour, marker="braille")
            plt.title(f"VM {vm}: the last {int(-x[0]) if len(x) > 1 else 0} s")
            plt.xlabel("seconds")
            plt.ylim(0, 100)
        widget.refresh()

    def title_text(self, an: ProfileSource) -> str:
        h = an.host_summary()
        r = h.ratios
        return (f"OS:USER:IDLE:VM = {r['os']:.1f}:{r['user']:.1f}:{r['idle']:.1f}:{r['vm']:.1f}   "
                f"host samples {int(h.total_samples)}   lost {h.lost_samples}   VMs {len(an.vm_names())}")

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        h = an.host_summary()
        r = h.ratios
        out = [(HOST_KEY, ("(host)", "-", r["user"], r["os"], "-", r["idle"], h.top_process, h.top_function,
                           sparkline(self.app.history[HOST_KEY])))]
        for vm in an.vm_names():
            s = vm_summary(an, vm)
            steal = Text(f"{s.steal1 + s.steal2:5.1f} ({s.steal1:.1f}/{s.steal2:.1f})",
                         style="bold red" if s.steal1 + s.steal2 > 20 else "")
            out.append((vm, (vm, s.vcpus, s.user, s.kernel, steal, s.idle, s.top_process, s.top_function,
                             sparkline(self.app.history[vm]))))
        return out

    def drill(self, key: str | None) -> None:
        if key == HOST_KEY:
            self.app.open_view("host")
        elif key:
            self.app.open_view("vm", key)

    def action_steal(self) -> None:
        key = self.selected()
        if key and key != HOST_KEY:
            self.app.open_view("steal", key)

    def action_timeline(self) -> None:
        key = self.selected()
        if key and key != HOST_KEY:
            self.app.open_view("timeline", key)

    def action_flame(self) -> None:
        key = self.selected()
        if key:
            self.app.open_view("flame", None if key == HOST_KEY else key)
