"""`vmprof top`: the live screen (Textual), on a LiveWindow or a ReplayWindow.

Screens: overview (one row per VM and one for the host) → VM (vCPUs) →
processes → functions; host view; steal detail; per-vCPU timeline.  Every
number on screen comes from the session's window (analyse/window.py: each chunk's
summary and analysis, summed; the whole window's Analysis where a screen needs it).
"""

from __future__ import annotations

import gc
from collections import defaultdict, deque
from collections.abc import Callable

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from vmprof_tui.analyse.source import ProfileSource, Window
from vmprof_tui.show.callers_screen import CallersScreen
from vmprof_tui.show.dialogs import HelpScreen
from vmprof_tui.show.flame_screen import FlameScreen
from vmprof_tui.show.function_screen import FunctionScreen
from vmprof_tui.show.host_screen import HostScreen
from vmprof_tui.show.overview_screen import OverviewScreen
from vmprof_tui.show.process_screen import ProcessScreen
from vmprof_tui.show.screen import HOST_KEY, NO_BLOCKS, BlockViews, TableScreen, View
from vmprof_tui.show.steal_screen import StealScreen
from vmprof_tui.show.timeline_screen import TimelineScreen
from vmprof_tui.show.vm_screen import VmScreen

UsagePoint = tuple[str, float, float, float, float]  # VM, end of the window (s), user+kernel %, steal %, idle %
# the screens by the name they open each other with (VmprofTop.open_view)
VIEWS: dict[str, type[Screen]] = {"host": HostScreen, "vm": VmScreen, "process": ProcessScreen,
                                  "function": FunctionScreen, "steal": StealScreen, "callers": CallersScreen,
                                  "flame": FlameScreen, "timeline": TimelineScreen}


