"""The block view of `vmprof top` (`b` on a function row, or `vmprof top --blocks FUNCTION`): the
function's LBR blocks in the window with their measured-CPI times, and, on Enter, one block's
disassembly and the call/return chain of a sample through it.  The numbers are the window's block
analysis (lbr/source.py); this module only draws them.
"""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.lbr.source import NO_LBR, FunctionBlocks, LbrSource, chain_of
from vmprof_tui.show.live_table import LiveTable
from vmprof_tui.show.screen import DrawingScreen, TableScreen


class LbrViews:
    """The block view as `vmprof top` hands it to the app (show.screen.BlockViews), on the session's LBR
    samples (None: there are none, and `b` says so in one line with what to do)."""

    def __init__(self, source: LbrSource | None) -> None:
        self.source = source

    @property
    def has_data(self) -> bool:
        return self.source is not None

    def open(self, app: App, function: str, vm: str | None) -> None:
        if self.source is None:
            app.message = NO_LBR  # type: ignore[attr-defined]
            app.notify(NO_LBR, severity="warning", timeout=8)
            app._refresh_status()  # type: ignore[attr-defined]
            return
        app.push_screen(BlocksScreen(self.source, function, vm))


class WindowBlocks:
    """The function's blocks in the screen's window, computed in the poll's worker thread (prepare)."""

    source: LbrSource
    function: str
    vm: str | None

    def blocks_of(self, an: ProfileSource) -> FunctionBlocks:
        lo, hi = an.span()
        return self.source.function_blocks(self.source.report(lo, hi, self.vm), self.function, self.vm)


def _time(x: float | None) -> float | str:
    return "-" if x is None else float(x)


class BlocksScreen(WindowBlocks, TableScreen):
    BINDINGS = [Binding("enter", "drill", "disassembly")]
    # with no cell padding the labels carry their leading space (the first column needs none)
    columns = ("block", " instr", " n", " CPI", " mean", " p50", " p90", " p99", " LBR", " exact", " total")
    default_sort = " total"

    def __init__(self, source: LbrSource, function: str, vm: str | None = None) -> None:
        super().__init__()
        self.source, self.function, self.vm = source, function, vm
        self.data: FunctionBlocks | None = None
        self._data_of: ProfileSource | None = None

    def below_table(self) -> ComposeResult:
        yield Static(id="notes")

    def on_mount(self) -> None:  # Textual runs TableScreen.on_mount after this one
        self.query_one(LiveTable).cell_padding = 0  # 11 columns in 80: cells carry their own leading space

    @staticmethod
    def cell_of(value: object) -> Text:
        if isinstance(value, Text):
            return value
        text = str(value) if not isinstance(value, float) else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
        return Text(" " + text, justify="right" if isinstance(value, int | float) else "left")

    def prepare(self, an: ProfileSource) -> None:
        self.data, self._data_of = self.blocks_of(an), an

    def current(self, an: ProfileSource) -> FunctionBlocks | None:
        if self._data_of is not an:
            self.prepare(an)
        return self.data

    def title_text(self, an: ProfileSource) -> str:
        fb = self.current(an)
        if fb is None:
            return NO_LBR
        where = f"VM {self.vm} " if self.vm else ""
        obj = f" ({os.path.basename(fb.info.object_path)})" if fb.info else ""
        return (f"{where}{self.function}{obj}: {len(fb.rows)} blocks in {fb.samples_with}/{fb.samples} LBR samples; "
                f"{fb.unit} = CPI x instr")

    def rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        fb = self.current(an)
        if fb is None:
            return []
        out, freq = [], self.source.freq_hz or 1.0
        for r in fb.rows:
            st, stats = r.stat, r.stat.ns if fb.unit == "ns" else r.stat.cycles
            lbr = st.lbr_cycles["mean"] if st.lbr_cycles else None
            out.append((r.key, (Text(f"{st.start:x}-{st.end:x}"), st.ic, st.count,  # the first: no leading space
                                Text(" -" if r.cpi is None else f" {r.cpi:.3f}", justify="right"),
                                *(_time(stats[k] if stats else None) for k in ("mean", "p50", "p90", "p99")),
                                _time(lbr), "exact" if st.exact else "has branches",
                                _time(st.total_cycles if fb.unit == "cycles" else st.total_cycles / freq * 1e9))))
        return out

    def refresh_from(self, an: ProfileSource | None) -> None:
        super().refresh_from(an)
        if an is None or not self.ready or not self.is_attached:
            return
        fb = self.current(an)
        lines = []
        if fb is not None:
            rejected = ", ".join(f"{k} {n}" for k, n in sorted(fb.rejected.items(), key=lambda kv: -kv[1]))
            lines.append(f"rejected blocks touching it: {rejected or 'none'}   Enter: disassembly and chain")
            lines += [f"note: {n}" for n in fb.notes if not n.startswith("no CPU frequency")]
            if fb.info is None:
                lines.append(f"no counted LBR block of {self.function} in this window")
        self.set_text("#notes", "\n".join(lines))

    def drill(self, key: str | None) -> None:
        if key:
            self.app.push_screen(BlockScreen(self.source, self.function, self.vm, key))


