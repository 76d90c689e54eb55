"""`vmprof top`: the live screen, sampling this host or replaying a recording."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from vmprof_tui.cli.common import Failure, Usage, frequency, stop_on_signals

REFRESH_S = (0.25, 10.0)  # what + and - step between on the screen (show/tui.py)
WINDOW_S = (1.0, 120.0)  # what [ and ] step between
HOST_COUNTS_FROM = 64_000  # samples/s (rate x CPUs) from which --host-counts auto counts in the kernel

HELP = "the live screen: what every VM, vCPU, guest process and function is doing now"
EXAMPLES = """examples:
  vmprof top                      live: every VM, vCPU, process, function
  vmprof top -F 499 --window 30   lower rate, longer window
  vmprof top --replay run.vmprof  play a recording through the same screens
  vmprof top -g                   + call stacks: flame view (f), callers (c)
  vmprof top --host-counts on     host tasks' samples counted in the kernel
                                  (the default from 64,000 samples/s up)
  vmprof top --store /srv/store   step through the windows of a fleet store"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replay", default=None, metavar="REC", help="play a recording instead of sampling live")
    p.add_argument("--store", default=None, metavar="DIR", help="step through the windows of a fleet store "
                   "(vmprof analyze) instead")
    p.add_argument("-F", "--frequency", "--rate", type=frequency, default=1000, metavar="HZ",
                   help="samples per second per CPU")
    p.add_argument("--window", type=float, default=5.0, metavar="S",
                   help=f"seconds of history analysed ({WINDOW_S[0]:g} to {WINDOW_S[1]:g})")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help=f"seconds between refreshes ({REFRESH_S[0]:g} to {REFRESH_S[1]:g}, as + and - allow)")
    p.add_argument("-g", "--call-graph", dest="stacks", action="store_true",
                   help="collect call stacks, for the flame view (f) and the callers view (c)")
    p.add_argument("--host-counts", choices=("auto", "on", "off"), default="auto",
                   help="count host tasks' samples in a BPF map by process and IP instead of sending each one "
                        "(the host view's rows; vCPU threads' samples still come one by one): auto is on from "
                        f"{HOST_COUNTS_FROM:,} samples/s (rate x CPUs) up, and off with -g")


def run_top(replay: str | None, frequency: int, window_s: float, refresh_s: float,
            should_stop: Callable[[], bool] | None = None, stacks: bool = False, host_counts: bool = False) -> None:
    from vmprof_tui.analyse.window import LiveWindow, ReplayWindow
    from vmprof_tui.show.tui import VmprofTop

    if replay:
        from vmprof_tui.record.recording import RecordingError

        try:
            window = ReplayWindow(Path(replay), window_s)
        except RecordingError as e:
            raise Failure(str(e)) from None
    else:
        from vmprof_tui.collect.backends import BackendError
        from vmprof_tui.collect.bpf import CollectError
        from vmprof_tui.collect.session import CollectionSession

        try:  # checks privileges, BTF and KVM here; BPF loads in the app
            window = LiveWindow(CollectionSession(frequency, build_ids=False, stacks=stacks, host_counts=host_counts),
                                window_s)
        except (BackendError, CollectError) as e:
            raise Failure(str(e)) from None
    try:
        VmprofTop(window, refresh_s, should_stop).run()
    finally:
        window.close()


def run(args: argparse.Namespace) -> int:
    # a refresh of 0 or less would spin the screen's event loop, which then never reads q or the SIGTERM flag
    for name, value, (lo, hi) in (("--refresh", args.refresh, REFRESH_S), ("--window", args.window, WINDOW_S)):
        if not lo <= value <= hi:  # NaN fails too
            raise Usage(f"{name} takes seconds from {lo:g} to {hi:g}, not {value:g}")
    counted = host_counts(args.host_counts, args.frequency, args.stacks)
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise Failure("the live screen needs a terminal (stdout and stdin); for text use `vmprof record` "
                      "and `vmprof report`")
    if args.store:
        from vmprof_tui.fleet.history import Store, StoreError
        from vmprof_tui.show.store_app import StoreApp

        try:
            StoreApp(Store(Path(args.store))).run()
        except StoreError as e:
            raise Failure(str(e)) from None
        return 0
    if not args.replay:
        from vmprof_tui.collect import discover
        from vmprof_tui.collect.bpf import CollectError, check_privileges

        try:  # first: without privileges the guests cannot be seen either, so "no KVM guest" would be false
            check_privileges()
        except CollectError as e:
            raise Failure(str(e)) from None
        if not discover.discover_vms():
            print("vmprof top: no KVM guest runs on this host; showing the host alone "
                  "(`vmprof demo` starts demo VMs)", file=sys.stderr)
    run_top(args.replay, args.frequency, args.window, args.refresh, stop_on_signals(), args.stacks, counted)
    return 0


def host_counts(mode: str, frequency: int, stacks: bool) -> bool:
    """Whether host tasks' samples are counted in the kernel (--host-counts)."""
    if mode == "on" and stacks:
        raise Usage("--host-counts on keeps no host call stacks: leave out -g or --host-counts on")
    return mode == "on" or (mode == "auto" and not stacks and frequency * (os.cpu_count() or 1) >= HOST_COUNTS_FROM)
