"""`vmprof top --store DIR`: step through the windows of a fleet store (vmprof analyze) on the screen.

One table per stored window: every host's VMs with their user, kernel, idle and steal shares and top
function; Enter on a VM lists its functions in that window. Left/right step one window (all hosts'
windows that started within the same window length are shown together).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from vmprof_tui.fleet.history import Store, WindowRow, flag_anomalies


def _num(value: float) -> Text:
    return Text(f"{value:.1f}", justify="right")


class FunctionsScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "back")]

    def __init__(self, store: Store, row: WindowRow) -> None:
        super().__init__()
        self.store, self.row = store, row

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"{self.row.host} / {self.row.vm}, window {self.row.window} ({self.row.start:%Y-%m-%d %H:%M:%S}"
                     f" UTC, {self.row.window_s:.0f} s)", id="title")
        yield DataTable(id="functions", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("%", "function", "module", "process")
        for process, function, module, pct in self.store.functions(self.row.host, self.row.vm, self.row.window):
            t.add_row(_num(pct), Text(function), Text(module), Text(process))


class StoreApp(App):
    TITLE = "vmprof top --store"
    BINDINGS = [Binding("q", "quit", "quit"), Binding("left,left_square_bracket", "step(-1)", "earlier"),
                Binding("right,right_square_bracket", "step(1)", "later"), Binding("home", "first", "first"),
                Binding("end", "last", "last")]

    def __init__(self, store: Store, host: str | None = None, vm: str | None = None) -> None:
        super().__init__()
        self.store = store
        rows = store.history(host, vm, top=1)
        flag_anomalies(rows, store.per_window_function_shares(host, vm, None, None))
        # windows of every host grouped by their start, one step per group
        self.groups: dict[datetime, list[WindowRow]] = defaultdict(list)
        width = max((r.window_s for r in rows), default=60.0) or 60.0
        anchor: datetime | None = None
        for r in sorted(rows, key=lambda r: r.start):
            if anchor is None or (r.start - anchor).total_seconds() >= width * 0.9:
                anchor = r.start
            self.groups[anchor].append(r)
        self.starts = sorted(self.groups)
        self.index = len(self.starts) - 1

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="title")
        yield DataTable(id="vms", cursor_type="row")
        yield Static("←/→ step through windows · Enter: the VM's functions · q quit", id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("host", "vm", "user%", "kernel%", "idle%", "steal%", "top function",
                                              "anomalies")
        self.show()

    def show(self) -> None:
        title = self.query_one("#title", Static)
        t = self.query_one(DataTable)
        t.clear()
        if not self.starts:
            title.update("the store has no window")
            return
        start = self.starts[self.index]
        rows = sorted(self.groups[start], key=lambda r: (r.host, r.vm))
        title.update(f"window {self.index + 1} of {len(self.starts)}: {start:%Y-%m-%d %H:%M:%S} UTC, "
                     f"{len(rows)} VMs on {len({r.host for r in rows})} hosts")
        for r in rows:
            top = f"{r.top[0][0]} {r.top[0][2]:.0f}%" if r.top else ""
            t.add_row(Text(r.host), Text(r.vm), _num(r.shares["guest_user"]), _num(r.shares["guest_kernel"]),
                      _num(r.shares["idle"]), _num(r.shares["steal"]), Text(top), Text("; ".join(r.anomalies)),
                      key=f"{r.host}\0{r.vm}\0{r.window}")

    def action_step(self, delta: int) -> None:
        self.index = min(max(self.index + delta, 0), max(len(self.starts) - 1, 0))
        self.show()

    def action_first(self) -> None:
        self.index = 0
        self.show()

    def action_last(self) -> None:
        self.index = max(len(self.starts) - 1, 0)
        self.show()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "vms" or event.row_key.value is None:
            return
        host, vm, window = event.row_key.value.split("\0")
        row = next(r for r in self.groups[self.starts[self.index]]
                   if r.host == host and r.vm == vm and r.window == int(window))
        self.push_screen(FunctionsScreen(self.store, row))
