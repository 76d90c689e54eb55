"""The live screen's table: Textual's DataTable, with rendered cells kept across refreshes.

DataTable keys its cache of rendered cells on a counter that every `update_cell` bumps, so each refresh
of `vmprof top` rendered every visible cell again (about 225 on the host view, through rich's full
layout), though most cells keep their values from one second to the next: the largest part of a
refresh's CPU.  Here a cell's rendering is kept by what decides it: its place (the click metadata
carries it), its value, its width and its style.  Only `_render_cell` is overridden; it is not public
API, so pyproject pins Textual's major version.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.widgets import DataTable

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
