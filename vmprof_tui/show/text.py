"""Plain-text layout shared by the text outputs: the terminal's width and lines packed from whole items."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

MIN_WIDTH = 60  # the narrowest a report is laid out in (a narrower terminal gets 60 columns)


def width() -> int:
    """COLUMNS, else the terminal's width, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def report_width(given: int | None, to_file: bool) -> int | None:
    """The width a report's text is laid out in: --width N, else COLUMNS, else the terminal's when stdout is one
    (and no -o); None to a pipe or a file: whole names and lines, as perf --stdio writes them."""
    if given:
        return given
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return max(int(env), MIN_WIDTH)
    if not to_file and sys.stdout.isatty():
        try:
            return max(os.get_terminal_size(sys.stdout.fileno()).columns, MIN_WIDTH)
        except OSError:
            return None
    return None


def wrap(text: str, cols: int | None, more: str = "  ") -> list[str]:
    """A line of prose in lines of at most `cols` characters (the others indented by `more`); whole if None."""
    if cols is None or len(text) <= cols:
        return [text]
    return textwrap.wrap(text, cols, subsequent_indent=more, break_long_words=True, break_on_hyphens=False)


def cut(text: str, cols: int | None) -> str:
    """The text in at most `cols` characters, ending in an ellipsis when cut; whole if None."""
    return text if cols is None or len(text) <= cols else text[:max(cols - 1, 0)] + "…"


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
