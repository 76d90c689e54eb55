"""The live screen's table: Textual's DataTable, with rendered cells kept across refreshes.

DataTable keys its cache of rendered cells on a counter that every `update_cell` bumps, so each refresh
of `vmprof top` rendered every visible cell again (about 225 on the host view, through rich's full
layout), though most cells keep their values from one second to the next: the largest part of a
refresh's CPU.  Here a cell's rendering is kept by what decides it: its place (the click metadata
carries it), its value, its width and its style.  And rows that left the window go in one pass
(`remove_rows`): DataTable.remove_row rebuilds the map of every row's place for each row removed.
`_render_cell` and the row map are not public API, so pyproject pins Textual's major version.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets._data_table import CellKey, ColumnKey, RowKey

SegmentLines = list[list[Segment]]


class LiveTable(DataTable):
    """A DataTable for values that change in place every second."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._rendered: LRUCache[tuple, SegmentLines] = LRUCache(4096)

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> SegmentLines:
        if row_index < 0 or column_index < 0:  # the header and row labels: the table's own cache
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        value = self.get_cell_at(Coordinate(row_index, column_index))
        if not isinstance(value, Text):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (row_index, column_index, value.plain, value.justify, value.style, tuple(value.spans), base_style,
               width, cursor, hover, self.has_focus, self.show_cursor, self.cursor_type, self.app.theme)
        lines = self._rendered.get(key)
        if lines is None:
            lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            self._rendered[key] = lines
        return lines

    def remove_rows(self, keys: list[str]) -> None:
        """remove_row for several rows, with the row map rebuilt once instead of once per row."""
        gone = {RowKey(k) for k in keys}
        if not gone:
            return
        missing = gone - set(self.rows)
        if missing:
            self.remove_row(next(iter(missing)))  # raises RowDoesNotExist, as remove_row does
        self._require_update_dimensions = True
        self.check_idle()
        kept = sorted((self._row_locations.get(k), k) for k in self._row_locations if k not in gone)
        self._row_locations = TwoWayDict({key: index for index, (_old, key) in enumerate(kept)})
        for key in gone:
            for column_key in self._data.get(key, {}):
                self._updated_cells.discard(CellKey(key, column_key))
            del self.rows[key]
            del self._data[key]
        self.cursor_coordinate = self.cursor_coordinate
        self.hover_coordinate = self.hover_coordinate
        self._update_count += 1
        self.refresh(layout=True)

    def update_cells(self, changes: list[tuple[str, ColumnKey, Text, bool]]) -> None:
        """update_cell for several cells (row key, column key, value, whether to re-measure the column), with one
        refresh: a host view changes hundreds of counts a second.  The rows must be in the table."""
        for row_key, column_key, value, update_width in changes:
            row = RowKey(row_key)
            self._data[row][column_key] = value
            if update_width:
                self._updated_cells.add(CellKey(row, column_key))
                self._require_update_dimensions = True
        if changes:
            self._update_count += 1
            self.refresh()

    def order(self, keys: list[str]) -> None:
        """Put the rows in the order of `keys` (every row's key, each once): `sort` by rank, without a key
        function over every row's cells."""
        self._row_locations = TwoWayDict({RowKey(key): index for index, key in enumerate(keys)})
        self._update_count += 1
        self.refresh()
