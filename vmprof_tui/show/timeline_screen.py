"""Per-vCPU strips of the window: guest running, VMM, steal, idle."""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter

import numpy as np
from rich.text import Text

from vmprof_tui.analyse.kinds import BlankKind
from vmprof_tui.analyse.segments import Segment, SegmentKind
from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show.screen import DrawingScreen, VmKeys


class TimelineScreen(VmKeys, DrawingScreen):
    """Per-vCPU strips of the window: guest running, VMM, steal, idle (analyse.segments.vcpu_segments)."""

    BINDINGS = [*DrawingScreen.BINDINGS, *VmKeys.BINDINGS]
    view = "timeline"
    drawing_id = "timeline"
    # every state its own glyph and colour: named red, magenta and bright red all came out as one pink (38;5;197)
    # in Textual's 256-colour output, so the three kinds of steal are true colours far apart
    STATES = {0: (" ", ""), 1: ("█", "green"), 2: ("▓", "yellow"), 3: ("▒", "#ff2020"), 4: ("░", "blue"),
              5: ("▚", "#ff9000"), 6: ("╳", "#b060ff")}
    LEGEND = ((1, "guest"), (2, "VMM"), (3, "steal"), (5, "wake-up wait"), (6, "throttled"), (4, "idle"))
    WAKEUP_STATE = 5
    BLANK_STATES = {BlankKind.IDLE: 4, BlankKind.PREEMPTED: 3, BlankKind.BLOCKED: 2,  # VMM-blocked: VMM's colour
                    BlankKind.THROTTLED: 6}
    # what a column shows when several segments share it: samples over blanks, guest code over the VMM
    PAINT_ORDER = (SegmentKind.BLANK, SegmentKind.VMM, SegmentKind.GUEST)
    detail = True  # each new chunk analysed in full once (window.poll)

    def prepare(self, an: ProfileSource) -> None:
        an.vcpu_segments(self.vm)  # each chunk's segments, computed once (WindowView.vcpu_segments)

    def draw(self, an: ProfileSource) -> Text | str:
        width = max(self.size.width - 12, 20)
        w0, w1 = an.span()
        seconds = (w1 - w0) / 1e9
        text = Text(f"VM {self.vm}: last {seconds:.0f}s, one column = {seconds / width:.2f}s   ")
        for code, label in self.LEGEND:
            ch, style = self.STATES[code]
            text.append(ch * 2, style=style)
            text.append(f" {label}  ")
        text.append("\n\n")
        span = max(w1 - w0, 1)
        for vcpu, segments in sorted(an.vcpu_segments(self.vm).items()):
            text.append(f"vcpu{vcpu:<3} ")
            strip = self.strip(segments, w0, span, width)
            edges = np.flatnonzero(np.diff(strip)) + 1  # one append per run of a state, not per column
            for a, b in zip([0, *edges.tolist()], [*edges.tolist(), width], strict=True):
                ch, style = self.STATES[int(strip[a])]
                text.append(ch * (b - a), style=style)
            text.append("\n")
        return text

    def strip(self, segments: list[Segment], w0: int, span: int, width: int) -> np.ndarray:
        """The state of each of `width` columns over [w0, w0 + span): the segments painted in PAINT_ORDER, each
        blank followed by its wake-up wait and its throttled wait; where several share a column the last painted
        shows.  Unsampled on-CPU time stays blank.  Vectorised: a window holds thousands of segments a vCPU."""
        rank = {id(kind): i for i, kind in enumerate(self.PAINT_ORDER)}  # unsampled: not painted (by id: an Enum's
        # hash is Python code)
        n = len(segments)
        start, end = (np.fromiter(map(attrgetter(f), segments), np.int64, n) for f in ("start_ns", "end_ns"))
        paint = np.fromiter(map(rank.get, map(id, map(attrgetter("kind"), segments)), repeat(-1, n)), np.int64, n)
        # painted in PAINT_ORDER, each kind in the segments' order
        order = np.flatnonzero(paint >= 0)
        order = order[np.argsort(paint[order], kind="stable")]
        start, end, paint = start[order], end[order], paint[order]
        blanks = [s.blank for s in segments if s.kind is SegmentKind.BLANK]  # the first rows, in order
        never = np.iinfo(np.int64).min  # no wake-up, no throttled wait
        extra = np.array([(self.BLANK_STATES[b.kind], never if b.wakeup_ns is None else b.wakeup_ns,
                           *(b.throttled_after_wakeup() or (never, never))) for b in blanks],  # type: ignore[union-attr]
                         np.int64).reshape(-1, 4)

        def column(ns: np.ndarray) -> np.ndarray:
            return (ns - w0) * width // span

        lo = np.minimum(column(start), width - 1)
        hi = np.maximum(column(end), lo + 1)
        state = np.where(paint == rank[id(SegmentKind.GUEST)], 1, 2)
        n = len(blanks)
        state[:n] = extra[:, 0]
        b_lo, b_hi, b_start, b_end = lo[:n], hi[:n], start[:n], end[:n]
        wakeup, t0, t1 = extra[:, 1], extra[:, 2], extra[:, 3]
        woken = wakeup != never
        wake = np.where(woken, np.minimum(column(np.where(woken, wakeup, b_end)), b_hi - 1), b_hi)  # for its pCPU
        throttled = (t0 != never) & (t0 < b_end) & (t1 > b_start)  # woken into a throttled group
        a = np.minimum(np.maximum(column(np.where(throttled, t0, b_start)), b_lo), b_hi - 1)
        b = np.where(throttled, np.minimum(np.maximum(column(np.where(throttled, t1, b_start)), a + 1), b_hi), a)
        # (lo, hi, state) of every interval in the order they are painted: each blank, its wake-up wait, its
        # throttled wait, then the VMM's runs and the guest's
        lo = np.concatenate([np.stack([b_lo, wake, a], 1).reshape(-1), lo[n:]])
        hi = np.concatenate([np.stack([b_hi, b_hi, b], 1).reshape(-1), hi[n:]])
        state = np.concatenate([np.stack([state[:n], np.full(n, self.WAKEUP_STATE),
                                          np.full(n, self.BLANK_STATES[BlankKind.THROTTLED])], 1).reshape(-1),
                                state[n:]])
        # as strip[lo:hi] reads its bounds: from the end when negative, cut to the strip
        lo, hi = (np.clip(np.where(x < 0, x + width, x), 0, width) for x in (lo, hi))
        size = np.maximum(hi - lo, 0)
        order = np.repeat(np.arange(len(lo)), size)  # each covered column, with the interval painting it
        cols = lo[order] + np.arange(len(order)) - np.repeat(np.cumsum(size) - size, size)
        last = np.full(width, -1, np.int64)
        np.maximum.at(last, cols, order)
        return np.where(last >= 0, np.append(state, 0)[last], 0).astype(np.int8)
