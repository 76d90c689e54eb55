"""`vmprof top`: the live screen (Textual), on a LiveWindow or a ReplayWindow.

Screens: overview (one row per VM and one for the host) → VM (vCPUs) →
processes → functions; host view; steal detail; per-vCPU timeline.  Every
number on screen comes from the session's window (analyse/window.py: each chunk's
summary and analysis, summed; the whole window's Analysis where a screen needs it).
"""

from __future__ import annotations

import gc
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual_plotext import PlotextPlot

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import WeightedStacks, callers
from vmprof_tui.analyse.kinds import BlankKind, RowKind
from vmprof_tui.analyse.segments import SegmentKind
from vmprof_tui.analyse.window import WindowView
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show import flame
from vmprof_tui.show.dialogs import FilterScreen, HelpScreen
from vmprof_tui.show.formats.table import column_widths
from vmprof_tui.show.live_table import LiveTable
from vmprof_tui.show.stacks import call_graph, process_name
from vmprof_tui.show.text import cut

SPARK = "▁▂▃▄▅▆▇█"
SCROLLBAR = 2  # the columns a table's vertical scrollbar takes
HOST_KEY = "(host)"


def cell(value: object) -> Text:
    """A table cell as Text: numbers right-aligned, names literal (a plain str would be read as markup, and
    names like [steal] or [kernel.kallsyms] would vanish as unknown style tags)."""
    if isinstance(value, Text):
        return value
    if isinstance(value, float):
        return Text(f"{value:.1f}", justify="right")
    if isinstance(value, int):
        return Text(str(value), justify="right")
    return Text(str(value))


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


def vm_summary(an: Analysis, vm: str) -> VmSummary:
    g = an.guest_summary(vm)
    total = g.total_samples or 1.0
    return VmSummary(len(an.vcpu_threads(vm)), g.ratios["user"], g.ratios["os"], 100 * g.steal1 / total,
                     100 * g.steal2 / total, g.ratios["idle"], g.top_process, demangle(g.top_function))