class BlockScreen(WindowBlocks, DrawingScreen):
    """One block: the function's disassembly with the block's instructions marked, and the
    call/return chain (the paper's Table 7) of the first sample in the window that ran through it."""

    drawing_id = "block"
    CONTEXT = 6  # instructions shown before and after the block

    def __init__(self, source: LbrSource, function: str, vm: str | None, key: str) -> None:
        super().__init__(vm)
        self.source, self.function, self.key = source, function, key

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id=self.drawing_id)
        yield Footer()

    def prepare(self, an: ProfileSource) -> None:
        self.blocks_of(an)  # the window's report, computed here in the worker thread (the source keeps it)

    def draw(self, an: ProfileSource) -> Text | str:
        fb = self.blocks_of(an)
        row = fb.row(self.key)
        if row is None or fb.info is None:
            return f"block {self.key} of {self.function} is not in the window now (Esc: back)"
        st, src = row.stat, self.source
        stats = st.ns if fb.unit == "ns" else st.cycles
        text = Text(f"{self.function} {st.start:#x}-{st.end:#x}: {st.ic} instructions, {st.count} occurrences, "
                    f"CPI {row.cpi or float('nan'):.3f}, mean {stats['mean'] if stats else float('nan'):.2f} "
                    f"{fb.unit}" + (f", timed LBR {st.lbr_cycles['mean']:.1f} cycles" if st.lbr_cycles else "")
                    + (", exact" if st.exact else ", has branches (counted once through)") + "\n\n",
                    style="bold")
        insns = src.disassembly(fb.info)
        inside = [i for i, (a, *_r) in enumerate(insns) if st.start <= a <= st.end]
        lo = max((inside[0] if inside else 0) - self.CONTEXT, 0)
        hi = min((inside[-1] if inside else 0) + self.CONTEXT + 1, len(insns))
        if lo:
            text.append(f"   ... {lo} instructions before\n", style="dim")
        for addr, _size, mnemonic, ops in insns[lo:hi]:
            mine = st.start <= addr <= st.end
            off = addr - fb.info.start
            text.append(f"{'▶' if mine else ' '} {addr:x} <+{off}>  {mnemonic} {ops}\n",
                        style="bold green" if mine else "")
        if hi < len(insns):
            text.append(f"   ... {len(insns) - hi} instructions after\n", style="dim")
        sample, pos = row.occurrence
        report = src.report(*an.span(), self.vm)
        text.append(f"\ncall/return chain of one sample through it (sample {sample}, oldest first)\n", style="bold")
        for j, c in enumerate(chain_of(report, sample)):
            mark = "  ◀ block starts at this target" if j == pos - 1 else "  ◀ block ends at this source" \
                if j == pos else ""
            text.append(f"LBR{j:<3} {c.kind:<7} {c.from_symbol} → {c.to_symbol}{mark}\n",
                        style="bold" if mark else "")
        return text
