"""The screens of `vmprof top` are made of: a table re-rendered from each refresh (TableScreen), a drawing
(DrawingScreen), and the keys the screens of a VM share.  Each screen has a module of its own (show/*_screen.py);
none imports another: they open each other by name through the app (tui.VmprofTop.open_view)."""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from rich.cells import cell_len
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show.dialogs import FilterScreen
from vmprof_tui.show.live_table import LiveTable

SCROLLBAR = 2  # the columns a table's vertical scrollbar takes
HOST_KEY = "(host)"
ONE_LINE = ("#title", "#status")  # Statics one line high (VmprofTop.CSS)
NO_STACKS = "no call stacks in this window: start vmprof top with -g (or replay a recording made with -g)"
NO_BLOCKS = "no LBR block view in this session: start vmprof top with LBR data (docs/lbr.md)"


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


def same_value(a: object, b: object) -> bool:
    """Whether a cell's value is drawn as it was: of one type and equal (5 and 5.0 are drawn "5" and "5.0"), Text
    also in its style and justification (Text's == compares the characters and spans only)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Text):
        return a == b and (a.style, a.justify) == (b.style, b.justify)  # type: ignore[attr-defined]
    return a == b


class View(Screen):
    """A screen of the app: VmprofTop has each refresh prepared off the UI thread, then drawn."""

    detail = False  # the screen reads each chunk's detail (steal, segments): polls analyse new chunks in full

    def prepare(self, an: ProfileSource) -> None:
        """What the screen will read that takes time, computed in the poll's worker thread."""

    def refresh_from(self, an: ProfileSource | None) -> None:
        raise NotImplementedError


class TableScreen(View):
    """A screen with a title line and one table, re-rendered from each new Analysis."""

    BINDINGS = [Binding("escape", "back", "back"), Binding("o", "sort", "sort"),
                Binding("slash", "filter", "filter")]
    columns: tuple[str, ...] = ()
    default_sort = "samples"  # the column a screen sorts by (descending for numbers) until `o` is pressed
    # Rows handed to the table, the first by the sort: Textual lays out every row it holds, and a 64-CPU host
    # has tens of thousands of host functions in a window (docs/performance.md); the rest are reached with / or o.
    max_rows = 500
    hidden_rows = 0  # rows the window has beyond those rows() gave (it gave the first by the sort)

    def __init__(self) -> None:
        super().__init__()
        self.sort_column = self.columns.index(self.default_sort) if self.default_sort in self.columns else 0
        self.filter = ""
        self.cells: dict[str, tuple] = {}  # row key -> its values (as rows() and fit() gave them), in the table's order
        self._shown: dict[str, list[Text]] = {}  # row key -> its cells as the table holds them
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

    def prepare(self, an: ProfileSource) -> None:
        """What rows() will read that takes time (a window's call paths), computed in the poll's worker thread."""

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        raise NotImplementedError

    def title_text(self, an: ProfileSource) -> str:
        return ""

    def fit(self, rows: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
        """The rows' cells as shown (after the filter and the sort, which read them whole): as they are."""
        return rows

    def refresh_from(self, an: ProfileSource | None) -> None:
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
        values = {k: r for k, (_key, r) in zip(keys, rows, strict=True)}
        # Change the table, do not rebuild it: Textual measures every cell of every row it adds; and make cells only
        # for the values that changed (of a host view's 500 rows, most keep their names from one second to the next).
        selected = self._cursor_key(table)
        table.remove_rows([key for key in self.cells if key not in values])
        changes = []
        for key, row in values.items():
            before = self.cells.get(key)
            if before is None:
                self._shown[key] = [self.cell_of(c) for c in row]
                table.add_row(*self._shown[key], key=key)
                continue
            shown = self._shown[key]
            for i, (column, value, old) in enumerate(zip(table.ordered_columns, row, before, strict=True)):
                if same_value(value, old):
                    continue
                new = self.cell_of(value)  # a number drawn as it was (12.31 and 12.34 are both "12.3") stays
                if not same_value(new, shown[i]):  # re-measure only a cell wider than its column (narrower: all)
                    shown[i] = new
                    changes.append((key, column.key, new, cell_len(new.plain) > column.content_width))
        table.update_cells(changes)
        for key in self.cells.keys() - values.keys():
            del self._shown[key]
        if keys != list(self.cells):  # a change of order re-orders the table
            table.order(keys)
            if selected in values:  # the cursor stays on its row across refreshes
                table.move_cursor(row=table.get_row_index(selected), animate=False)
        self.cells = values
        self.set_text("#title", self.title_text(an))
        status = self.app.status_text(an, self.filter, self.columns[col])
        if matching > len(rows):
            status += f"  |  first {len(rows):,} of {matching:,} rows (o: sort, /: filter)"
        self.set_text("#status", status)

    def set_text(self, selector: str, text: str | Text) -> None:
        """Update a Static only when its text changed.  The title and the status line are one line high whatever they
        say (the app's CSS): their new text is drawn without laying the screen out again."""
        if self._texts.get(selector) != text:
            self._texts[selector] = text
            self.query_one(selector, Static).update(cell(text), layout=selector not in ONE_LINE)

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
    view = ""  # the screen's name among the app's views (VmprofTop.open_view)

    def action_steal(self) -> None:
        if self.view != "steal":
            self.app.open_view("steal", self.vm)  # type: ignore[attr-defined]

    def action_timeline(self) -> None:
        if self.view != "timeline":
            self.app.open_view("timeline", self.vm)  # type: ignore[attr-defined]


class BlockViews(Protocol):
    """The LBR wing's block view as the live screen opens it (lbr/screen.py: LbrViews); `vmprof top` hands it to
    the app, which knows no more of LBR."""

    @property
    def has_data(self) -> bool:
        """Whether there are LBR samples to show (they come without VMs)."""

    def open(self, app: App, function: str, vm: str | None) -> None:
        """`b` on a function row: its blocks, or one line saying why there are none and what to do."""


class BlockKeys:
    """`b` on a function row: that function's LBR blocks (the app's BlockViews)."""

    BINDINGS = [Binding("b", "blocks", "blocks")]

    def action_blocks(self) -> None:
        self.app.open_blocks(self.selected(), getattr(self, "vm", None))  # type: ignore[attr-defined]


class VmTableScreen(VmKeys, TableScreen):
    """A table about one VM; empty (not an error) while the VM is not in the window."""

    BINDINGS = VmKeys.BINDINGS

    def __init__(self, vm: str) -> None:
        super().__init__()
        self.vm = vm

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        return self.vm_rows(an) if self.vm in an.vm_names() else []

    def vm_rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        raise NotImplementedError


class DrawingScreen(View):
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

    def prepare(self, an: ProfileSource) -> None:
        """What draw() will read that takes time, computed in the poll's worker thread."""

    def refresh_from(self, an: ProfileSource | None) -> None:
        if an is not None and self.ready:
            self.query_one(f"#{self.drawing_id}", Static).update(self.draw(an))

    def draw(self, an: ProfileSource) -> Text | str:
        raise NotImplementedError
