"""A flame graph as one SVG file a browser opens (what `py-spy record -o profile.svg` gives): the collapsed
output of the same report, parsed back and drawn, so every stack the svg shows is a line of `collapsed`.

Written here because no package from PyPI, Debian or npm renders folded stacks to SVG without a Perl or Rust
toolchain (FlameGraph's flamegraph.pl is not packaged; inferno is a Rust crate).  The drawing is small: one
rectangle per tree node, its width its samples, a tooltip (<title>) with the full name, count and share.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.formats.collapsed import render as collapsed

ONE_PROFILE = False
WIDTH, ROW, FONT = 1200, 16, 11
CHAR = FONT * 0.59  # average glyph width of the monospace font, for cutting labels to their box


class FoldedError(ValueError):
    """A line that is not `frame;frame;... count`."""


@dataclass
class Node:
    name: str
    total: int = 0
    children: dict[str, Node] = field(default_factory=dict)


def parse_folded(text: str) -> Node:
    """The call tree of FlameGraph's folded format (one `frame;...;frame count` per line)."""
    root = Node("all")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            raise FoldedError(f"line {number}: not 'frame;frame;... count': {line[:80]!r}")
        n = int(count)
        root.total += n
        node = root
        for name in stack.split(";"):
            node = node.children.setdefault(name, Node(name))
            node.total += n
    return root


def _colour(name: str) -> str:
    """Warm colours as flamegraph.pl's, stable per name; steal and idle stand apart."""
    if name.startswith("[steal]"):
        return "rgb(120,140,220)"
    if name.startswith("[idle]"):
        return "rgb(190,190,190)"
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{(h >> 8) % 180},{(h >> 16) % 55})"


def _depth(node: Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def draw(root: Node, title: str) -> str:
    height = (_depth(root) + 2) * ROW
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="{FONT}">',
           '<rect width="100%" height="100%" fill="rgb(250,250,240)"/>',
           f'<text x="{WIDTH / 2}" y="{ROW - 3}" text-anchor="middle">{escape(title)}</text>']
    scale = WIDTH / root.total if root.total else 0.0

    def box(node: Node, x: float, depth: int) -> None:
        w = node.total * scale
        if w < 0.1:
            return
        y = height - (depth + 1) * ROW
        label = node.name if len(node.name) * CHAR <= w - 4 else node.name[:max(0, int((w - 4) / CHAR) - 2)] + ".."
        share = 100.0 * node.total / root.total
        out.append(f'<g><title>{escape(node.name)} ({node.total} samples, {share:.2f}%)</title>'
                   f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" fill="{_colour(node.name)}"/>'
                   + (f'<text x="{x + 2:.2f}" y="{y + ROW - 4}">{escape(label)}</text>' if len(label) > 2 else "")
                   + "</g>")
        for child in sorted(node.children.values(), key=lambda c: c.name):
            box(child, x, depth + 1)
            x += child.total * scale

    box(root, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render(inp: ReportInput) -> str:
    p = inp.profiles[0]
    what = "host" if p.level == "host" else ("guest " + (p.vm if len(inp.profiles) == 1 else "(every VM)"))
    return draw(parse_folded(collapsed(inp)), f"vmprof {inp.analysis.rec.path.name}: {what}")
