"""Plain-text layout shared by the text outputs: the terminal's width and lines packed from whole items."""

from __future__ import annotations

import shutil


def width() -> int:
    """COLUMNS, else the terminal's width, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def fill(items: list[str], cols: int, indent: str = "", more: str = "", sep: str = "   ") -> list[str]:
    """Items packed into lines of at most `cols` characters, never splitting an item (one longer than a line
    has a line of its own); the first line starts with `indent`, the others with `more`."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= cols:
            lines[-1] += sep + item
        else:
            lines.append((more if lines else indent) + item)
    return lines
