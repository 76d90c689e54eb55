"""`vmprof top`: the live screen, sampling this host or replaying a recording."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

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
  vmprof top --store /srv/store   step through the windows of a fleet store
  vmprof top --replay sim.vmprof --blocks pair
                                  LBR blocks of a function (b on a function row)
  vmprof top --perf-script prog.txt --object ./prog --blocks hot
                                  the same for `perf record -b` data
  vmprof top --lbr=simulate --blocks hash_step -- ./prog
                                  live LBR blocks of a single-stepped
                                  command (any host; --lbr on a PMU host)"""
if TYPE_CHECKING:
    from vmprof_tui.collect.session import BranchCollector
    from vmprof_tui.lbr.live import LiveLbr

SIMULATE_PERIOD = 10_000  # cost-model cycles between simulated LBR samples: a few a second single-stepped


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
    p.add_argument("-g", dest="stacks", action="store_true",
                   help="collect call stacks, for the flame view (f) and the callers view (c)")
    p.add_argument("--call-graph", default=None, metavar="fp|cfi|dwarf[,SIZE]",
                   help="implies -g: user chains by frame pointers (fp, the default) or unwound from stack copies by "
                        "call-frame information (cfi), as vmprof record --call-graph")
    p.add_argument("--host-counts", choices=("auto", "on", "off"), default="auto",
                   help="count host tasks' samples in a BPF map by process and IP instead of sending each one "
                        "(the host view's rows; vCPU threads' samples still come one by one): auto is on from "
                        f"{HOST_COUNTS_FROM:,} samples/s (rate x CPUs) up, and off with -g")
    p.add_argument("--blocks", default=None, metavar="FUNCTION", help="open the LBR block view of FUNCTION "
                   "(needs --replay of a recording made with --lbr or --lbr=simulate, or --perf-script)")
    p.add_argument("--perf-script", default=None, metavar="FILE", help="replay `perf script` text of "
                   "`perf record -b` data (as `vmprof blocks --perf-script` reads it) for the block view")
    p.add_argument("--object", action="append", default=[], metavar="PATH[@BIAS]",
                   help="with --perf-script: object file to resolve addresses with (repeatable)")
    p.add_argument("--freq-mhz", type=float, default=None, metavar="MHZ",
                   help="CPU frequency, for block times in ns (default: cycles)")
    p.add_argument("--lbr", nargs="?", const="type4", default=None, metavar="PATTERN",
                   help="live LBR for the block view (b): on a host with a PMU and LBR the pattern's branch records "
                        "with cycles and instructions (type1..type4 or any, default type4); simulate[:PATTERN] "
                        "needs -- COMMAND and works anywhere: COMMAND is single-stepped (slow: bounded by "
                        "--lbr-max-instructions) and sampled as a PMU host would, marked SIMULATED (docs/lbr.md)")
    p.add_argument("--lbr-period", type=int, default=None, metavar="CYCLES",
                   help=f"cycles between LBR samples (default 1000003; simulated: {SIMULATE_PERIOD:,})")
    p.add_argument("--lbr-depth", type=int, default=16, metavar="N", help="with --lbr=simulate: LBR entries")
    p.add_argument("--lbr-max-instructions", type=int, default=2_000_000, metavar="N",
                   help="with --lbr=simulate: stop the command after N instructions (the screen stays)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="with --lbr=simulate: the command single-stepped")


def lbr_window(replay: str | None, perf_script: str | None, window_s: float, objects: list[str],
               freq_hz: float | None) -> tuple[object, object | None]:
    """(ReplayWindow, LbrSource or None) of a recording or of `perf script` text."""
    from vmprof_tui.analyse.window import ReplayWindow
    from vmprof_tui.lbr import source as lbr_source
    from vmprof_tui.lbr.perf_script import PerfScriptError, as_recording
    from vmprof_tui.record.recording import RecordingError

    try:
        if perf_script:
            source, data = lbr_source.from_perf_script(perf_script, objects, freq_hz)
            return ReplayWindow(Path(perf_script), window_s, as_recording(data, perf_script)), source
        window = ReplayWindow(Path(replay or ""), window_s)
        return window, lbr_source.from_recording(window.rec, freq_hz)
    except (RecordingError, PerfScriptError) as e:
        raise Failure(str(e)) from None


def live_lbr(spec: str, period: int | None, depth: int, max_instructions: int, command: list[str],
             freq_hz: float | None) -> tuple[BranchCollector, LiveLbr]:
    """(the collector the session takes, the block view's source it feeds) of `top --lbr[=simulate] [-- CMD]`."""
    from vmprof_tui.lbr.collector import LbrCollector, LbrConfig
    from vmprof_tui.lbr.live import LiveLbr
    from vmprof_tui.lbr.patterns import get
    from vmprof_tui.lbr.recording import simulated_note
    from vmprof_tui.lbr.simulated_collector import SimulatedCollector

    kind, _, name = spec.partition(":")
    simulated = kind == "simulate"
    if simulated and not command:
        raise Usage("--lbr=simulate needs a command to single-step: vmprof top --lbr=simulate -- CMD")
    if command and not simulated:
        raise Usage("a command goes with --lbr=simulate: vmprof top samples the whole host")
    if period is not None and period < 1 or not 1 <= depth <= 256 or max_instructions < 1:
        raise Usage("--lbr-period and --lbr-max-instructions must be at least 1, --lbr-depth 1..256")
    try:
        pattern = get((name if simulated else kind) or "type4")
    except ValueError as e:
        raise Usage(f"--lbr={spec}: {e}") from None
    if not simulated:
        collector = LbrCollector(LbrConfig(pattern, period=period or 1_000_003))
        return collector, LiveLbr("LBR of this host", freq_hz)
    sim = SimulatedCollector(command, pattern.with_options(info=True), period or SIMULATE_PERIOD, depth,
                             max_instructions)
    return sim, LiveLbr("SIMULATED LBR (single-step truth)", freq_hz, lambda: simulated_note({"lbr": sim.meta()}))


def run_top(replay: str | None, frequency: int, window_s: float, refresh_s: float,
            should_stop: Callable[[], bool] | None = None, stacks: bool = False, host_counts: bool = False,
            blocks: str | None = None, perf_script: str | None = None, objects: list[str] | None = None,
            freq_hz: float | None = None, call_graph: tuple[str, int] | None = None,
            lbr_live: tuple[BranchCollector, LiveLbr] | None = None) -> None:
    """The live screen on a recording, `perf script` text, or this host (lbr_live: live_lbr's pair)."""
    from vmprof_tui.analyse.window import LiveWindow
    from vmprof_tui.lbr.screen import LbrViews
    from vmprof_tui.lbr.source import NO_LBR
    from vmprof_tui.show.tui import VmprofTop

    lbr = None
    if replay or perf_script:
        window, lbr = lbr_window(replay, perf_script, window_s, objects or [], freq_hz)
        if blocks and lbr is None:
            raise Failure(f"--blocks: {replay} has no branch records; {NO_LBR}")
    else:
        from vmprof_tui.cli.record import parse_call_graph
        from vmprof_tui.collect.backends import BackendError
        from vmprof_tui.collect.bpf import CollectError
        from vmprof_tui.collect.session import CollectionSession, SessionError

        mode, copy_bytes = call_graph or parse_call_graph(None, "fp")
        collector, lbr = lbr_live if lbr_live is not None else (None, None)
        try:  # checks privileges, BTF and KVM here; BPF loads in the app
            window = LiveWindow(CollectionSession(frequency, build_ids=False, stacks=stacks, host_counts=host_counts,
                                                  call_graph=mode, stack_copy_bytes=copy_bytes,
                                                  lbr=collector),
                                window_s)
        except (BackendError, CollectError, SessionError) as e:
            raise Failure(str(e)) from None
        if lbr is not None:
            window.lbr_sink = lbr.take
    try:
        VmprofTop(window, refresh_s, should_stop, LbrViews(lbr), blocks).run()
    finally:
        window.close()


def run(args: argparse.Namespace) -> int:
    # a refresh of 0 or less would spin the screen's event loop, which then never reads q or the SIGTERM flag
    for name, value, (lo, hi) in (("--refresh", args.refresh, REFRESH_S), ("--window", args.window, WINDOW_S)):
        if not lo <= value <= hi:  # NaN fails too
            raise Usage(f"{name} takes seconds from {lo:g} to {hi:g}, not {value:g}")
    from vmprof_tui.cli.record import parse_call_graph

    # top's -g stays fp: the live window holds every copy of its seconds in memory (8 KiB a sample)
    call_graph = parse_call_graph(args.call_graph, "fp")
    args.stacks = args.stacks or args.call_graph is not None
    counted = host_counts(args.host_counts, args.frequency, args.stacks)
    if args.replay and args.perf_script:
        raise Usage("give either --replay REC or --perf-script FILE, not both")
    if args.object and not args.perf_script:
        raise Usage("--object goes with --perf-script")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.lbr and (args.replay or args.perf_script or args.store):
        raise Usage("--lbr samples this host live: leave out --replay, --perf-script and --store")
    if command and not args.lbr:
        raise Usage("a command goes with --lbr=simulate: vmprof top --lbr=simulate -- CMD")
    lbr_live = live_lbr(args.lbr, args.lbr_period, args.lbr_depth, args.lbr_max_instructions, command,
                        args.freq_mhz * 1e6 if args.freq_mhz else None) if args.lbr else None
    if args.blocks and not (args.replay or args.perf_script or args.lbr):
        from vmprof_tui.lbr.source import NO_LBR

        raise Usage(f"--blocks needs LBR data: {NO_LBR}")
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise Failure("the live screen needs a terminal (stdout and stdin); for text use `vmprof record` "
                      "and `vmprof report`")
    if args.store:
        from vmprof_tui.fleet.history import Store, StoreError
        from vmprof_tui.fleet.store_app import StoreApp

        try:
            StoreApp(Store(Path(args.store))).run()
        except StoreError as e:
            raise Failure(str(e)) from None
        return 0
    if not args.replay and not args.perf_script and not args.blocks:
        from vmprof_tui.collect import discover
        from vmprof_tui.collect.bpf import CollectError, check_privileges

        try:  # first: without privileges the guests cannot be seen either, so "no KVM guest" would be false
            check_privileges()
        except CollectError as e:
            raise Failure(str(e)) from None
        if not discover.discover_vms():
            print("vmprof top: no KVM guest runs on this host; showing the host alone "
                  "(`vmprof demo` starts demo VMs)", file=sys.stderr)
    run_top(args.replay, args.frequency, args.window, args.refresh, stop_on_signals(), args.stacks, counted,
            args.blocks, args.perf_script, args.object, args.freq_mhz * 1e6 if args.freq_mhz else None,
            call_graph, lbr_live)
    return 0


def host_counts(mode: str, frequency: int, stacks: bool) -> bool:
    """Whether host tasks' samples are counted in the kernel (--host-counts)."""
    if mode == "on" and stacks:
        raise Usage("--host-counts on keeps no host call stacks: leave out -g or --host-counts on")
    return mode == "on" or (mode == "auto" and not stacks and frequency * (os.cpu_count() or 1) >= HOST_COUNTS_FROM)
