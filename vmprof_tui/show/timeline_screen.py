"""Per-vCPU strips of the window: guest running, VMM, steal, idle."""

from __future__ import annotations

import numpy as np
from rich.text import Text

from vmprof_tui.analyse.kinds import BlankKind
from vmprof_tui.analyse.segments import SegmentKind
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
            strip = np.zeros(width, np.int8)  # unsampled on-CPU time stays blank
            for kind in self.PAINT_ORDER:
                for seg in segments:
                    if seg.kind is not kind:
                        continue
                    lo = min(int((seg.start_ns - w0) * width // span), width - 1)
                    hi = max(int((seg.end_ns - w0) * width // span), lo + 1)
                    strip[lo:hi] = (self.BLANK_STATES[seg.blank.kind] if seg.blank is not None
                                    else 1 if kind is SegmentKind.GUEST else 2)
                    if seg.blank is not None and seg.blank.wakeup_ns is not None:  # woken, waiting for its pCPU
                        wake = min(int((seg.blank.wakeup_ns - w0) * width // span), hi - 1)
                        strip[wake:hi] = self.WAKEUP_STATE
                    thr = seg.blank.throttled_after_wakeup() if seg.blank is not None else None
                    if thr and thr[0] < seg.end_ns and thr[1] > seg.start_ns:
                        a = min(max(int((thr[0] - w0) * width // span), lo), hi - 1)  # woken into a throttled group
                        strip[a:min(max(int((thr[1] - w0) * width // span), a + 1), hi)] = self.BLANK_STATES[
                            BlankKind.THROTTLED]
            text.append(f"vcpu{vcpu:<3} ")
            for code in strip.tolist():
                ch, style = self.STATES[code]
                text.append(ch, style=style)
            text.append("\n")
        return text