class TableScreen(Screen):
    """A screen with a title line and one table, re-rendered from each new Analysis."""

    BINDINGS = [Binding("escape", "back", "back"), Binding("o", "sort", "sort"),
                Binding("slash", "filter", "filter")]
    columns: tuple[str, ...] = ()
    default_sort = "samples"  # the column a screen sorts by (descending for numbers) until `o` is pressed
    # Rows handed to the table, the first by the sort: Textual lays out every row it holds, and a 64-CPU host
    # has ~65,000 host functions in a 10 s window (minutes a refresh); the rest are reached with / or o.
    max_rows = 500
    summaries_only = False  # the screen reads only the window's summaries (no whole-window Analysis)
    hidden_rows = 0  # rows the window has beyond those rows() gave (it gave the first by the sort)

    def __init__(self) -> None:
        super().__init__()
        self.sort_column = self.columns.index(self.default_sort) if self.default_sort in self.columns else 0
        self.filter = ""
        self.cells: dict[str, list] = {}  # row key -> cells, in the table's order
        self._texts: dict[str, str | Text] = {}
        self.ready = False

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Static(id="title")
            yield LiveTable(id="table", cursor_type="row", zebra_stripes=True)
            yield from self.below_table()
            yield Static(id="status")
        yield Footer()

    cell_of = staticmethod(cell)  # how a value is drawn in the table

    def below_table(self) -> ComposeResult:
        """Widgets between the table and the status line (none but on the overview and the block view)."""
        return iter(())

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*self.columns)
        self.ready = True
        self.refresh_from(self.app.analysis)

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def action_sort(self) -> None:
        self.sort_column = (self.sort_column + 1) % len(self.columns)
        self.refresh_from(self.app.analysis)

    def action_filter(self) -> None:
        def done(value: str | None) -> None:
            self.filter = value or ""
            self.refresh_from(self.app.analysis)
        self.app.push_screen(FilterScreen(), done)

    def prepare(self, an: WindowView) -> None:
        """What rows() will read, computed in the poll's worker thread: the whole window's Analysis, unless the
        screen reads only summaries."""
        if not self.summaries_only:
            an.analysis  # noqa: B018

    def rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        raise NotImplementedError

    def title_text(self, an: Analysis) -> str:
        return ""

    def fit(self, rows: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
        """The rows' cells as shown (after the filter and the sort, which read them whole): as they are."""
        return rows

    def refresh_from(self, an: Analysis | None) -> None:
        # refreshes can arrive before the screen is mounted, and after the app began to exit
        if an is None or not self.ready or not self.is_attached:
            return
        table = self.query_one(LiveTable)
        self.hidden_rows = 0
        rows = [(k, r) for k, r in self.rows(an) if not self.filter or self.filter.lower() in " ".join(
            str(c) for c in r).lower()]
        col = self.sort_column

        def sort_key(item: tuple[str, tuple]) -> tuple:
            v = item[1][col]
            v = v.plain if isinstance(v, Text) else v
            return (0, -v) if isinstance(v, int | float) else (1, str(v))

        rows.sort(key=sort_key)
        matching = len(rows) + self.hidden_rows
        del rows[self.max_rows:]
        rows = self.fit(rows)
        seen: Counter[str] = Counter()
        keys: list[str] = []
        for key, _cells in rows:
            keys.append(f"{key}\0{seen[key]}" if seen[key] else key)  # row keys must be unique
            seen[key] += 1
        cells = {k: [self.cell_of(c) for c in r] for k, (_key, r) in zip(keys, rows, strict=True)}
        # Change the table, do not rebuild it: Textual measures every cell of every row it adds.
        selected = self._cursor_key(table)
        table.remove_rows([key for key in self.cells if key not in cells])
        for key, row in cells.items():
            before = self.cells.get(key)
            if before is None:
                table.add_row(*row, key=key)
                continue
            for (column_key, column), value, old in zip(table.columns.items(), row, before, strict=True):
                if value != old:  # re-measure only a cell wider than its column (narrower ones re-measure all)
                    wider = cell_len(str(value)) > column.content_width
                    table.update_cell(key, column_key, value, update_width=wider)
        if keys != list(self.cells):  # a change of order re-sorts the table
            rank = {tuple(map(str, cells[k])): i for i, k in enumerate(keys)}
            table.sort(key=lambda values: rank.get(tuple(map(str, values)), len(rank)))
            if selected in cells:  # the cursor stays on its row across refreshes
                table.move_cursor(row=table.get_row_index(selected), animate=False)
        self.cells = cells
        self.set_text("#title", self.title_text(an))
        status = self.app.status_text(an, self.filter, self.columns[col])
        if matching > len(rows):
            status += f"  |  first {len(rows):,} of {matching:,} rows (o: sort, /: filter)"
        self.set_text("#status", status)

    def set_text(self, selector: str, text: str | Text) -> None:
        """Update a Static only when its text changed (an update lays the screen out again)."""
        if self._texts.get(selector) != text:
            self._texts[selector] = text
            self.query_one(selector, Static).update(cell(text))

    @staticmethod
    def _cursor_key(table: DataTable) -> str | None:
        if not table.row_count or not 0 <= table.cursor_row < table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def selected(self) -> str | None:
        """The key of the row under the cursor, as rows() gave it."""
        key = self._cursor_key(self.query_one(DataTable))
        return key.split("\0")[0] if key is not None else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter or a click on a row (the row's key survives refreshes)."""
        self.drill(str(event.row_key.value).split("\0")[0])

    def drill(self, key: str | None) -> None:
        """Open what the row `key` contains; screens with something below them override this."""

    def action_drill(self) -> None:
        self.drill(self.selected())


class VmKeys:
    """`s` and `t` on every screen of a VM: its steal detail and its timeline."""

    BINDINGS = [Binding("s", "steal", "steal"), Binding("t", "timeline", "timeline")]
    vm: str

    def action_steal(self) -> None:
        if not isinstance(self, StealScreen):
            self.app.push_screen(StealScreen(self.vm))  # type: ignore[attr-defined]

    def action_timeline(self) -> None:
        if not isinstance(self, TimelineScreen):
            self.app.push_screen(TimelineScreen(self.vm))  # type: ignore[attr-defined]


class BlockKeys:
    """`b` on a function row: that function's LBR blocks (show/blocks_screen.py)."""

    BINDINGS = [Binding("b", "blocks", "blocks")]

    def action_blocks(self) -> None:
        from vmprof_tui.show.blocks_screen import open_blocks  # it builds on this module's screens

        open_blocks(self.app, self.selected(), getattr(self, "vm", None))  # type: ignore[attr-defined]


class VmTableScreen(VmKeys, TableScreen):
    """A table about one VM; empty (not an error) while the VM is not in the window."""

    BINDINGS = VmKeys.BINDINGS

    def __init__(self, vm: str) -> None:
        super().__init__()
        self.vm = vm

    def rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        return self.vm_rows(an) if self.vm in an.vm_names() else []

    def vm_rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        raise NotImplementedError


class OverviewScreen(TableScreen):
    BINDINGS = [Binding("enter", "drill", "drill down"), Binding("s", "steal", "steal"),
                Binding("t", "timeline", "timeline"), Binding("f", "flame", "flame")]
    columns = ("VM", "vCPUs", "user %", "kernel %", "steal % (t1/t2)", "idle %", "top process",
               "top function", "history (busy %)")
    default_sort = "VM"
    summaries_only = True

    PLOT_FROM_HEIGHT = 26  # terminal rows from which the plot (14 rows) leaves the VM table room to show VMs

    def below_table(self) -> ComposeResult:
        yield PlotextPlot(id="plot")

    def on_resize(self, event: events.Resize) -> None:
        # in a small terminal the VM table is what matters: the plot goes until there is room for both
        self.query_one("#plot", PlotextPlot).display = event.size.height >= self.PLOT_FROM_HEIGHT

    def refresh_from(self, an: Analysis | None) -> None:
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

    def title_text(self, an: Analysis) -> str:
        h = an.host_summary()
        r = h.ratios
        return (f"OS:USER:IDLE:VM = {r['os']:.1f}:{r['user']:.1f}:{r['idle']:.1f}:{r['vm']:.1f}   "
                f"host samples {int(h.total_samples)}   lost {h.lost_samples}   VMs {len(an.vm_names())}")

    def rows(self, an: Analysis) -> list[tuple[str, tuple]]:
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
            self.app.push_screen(HostScreen())
        elif key:
            self.app.push_screen(VmScreen(key))

    def action_steal(self) -> None:
        key = self.selected()
        if key and key != HOST_KEY:
            self.app.push_screen(StealScreen(key))

    def action_timeline(self) -> None:
        key = self.selected()
        if key and key != HOST_KEY:
            self.app.push_screen(TimelineScreen(key))

    def action_flame(self) -> None:
        key = self.selected()
        if key:
            self.app.push_screen(FlameScreen(None if key == HOST_KEY else key))


class HostScreen(BlockKeys, TableScreen):
    BINDINGS = [Binding("c", "callers", "callers"), Binding("f", "flame", "flame"), *BlockKeys.BINDINGS]
    columns = ("samples", "%", "process", "module", "function")
    summaries_only = True  # the rows are the window's (WindowView.host_rows), with host samples counted in the kernel

    def action_callers(self) -> None:
        if key := self.selected():
            self.app.push_screen(CallersScreen(None, key))

    def action_flame(self) -> None:
        self.app.push_screen(FlameScreen(None))

    def title_text(self, an: Analysis) -> str:
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

    def rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        # sorted by samples and not filtered, the first rows are all the table holds; otherwise every row
        by_samples = self.columns[self.sort_column] in ("samples", "%") and not self.filter
        shown, all_rows = an.host_rows(self.max_rows if by_samples else None)
        self.hidden_rows = all_rows - len(shown)
        total = an.host_summary().total_samples or 1.0
        return [(f"{r.function}\0{r.module}\0{r.pid}", (int(round(r.samples)), 100 * r.samples / total,
                                                      process_name(r) or "", r.module, demangle(r.function)))
                for r in shown]


class VmScreen(VmTableScreen):
    BINDINGS = [Binding("enter", "drill", "processes")]
    columns = ("vCPU", "tid", "guest %", "idle %", "steal %", "top function")
    default_sort = "vCPU"
    summaries_only = True

    def title_text(self, an: Analysis) -> str:
        return f"VM {self.vm}: vCPUs (Enter: processes on the vCPU)"

    def vm_rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        out = []
        for vcpu, tid in an.vcpu_threads(self.vm):
            g = an.guest_summary(self.vm, vcpu)
            out.append((str(vcpu), (f"vcpu{vcpu}", tid, g.ratios["user"] + g.ratios["os"],
                                    g.ratios["idle"], g.ratios["steal"], demangle(g.top_function))))
        return out

    def drill(self, key: str | None) -> None:
        if key is not None:
            self.app.push_screen(ProcessScreen(self.vm, int(key)))


class ProcessScreen(VmTableScreen):
    BINDINGS = [Binding("enter", "drill", "functions"), Binding("f", "flame", "flame")]

    def action_flame(self) -> None:
        key = self.selected()
        self.app.push_screen(FlameScreen(self.vm, key if key in self.processes else None))
    columns = ("process", "pid", "samples", "%")
    summaries_only = True

    def __init__(self, vm: str, vcpu: int | None) -> None:
        super().__init__(vm)
        self.vcpu = vcpu
        self.processes: set[str] = set()  # the guest processes among the rows (they have functions)

    def title_text(self, an: Analysis) -> str:
        return f"VM {self.vm} vcpu{self.vcpu}: guest processes, steal and idle (Enter: functions)"

    def vm_rows(self, an: Analysis) -> list[tuple[str, tuple]]:
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
            self.app.push_screen(FunctionScreen(self.vm, self.vcpu, key))


class FunctionScreen(BlockKeys, VmTableScreen):
    BINDINGS = [Binding("c", "callers", "callers"), Binding("f", "flame", "flame"), *BlockKeys.BINDINGS]
    columns = ("function", "module", "samples", "% of process")
    summaries_only = True

    def action_callers(self) -> None:
        if key := self.selected():
            self.app.push_screen(CallersScreen(self.vm, key))

    def action_flame(self) -> None:
        self.app.push_screen(FlameScreen(self.vm, self.process))

    def __init__(self, vm: str, vcpu: int | None, process: str) -> None:
        super().__init__(vm)
        self.vcpu, self.process = vcpu, process

    def title_text(self, an: Analysis) -> str:
        return f"VM {self.vm} vcpu{self.vcpu} process {self.process}: functions"

    def vm_rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        mine = [r for r in an.guest_rows(self.vm, self.vcpu) if r.process == self.process]
        total = sum(r.samples for r in mine) or 1.0
        return [(r.function, (demangle(r.function), r.module, int(round(r.samples)), 100 * r.samples / total))
                for r in mine]


class StealScreen(VmTableScreen):
    columns = ("vCPU", "kind", "cause", "seconds", "% of wall")
    default_sort = "seconds"
    detail = True  # each new chunk analysed in full once (window.poll)

    def prepare(self, an: WindowView) -> None:
        an.vcpu_steal(self.vm)  # each chunk's steal detail, computed once (WindowView.vcpu_steal)

    def title_text(self, an: Analysis) -> str:
        return (f"VM {self.vm}: steal by cause and by who held the pCPU (type 1), by exit reason (type 2); "
                "co-stop and halt polling")

    def vm_rows(self, an: Analysis) -> list[tuple[str, tuple]]:
        out = []
        for v in an.vcpu_steal(self.vm):
            wall = v["wall_s"] or 1.0
            for cause, sec in v["type1_by_cause_s"].items():
                if sec:
                    out.append((f"{v['vcpu']}:cause:{cause}", (f"vcpu{v['vcpu']}", "type 1 cause", cause, sec,
                                                                100 * sec / wall)))
            for who, sec in v["type1_by_holder_s"].items():
                out.append((f"{v['vcpu']}:{who}", (f"vcpu{v['vcpu']}", "type 1", who, sec, 100 * sec / wall)))
            for what, sec in (("co-stop", v["skew_s"]), ("halt polling", v["halt_poll_s"])):
                if sec:
                    out.append((f"{v['vcpu']}:{what}", (f"vcpu{v['vcpu']}", "of which", what, sec, 100 * sec / wall)))
            for why, sec in v["type2_by_exit_s"].items():
                out.append((f"{v['vcpu']}:{why}", (f"vcpu{v['vcpu']}", "type 2", why, sec, 100 * sec / wall)))
            out.append((f"{v['vcpu']}:idle", (f"vcpu{v['vcpu']}", "idle", "halt", v["idle_s"],
                                              100 * v["idle_s"] / wall)))
        return out


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


class DrawingScreen(Screen):
    """A screen that is one drawing (Static `#<drawing_id>`), redrawn from each new Analysis."""

    BINDINGS = [Binding("escape", "back", "back")]
    drawing_id = ""

    def __init__(self, vm: str | None) -> None:
        super().__init__()
        self.vm = vm
        self.ready = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id=self.drawing_id)
        yield Footer()

    def on_mount(self) -> None:
        self.ready = True
        self.refresh_from(self.app.analysis)

    def action_back(self) -> None:
        self.app.pop_screen()

    def prepare(self, an: WindowView) -> None:
        """What draw() will read, computed in the poll's worker thread: the whole window's Analysis."""
        an.analysis  # noqa: B018

    def refresh_from(self, an: Analysis | None) -> None:
        if an is not None and self.ready:
            self.query_one(f"#{self.drawing_id}", Static).update(self.draw(an))

    def draw(self, an: Analysis) -> Text | str:
        raise NotImplementedError


class FlameScreen(DrawingScreen):
    """An icicle graph of the window's call paths: a VM, one of its guest processes, or the host."""

    drawing_id = "flame"

    def __init__(self, vm: str | None, process: str | None = None) -> None:
        super().__init__(vm)
        self.process = process

    def draw(self, an: Analysis) -> Text | str:
        ws = weighted(an, self.vm)
        what = (f"VM {self.vm}" + (f" process {self.process}" if self.process else "")) if self.vm else "host"
        if ws is None:
            return f"{what}: {NO_STACKS}"
        keep = [i for i, p in enumerate(ws.paths) if self.process is None or p[1:2] == (self.process,)]
        width = max(self.size.width - 2, 20)
        lines = flame.icicle([ws.paths[i] for i in keep], [int(ws.counts[i]) for i in keep], width,
                             max(self.size.height - 6, 4))
        text = Text(f"{what}: {sum(int(ws.counts[i]) for i in keep)} samples, root at the top\n")
        for note in ws.notes():
            text.append(f"note: {note}\n", style="dim")
        text.append_text(flame.render(lines, width))
        return text


class TimelineScreen(VmKeys, DrawingScreen):
    """Per-vCPU strips of the window: guest running, VMM, steal, idle (analyse.segments.vcpu_segments)."""

    BINDINGS = [*DrawingScreen.BINDINGS, *VmKeys.BINDINGS]
    drawing_id = "timeline"
    # every state its own glyph and colour: named red, magenta and bright red all came out as one pink (38;5;197)
    # in Textual's 256-colour output, so the three kinds of steal are true colours far apart
    STATES = {0: (" ", ""), 1: ("█", "green"), 2: ("▓", "yellow"), 3: ("▒", "#ff2020"), 4: ("░", "blue"),
              5: ("▚", "#ff9000"), 6: ("╳", "#b060ff")}
    LEGEND = ((1, "guest"), (2, "VMM"), (3, "steal"), (5, "wake-up wait"), (6, "throttled"), (4, "idle"))
    WAKEUP_STATE = 5
    BLANK_STATES = {BlankKind.IDLE: 4, BlankKind.PREEMPTED: 3, BlankKind.BLOCKED: 2,  # VMM-blocked: VMM's colour
                    BlankKind.THROTTLED: 6}
    # what a column shows when several segments share it: samples over blanks, guest code over the VMM
    PAINT_ORDER = (SegmentKind.BLANK, SegmentKind.VMM, SegmentKind.GUEST)
    detail = True  # each new chunk analysed in full once (window.poll)

    def prepare(self, an: WindowView) -> None:
        an.vcpu_segments(self.vm)  # each chunk's segments, computed once (WindowView.vcpu_segments)

    def draw(self, an: Analysis) -> Text | str:
        width = max(self.size.width - 12, 20)
        w0, w1 = an.window()
        seconds = (w1 - w0) / 1e9
        text = Text(f"VM {self.vm}: last {seconds:.0f}s, one column = {seconds / width:.2f}s   ")
        for code, label in self.LEGEND:
            ch, style = self.STATES[code]
            text.append(ch * 2, style=style)
            text.append(f" {label}  ")
        text.append("\n\n")
        span = max(w1 - w0, 1)
        for vcpu, segments in sorted(an.vcpu_segments(self.vm).items()):
            strip = np.zeros(width, np.int8)  # unsampled on-CPU time stays blank
            for kind in self.PAINT_ORDER:
                for seg in segments:
                    if seg.kind is not kind:
                        continue
                    lo = min(int((seg.start_ns - w0) * width // span), width - 1)
                    hi = max(int((seg.end_ns - w0) * width // span), lo + 1)
                    strip[lo:hi] = (self.BLANK_STATES[seg.blank.kind] if seg.blank is not None
                                    else 1 if kind is SegmentKind.GUEST else 2)
                    if seg.blank is not None and seg.blank.wakeup_ns is not None:  # woken, waiting for its pCPU
                        wake = min(int((seg.blank.wakeup_ns - w0) * width // span), hi - 1)
                        strip[wake:hi] = self.WAKEUP_STATE
                    thr = seg.blank.throttled_after_wakeup() if seg.blank is not None else None
                    if thr and thr[0] < seg.end_ns and thr[1] > seg.start_ns:
                        a = min(max(int((thr[0] - w0) * width // span), lo), hi - 1)  # woken into a throttled group
                        strip[a:min(max(int((thr[1] - w0) * width // span), a + 1), hi)] = self.BLANK_STATES[
                            BlankKind.THROTTLED]
            text.append(f"vcpu{vcpu:<3} ")
            for code in strip.tolist():
                ch, style = self.STATES[code]
                text.append(ch, style=style)
            text.append("\n")
        return text


class VmprofTop(App):
    TITLE = "vmprof top"
    CSS = "#help { padding: 1 2; border: round $accent; background: $panel; width: 80; height: auto; }" \
          " FilterScreen { align: center middle; } #filter { width: 60; }" \
          " HelpScreen { align: center middle; } #title, #status { height: 1; }" \
          " OverviewScreen #table { height: 1fr; } #plot { height: 14; }"
    BINDINGS = [Binding("q", "quit", "quit"), Binding("question_mark", "help", "help"),
                Binding("space", "pause", "pause"), Binding("plus", "faster", "faster"),
                Binding("minus", "slower", "slower"), Binding("left_square_bracket", "shorter", show=False),
                Binding("right_square_bracket", "longer", show=False)]

    def __init__(self, window: object, refresh_s: float = 1.0, should_stop: Callable[[], bool] | None = None,
                 lbr: object | None = None, blocks: str | None = None) -> None:
        super().__init__()
        self.window = window  # analyse.window.LiveWindow or ReplayWindow
        self.lbr, self.blocks = lbr, blocks  # analyse.lbr_source.LbrSource; a function whose blocks open first
        self.should_stop = should_stop or (lambda: False)
        self.refresh_s = refresh_s
        self.paused = False
        self.analysis: WindowView | None = None  # what every screen reads: the summaries, else the Analysis
        self.history: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=60))
        # per VM: (end of the window in s, user+kernel %, steal %, idle %) of each refresh, for the overview's plot
        self.usage: dict[str, deque[tuple[float, float, float, float]]] = defaultdict(lambda: deque(maxlen=600))
        self.message = ""
        self._timer = None
        self._polling = False  # a poll runs in a worker thread

    def on_mount(self) -> None:
        self.sub_title = "live" if getattr(self.window, "live", False) else "replay"
        self.push_screen(OverviewScreen())
        if self.blocks:
            from vmprof_tui.show.blocks_screen import open_blocks

            open_blocks(self, self.blocks, None)
        if self.window.started:
            self.tick()
        else:  # the screen is up at once; compiling and loading the BPF programs takes a second
            self.message = "starting: compiling and loading the BPF programs..."
            self._refresh_status()
            self.run_worker(self._start_window, thread=True)
        self._timer = self.set_interval(self.refresh_s, self.tick)
        self.set_interval(0.25, self._check_stop)  # SIGTERM ends the screen at once, whatever the refresh
        # What exists now (modules, Textual, the screen) lives as long as the app: out of the collector's full
        # passes, which otherwise walk it after every refresh's analysis (10 of 65 ms a refresh, replayed)
        gc.freeze()

    def _start_window(self) -> None:
        try:
            self.window.start()
            self.message = ""
            self.call_from_thread(self.tick)
        except Exception as e:  # noqa: BLE001 - shown on screen, never a traceback
            self.message = f"cannot start collection: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            self.call_from_thread(self._refresh_status)

    def _refresh_status(self) -> None:
        screen = self.screen
        if isinstance(screen, TableScreen) and screen.ready:
            screen.set_text("#status", self.message)

    def _check_stop(self) -> None:
        if self.should_stop():
            self.exit()

    def tick(self) -> None:
        """Start a poll of the window in a worker thread (draining and analysing stay off the UI thread);
        a tick that comes while the last poll still runs is skipped."""
        if self.should_stop():  # SIGTERM (the terminal's Ctrl-C is a key here: q quits)
            self.exit()
            return
        if self.paused or not self.window.started or self._polling:
            return
        self._polling = True
        self.run_worker(self._poll, thread=True, group="poll")

    def poll_window(self) -> tuple[WindowView, list[tuple[str, float]], list[tuple[str, float, float, float, float]]]:
        """One refresh's analysis (off the UI thread): the window, each VM's load and its usage point."""
        an = self.window.poll(detail=getattr(self.screen, "detail", False))
        loads = [(HOST_KEY, 100.0 - an.host_summary().ratios["idle"])]
        usage = []
        now = an.window()[1] / 1e9  # the recording's clock: a replay plots recorded time
        for vm in an.vm_names():
            r = an.guest_ratios(vm)
            loads.append((vm, r["user"] + r["os"]))
            usage.append((vm, now, r["user"] + r["os"], r["steal"], r["idle"]))
        if hasattr(self.screen, "prepare"):  # analysed here, in the worker thread, not while drawing
            self.screen.prepare(an)
        return an, loads, usage

    def _poll(self) -> None:
        try:
            polled = self.poll_window()
        except Exception as e:  # noqa: BLE001 - shown on screen, never a traceback
            self.call_from_thread(self._stopped, f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
            return
        self.call_from_thread(self._show, *polled)

    def _stopped(self, why: str) -> None:
        self._polling = False
        self.message = f"collection stopped: {why}"
        self.paused = True
        self._refresh_screen()

    def _show(self, an: WindowView, loads: list[tuple[str, float]],
              usage: list[tuple[str, float, float, float, float]]) -> None:
        self._polling = False
        self.analysis = an
        news = getattr(self.window, "messages", None)
        if news:
            self.message = "; ".join(news[-2:])
            news.clear()
        for key, load in loads:
            self.history[key].append(load)
        for vm, *point in usage:
            self.usage[vm].append(tuple(point))
        if getattr(self.window, "at_end", False):
            self.message = "end of the recording"
        self._refresh_screen()

    def _refresh_screen(self) -> None:
        screen = self.screen
        if hasattr(screen, "refresh_from"):
            screen.refresh_from(self.analysis)

    def status_text(self, an: Analysis, filt: str, sort: str) -> str:
        parts = ["PAUSED" if self.paused else f"refresh {self.refresh_s:g}s",
                 f"window {getattr(self.window, 'window_s', 0):g}s", f"sort: {sort}"]
        if filt:
            parts.append(f"filter: {filt}")
        damage = getattr(self.window, "damage", None)
        if damage:
            parts.append(damage)
        if not an.vm_names() and self.lbr is None:  # (LBR data come without VMs)
            live = getattr(self.window, "live", False)
            parts.append("no VM on this host — try `vmprof demo`" if live else
                         "no readable VM in this recording" if damage else "no VM in this recording")
        if self.message:
            parts.append(self.message)
        return "  |  ".join(parts)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._refresh_screen()

    def _set_interval(self, seconds: float) -> None:
        self.refresh_s = min(max(seconds, 0.25), 10.0)  # cli/top.py's REFRESH_S
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(self.refresh_s, self.tick)
        self._refresh_screen()

    def action_faster(self) -> None:
        self._set_interval(self.refresh_s / 2)

    def action_slower(self) -> None:
        self._set_interval(self.refresh_s * 2)

    def action_shorter(self) -> None:
        self.window.window_s = max(self.window.window_s / 2, 1.0)

    def action_longer(self) -> None:
        self.window.window_s = min(self.window.window_s * 2, 120.0)
