"""`vmprof top`: the live screen, sampling this host or replaying a recording."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from vmprof_tui.cli.common import Failure, Usage, stop_on_signals

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
    p.add_argument("-F", "--frequency", "--rate", type=int, default=1000, metavar="HZ",
                   help="samples per second per CPU")
    p.add_argument("--window", type=float, default=5.0, metavar="S", help="seconds of history analysed")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S", help="seconds between refreshes")
    p.add_argument("-g", dest="stacks", action="store_true",
                   help="collect call stacks, for the flame view (f) and the callers view (c)")
    p.add_argument("--call-graph", default=None, metavar="fp|cfi|dwarf[,SIZE]",
                   help="implies -g: user chains by frame pointers (fp, the default) or unwound from stack copies by "
                        "call-frame information (cfi), as vmprof record --call-graph")
    p.add_argument("--host-counts", choices=("auto", "on", "off"), default="auto",
                   help="count host tasks' samples in a BPF map by process and IP instead of sending each one "
                        "(the host view's rows; vCPU threads' samples still come one by one): auto is on from "
                        f"{HOST_COUNTS_FROM:,} samples/s (rate x CPUs) up, and off with -g")


def run_top(replay: str | None, frequency: int, window_s: float, refresh_s: float,
            should_stop: Callable[[], bool] | None = None, stacks: bool = False, host_counts: bool = False,
            call_graph: tuple[str, int] | None = None) -> None:
    from vmprof_tui.analyse.window import LiveWindow, ReplayWindow
    from vmprof_tui.show.tui import VmprofTop

    if replay:
        from vmprof_tui.record.recording import RecordingError

        try:
            window = ReplayWindow(Path(replay), window_s)
        except RecordingError as e:
            raise Failure(str(e)) from None
    else:
        from vmprof_tui.cli.record import parse_call_graph
        from vmprof_tui.collect.backends import BackendError
        from vmprof_tui.collect.bpf import CollectError
        from vmprof_tui.collect.session import CollectionSession

        mode, copy_bytes = call_graph or parse_call_graph(None)
        try:  # checks privileges, BTF and KVM here; BPF loads in the app
            window = LiveWindow(CollectionSession(frequency, build_ids=False, stacks=stacks, host_counts=host_counts,
                                                  call_graph=mode, stack_copy_bytes=copy_bytes),
                                window_s)
        except (BackendError, CollectError) as e:
            raise Failure(str(e)) from None
    try:
        VmprofTop(window, refresh_s, should_stop).run()
    finally:
        window.close()


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.cli.record import parse_call_graph

    call_graph = parse_call_graph(args.call_graph)
    args.stacks = args.stacks or args.call_graph is not None
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

        if not discover.discover_vms():
            print("vmprof top: no KVM guest runs on this host; showing the host alone "
                  "(`vmprof demo` starts demo VMs)", file=sys.stderr)
    run_top(args.replay, args.frequency, args.window, args.refresh, stop_on_signals(), args.stacks, counted,
            call_graph)
    return 0


def host_counts(mode: str, frequency: int, stacks: bool) -> bool:
    """Whether host tasks' samples are counted in the kernel (--host-counts)."""
    if mode == "on" and stacks:
        raise Usage("--host-counts on keeps no host call stacks: leave out -g or --host-counts on")
    return mode == "on" or (mode == "auto" and not stacks and frequency * (os.cpu_count() or 1) >= HOST_COUNTS_FROM)