class VmprofTop(App):
    TITLE = "vmprof top"
    CSS = "#help { padding: 1 2; border: round $accent; background: $panel; width: 80; height: auto; }" \
          " FilterScreen { align: center middle; } #filter { width: 60; }" \
          " HelpScreen { align: center middle; } #title, #status { height: 1; }" \
          " OverviewScreen #table { height: 1fr; } #plot { height: 14; }"
    BINDINGS = [Binding("q", "quit", "quit"), Binding("question_mark", "help", "help"),
                Binding("space", "pause", "pause"), Binding("plus", "faster", "faster"),
                Binding("minus", "slower", "slower"), Binding("left_square_bracket", "shorter", show=False),
                Binding("right_square_bracket", "longer", show=False)]

    def __init__(self, window: Window, refresh_s: float = 1.0, should_stop: Callable[[], bool] | None = None,
                 lbr: BlockViews | None = None, blocks: str | None = None) -> None:
        super().__init__()
        self.window = window  # analyse.window.LiveWindow or ReplayWindow
        self.lbr, self.blocks = lbr, blocks  # the block view (lbr/screen.py); a function whose blocks open first
        self.should_stop = should_stop or (lambda: False)
        self.refresh_s = refresh_s
        self.paused = False
        self.analysis: ProfileSource | None = None  # what every screen reads: the window of the last refresh
        self.history: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=60))
        # per VM: (end of the window in s, user+kernel %, steal %, idle %) of each refresh, for the overview's plot
        self.usage: dict[str, deque[tuple[float, float, float, float]]] = defaultdict(lambda: deque(maxlen=600))
        self.message = ""
        self._timer = None
        self._polling = False  # a poll runs in a worker thread

    def open_view(self, name: str, *args: object) -> None:
        """Open the screen `name` (VIEWS) on top: the screens open each other through here."""
        self.push_screen(VIEWS[name](*args))

    def open_blocks(self, function: str | None, vm: str | None) -> None:
        """The LBR block view of a function (`b`), or one line saying there is none."""
        if not function:
            return
        if self.lbr is None:
            self.message = NO_BLOCKS
            self.notify(NO_BLOCKS, severity="warning", timeout=8)
            self._refresh_status()
            return
        self.lbr.open(self, function, vm)

    def on_mount(self) -> None:
        self.sub_title = "live" if self.window.live else "replay"
        self.push_screen(OverviewScreen())
        if self.blocks:
            self.open_blocks(self.blocks, None)
        if self.window.started:
            self.tick()
        else:  # the screen is up at once; compiling and loading the BPF programs takes a second
            self.message = "starting: compiling and loading the BPF programs..."
            self._refresh_status()
            self.run_worker(self._start_window, thread=True)
        self._timer = self.set_interval(self.refresh_s, self.tick)
        self.set_interval(0.25, self._check_stop)  # SIGTERM ends the screen at once, whatever the refresh
        # What exists now (modules, Textual, the screen) lives as long as the app: out of the collector's full
        # passes, which otherwise walk it after every refresh's analysis (docs/performance.md)
        gc.freeze()

    def _start_window(self) -> None:
        try:
            self.window.start()
            self.message = ""
            self.call_from_thread(self.tick)
        except Exception as e:  # noqa: BLE001 - shown on screen, never a traceback
            self.message = f"cannot start collection: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            self.call_from_thread(self._refresh_status)

    def _refresh_status(self) -> None:
        screen = self.screen
        if isinstance(screen, TableScreen) and screen.ready:
            screen.set_text("#status", self.message)

    def _check_stop(self) -> None:
        if self.should_stop():
            self.exit()

    def tick(self) -> None:
        """Start a poll of the window in a worker thread (draining and analysing stay off the UI thread);
        a tick that comes while the last poll still runs is skipped."""
        if self.should_stop():  # SIGTERM (the terminal's Ctrl-C is a key here: q quits)
            self.exit()
            return
        if self.paused or not self.window.started or self._polling:
            return
        self._polling = True
        self.run_worker(self._poll, thread=True, group="poll")

    def poll_window(self) -> tuple[ProfileSource, list[tuple[str, float]], list[UsagePoint]]:
        """One refresh's analysis (off the UI thread): the window, each VM's load and its usage point."""
        screen = self.screen
        an = self.window.poll(detail=isinstance(screen, View) and screen.detail)
        loads = [(HOST_KEY, 100.0 - an.host_summary().ratios["idle"])]
        usage = []
        now = an.span()[1] / 1e9  # the recording's clock: a replay plots recorded time
        for vm in an.vm_names():
            r = an.guest_ratios(vm)
            loads.append((vm, r["user"] + r["os"]))
            usage.append((vm, now, r["user"] + r["os"], r["steal"], r["idle"]))
        if isinstance(screen, View):  # analysed here, in the worker thread, not while drawing
            screen.prepare(an)
        return an, loads, usage

    def _poll(self) -> None:
        try:
            polled = self.poll_window()
        except Exception as e:  # noqa: BLE001 - shown on screen, never a traceback
            self.call_from_thread(self._stopped, f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
            return
        self.call_from_thread(self._show, *polled)

    def _stopped(self, why: str) -> None:
        self._polling = False
        self.message = f"collection stopped: {why}"
        self.paused = True
        self._refresh_screen()

    def _show(self, an: ProfileSource, loads: list[tuple[str, float]],
              usage: list[UsagePoint]) -> None:
        self._polling = False
        self.analysis = an
        news = self.window.messages
        if news:
            self.message = "; ".join(news[-2:])
            news.clear()
        for key, load in loads:
            self.history[key].append(load)
        for vm, *point in usage:
            self.usage[vm].append(tuple(point))
        if self.window.at_end:
            self.message = "end of the recording"
        self._refresh_screen()

    def _refresh_screen(self) -> None:
        screen = self.screen
        if isinstance(screen, View):
            screen.refresh_from(self.analysis)

    def status_text(self, an: ProfileSource, filt: str, sort: str) -> str:
        parts = ["PAUSED" if self.paused else f"refresh {self.refresh_s:g}s",
                 f"window {self.window.window_s:g}s", f"sort: {sort}"]
        if filt:
            parts.append(f"filter: {filt}")
        damage = self.window.damage
        if damage:
            parts.append(damage)
        if not an.vm_names() and not (self.lbr is not None and self.lbr.has_data):  # (LBR data come without VMs)
            parts.append("no VM on this host — try `vmprof demo`" if self.window.live else
                         "no readable VM in this recording" if damage else "no VM in this recording")
        if self.message:
            parts.append(self.message)
        return "  |  ".join(parts)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._refresh_screen()

    def _set_interval(self, seconds: float) -> None:
        self.refresh_s = min(max(seconds, 0.25), 10.0)  # cli/top.py's REFRESH_S
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(self.refresh_s, self.tick)
        self._refresh_screen()

    def action_faster(self) -> None:
        self._set_interval(self.refresh_s / 2)

    def action_slower(self) -> None:
        self._set_interval(self.refresh_s * 2)

    def action_shorter(self) -> None:
        self.window.window_s = max(self.window.window_s / 2, 1.0)

    def action_longer(self) -> None:
        self.window.window_s = min(self.window.window_s * 2, 120.0)
