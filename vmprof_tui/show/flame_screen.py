"""An icicle graph of the window's call paths (show/flame.py lays it out)."""

from __future__ import annotations

from rich.text import Text

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show import flame
from vmprof_tui.show.screen import NO_STACKS, DrawingScreen


class FlameScreen(DrawingScreen):
    """An icicle graph of the window's call paths: a VM, one of its guest processes, or the host."""

    drawing_id = "flame"

    def __init__(self, vm: str | None, process: str | None = None) -> None:
        super().__init__(vm)
        self.process = process

    def prepare(self, an: ProfileSource) -> None:
        an.call_paths(self.vm)  # the window's call paths, made once in the worker thread

    def draw(self, an: ProfileSource) -> Text | str:
        ws = an.call_paths(self.vm)
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
