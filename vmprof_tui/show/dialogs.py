"""The live screen's dialogs: the key help (`?`) and the row filter (`/`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield Static(
            "[b]vmprof top[/b] — the whole virtualized host, from the host alone\n\n"
            "Enter     drill down: VM → vCPUs → processes → functions (host row: host view)\n"
            "Esc       back\n"
            "s         steal detail of the VM (by exit reason, by who held the pCPU)\n"
            "t         per-vCPU timeline of the VM (guest / VMM / steal / idle)\n"
            "          (s and t work on every screen of a VM, and on the overview's VM row)\n"
            "f         flame (icicle) view of the selected VM, guest process or the host (needs -g)\n"
            "c         callers of the selected function (needs -g)\n"
            "b         LBR blocks of the selected function (an --lbr recording, or --perf-script)\n"
            "o         sort by the next column        /  filter rows by name\n"
            "space     pause / resume                 +  -  refresh faster / slower\n"
            "[  ]      shorter / longer window        ?  this help      q  quit\n\n"
            "Rows and columns are clickable with the mouse.", id="help")


class FilterScreen(ModalScreen[str]):
    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter (substring of name; empty clears)", id="filter")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)
