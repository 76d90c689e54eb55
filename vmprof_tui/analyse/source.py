"""What show/ reads of a profiled span: ``ProfileSource``, the declared read interface, and ``RecordingSource``,
its implementation over one Analysis (a recording, or a span of one).

The live screen's window (window.WindowView) implements it too, from the summaries of its chunks; the screens
read nothing else, so they draw a recording and a live host alike.  ``Window`` is what the live screen polls:
a collection session on this host (window.LiveWindow) or a recording played back (window.ReplayWindow).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import WeightedStacks, call_paths
from vmprof_tui.analyse.segments import Segment, vcpu_segments
from vmprof_tui.analyse.shares import GuestSummary, HostSummary, Row
from vmprof_tui.analyse.steal import vcpu_steal


@runtime_checkable
class ProfileSource(Protocol):
    """A span of the host clock: its VMs, summaries, profile rows, steal detail, segments and call paths."""

    def span(self) -> tuple[int, int]:
        """[lo, hi) on the host clock."""

    def vm_names(self) -> list[str]: ...

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        """(vCPU id, thread id) of each vCPU of a VM, by vCPU id."""

    def host_summary(self) -> HostSummary: ...

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary: ...

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]: ...

    def host_rows(self, limit: int | None) -> tuple[list[Row], int]:
        """The host profile's `limit` rows with the most samples (None: all), and how many rows it shows."""

    def guest_rows(self, vm: str, vcpu: int | None = None) -> list[Row]:
        """The rows a guest profile shows: functions, and the virtual rows by cause."""

    def vcpu_steal(self, vm: str) -> list[dict]:
        """steal.vcpu_steal of the span."""

    def vcpu_segments(self, vm: str) -> dict[int, list[Segment]]:
        """Per vCPU of a VM, its segments over the span (segments.vcpu_segments)."""

    def call_paths(self, vm: str | None) -> WeightedStacks | None:
        """The VM's (None: the host's) call paths; None without call stacks or without the VM."""


class RecordingSource:
    """ProfileSource over one Analysis."""

    def __init__(self, an: Analysis) -> None:
        self.analysis = an

    def span(self) -> tuple[int, int]:
        return self.analysis.span()

    def vm_names(self) -> list[str]:
        return self.analysis.vm_names()

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        return self.analysis.vcpu_threads(vm)

    def host_summary(self) -> HostSummary:
        return self.analysis.host_summary()

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary:
        return self.analysis.guest_summary(vm, vcpu)

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]:
        return self.analysis.guest_ratios(vm, vcpu)

    def host_rows(self, limit: int | None) -> tuple[list[Row], int]:
        rows = sorted(self.analysis.host_profile().shown_rows, key=lambda r: -r.samples)
        return rows[:limit], len(rows)

    def guest_rows(self, vm: str, vcpu: int | None = None) -> list[Row]:
        return self.analysis.guest_profile(vm, vcpu).shown_rows

    def vcpu_steal(self, vm: str) -> list[dict]:
        return vcpu_steal(self.analysis, vm)

    def vcpu_segments(self, vm: str) -> dict[int, list[Segment]]:
        an = self.analysis
        return {tl.vcpu: vcpu_segments(an, tl) for tl in an.vm_timelines(vm)}

    def call_paths(self, vm: str | None) -> WeightedStacks | None:
        return call_paths(self.analysis, vm)


class Window(Protocol):
    """What `vmprof top` polls: a live collection session or a recording played back (analyse/window.py)."""

    live: bool  # sampling this host now (not a replay)
    started: bool
    damage: str | None  # what corruption cost a replay (None: nothing, or live)
    window_s: float  # the seconds a window spans
    messages: list[str]  # news for the status line (VMs that started or stopped), taken by the screen
    at_end: bool  # a replay reached the end of its recording

    def start(self) -> None: ...

    def poll(self, detail: bool = False) -> ProfileSource:
        """The window after what came since the last poll; detail: analyse each new chunk in full at once."""

    def close(self) -> None: ...
