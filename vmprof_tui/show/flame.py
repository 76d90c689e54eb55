"""The icicle (top-down flame) layout of weighted call paths for the live screen's `f` view.

Hand-written because it is a few lines of arithmetic on character cells: the flame-graph libraries
draw SVG or HTML, not terminal text.  The root is the top line; each frame's width is its share of
its parent's columns (cumulative rounding, so siblings tile their parent exactly); frames narrower
than one column are not drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.text import Text

COLOURS = ("red", "dark_orange", "yellow", "green", "cyan", "magenta", "bright_red", "orange3", "gold1", "khaki1")


@dataclass
class _Node:
    samples: int = 0
    kids: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    column: int
    width: int
    label: str
    samples: int


def icicle(paths: Sequence[Sequence[str]], counts: Sequence[int], width: int, depth: int) -> list[list[Cell]]:
    """Cells per line (line 0: the outermost frames) for paths with counts, in `width` columns."""
    root = _Node()
    for path, n in zip(paths, counts, strict=True):
        node = root
        node.samples += n
        for label in path:
            node = node.kids.setdefault(label, _Node())
            node.samples += n
    lines: list[list[Cell]] = [[] for _ in range(depth)]

    def place(node: _Node, column: int, span: int, level: int) -> None:
        if level >= depth or not node.samples:
            return
        done = 0
        for label, kid in sorted(node.kids.items()):  # alphabetical, as flame graphs order siblings
            start = column + done * span // node.samples
            done += kid.samples
            w = column + done * span // node.samples - start
            if w >= 1:
                lines[level].append(Cell(start, w, label, kid.samples))
                place(kid, start, w, level + 1)

    place(root, 0, width, 0)
    return [line for line in lines if line]


def render(lines: list[list[Cell]], width: int) -> Text:
    """The icicle as text: each frame a coloured block with its name, as much as fits."""
    out = Text()
    for level, cells in enumerate(lines):
        row = Text(" " * width)
        for c in cells:
            label = c.label[:c.width - 1] if c.width > 1 else ""
            block = Text(label.ljust(c.width), style=f"black on {COLOURS[(level + len(c.label)) % len(COLOURS)]}")
            row = row[:c.column] + block + row[c.column + c.width:]
        out.append_text(row)
        out.append("\n")
    return out
