"""What every command shares: the one-line failure, clean stop on signals, output, recording arguments."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from vmprof_tui import files

if TYPE_CHECKING:
    import numpy as np

    from vmprof_tui.analyse.analysis import Analysis
    from vmprof_tui.analyse.stream import StreamedAnalysis
    from vmprof_tui.analyse.stream_steal import StreamedSteal
    from vmprof_tui.analyse.stream_trace import StreamedTrace
    from vmprof_tui.record.stream import Scanned

A = TypeVar("A", "Analysis", "StreamedAnalysis", "StreamedSteal")


LARGE_PIECES = 4  # pieces of a streamed recording past which the heap is trimmed after them (give_back_free_memory)
LARGE_RECORDING = 64 << 20  # bytes (a million samples or so): memory before speed, see return_freed_memory
DEFAULT_RECORDING = "vmprof.data"  # as perf's perf.data: record writes it, report and steal read it


class Failure(Exception):
    """A runtime failure with one line for the user (exit status 1)."""


class Usage(Exception):
    """Bad usage found after parsing (options that do not go together): one line, exit status 2."""


def fail(message: str) -> int:
    print(f"vmprof: {message}", file=sys.stderr)
    return 1


def stop_on_signals() -> Callable[[], bool]:
    """Ctrl-C and SIGTERM end a command cleanly: they only set a flag that the command's loop watches."""
    flag = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: flag.set())
    return flag.is_set


def write_output(args: argparse.Namespace, data: str | bytes | Iterable[str]) -> None:
    """To -o FILE when given (files.write_file: never through a planted link), else to stdout (bytes as bytes);
    text given in parts is written as they come."""
    if getattr(args, "output", None):
        try:
            files.write_file(Path(args.output), data)
        except OSError as e:
            raise Failure(f"cannot write {args.output}: {e.strerror or e}") from None
    elif isinstance(data, bytes):
        sys.stdout.buffer.write(data)
    elif isinstance(data, str):
        sys.stdout.write(data)
    else:
        for part in data:
            sys.stdout.write(part)


# -- option values: one checker per kind of value, shared by every command -----------------------------------
# A bad value is one line (`vmprof CMD: argument -X: what is wrong`) and exit status 2, from argparse itself,
# before anything runs (a BPF compile, a measurement).

MAX_FREQUENCY = 100_000  # Hz per CPU


def _number(text: str, kind: type, what: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes {what}, not {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"takes {what}, not {text!r}")
    return value


def seconds(text: str) -> float:
    """-d S and the like: a finite number of seconds above 0."""
    value = _number(text, float, "a number of seconds above 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"takes a number of seconds above 0, not {text!r}")
    return value


def frequency(text: str) -> int:
    """-F HZ: samples per second per CPU."""
    what = f"a whole number of Hz from 1 to {MAX_FREQUENCY}"
    value = _number(text, int, what)
    if not 1 <= value <= MAX_FREQUENCY:
        raise argparse.ArgumentTypeError(f"takes {what}, not {text!r}")
    return int(value)


def count(text: str) -> int:
    """--limit N and the like: a whole number from 1."""
    value = _number(text, int, "a whole number from 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number from 1, not {text!r}")
    return int(value)


def time_range(text: str) -> tuple[float, float]:
    """--time-range FROM:TO, seconds after the first record, 0 <= FROM < TO."""
    lo, sep, hi = text.partition(":")
    try:
        lo_s, hi_s = float(lo), float(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes FROM:TO in seconds (e.g. 2.5:10), not {text!r}") from None
    if not sep or not (math.isfinite(lo_s) and math.isfinite(hi_s)) or lo_s < 0 or hi_s <= lo_s:
        raise argparse.ArgumentTypeError(f"takes FROM:TO in seconds with 0 <= FROM < TO, not {text!r}")
    return lo_s, hi_s


SCHEDULER_ADDRESS = re.compile(r"(?:(?:tcp|tls|ucx|ws|wss)://)?(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?")


def scheduler_address(text: str) -> str:
    """--scheduler: a Dask scheduler address, [PROTOCOL://]HOST[:PORT]."""
    m = SCHEDULER_ADDRESS.fullmatch(text)
    if not m or (m.group(1) and int(m.group(1)) > 65535):
        raise argparse.ArgumentTypeError(f"takes a Dask scheduler address such as tcp://node1:8786, not {text!r}")
    return text


def check_output(path: str, option: str = "-o") -> None:
    """Before a long measurement: the file it ends with can be written (else Usage, one line)."""
    if (why := files.check_writable(Path(path))) is not None:
        raise Usage(f"{option} {path}: {why}")


def add_recording_arguments(p: argparse.ArgumentParser) -> None:
    """REC and the options of every command that analyses a recording (report, steal)."""
    p.add_argument("recording", metavar="REC", nargs="?", default=None,
                   help=f"a recording written by vmprof record (default: -i, else ./{DEFAULT_RECORDING})")
    p.add_argument("-i", "--input", default=None, metavar="FILE", help="the recording, as perf's -i")
    p.add_argument("--vm", default=None, metavar="NAME", help="one VM")
    p.add_argument("--guest-bundle", action="append", default=[], metavar="VM=PATH",
                   help="guest bundle (folder or tar) naming VM's guest samples (repeatable)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--limit", type=count, default=None, metavar="N", help="at most N rows")
    p.add_argument("--time-range", type=time_range, default=None, metavar="FROM:TO",
                   help="only this span, in seconds after the first record (e.g. 2.5:10)")


def _parse_bundles(values: list[str]) -> dict[str, Path]:
    out = {}
    for v in values:
        vm, sep, path = v.partition("=")
        if not sep or not vm or not path:
            raise Failure(f"--guest-bundle takes VM=PATH, not {v!r}")
        out[vm] = Path(path)
    return out


def return_freed_memory() -> None:
    """glibc serves blocks under its mmap threshold from the heap and raises that threshold (to 32 MiB) after a
    large block is freed: a large recording's tables then stay in RSS once freed.  A fixed 1 MiB threshold gives
    every large array back when freed, at the cost of page faults on each new one: worth it for large recordings
    only (the figures: docs/performance.md)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator, its behaviour
        ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD; fixing it also stops the raising


def give_back_free_memory() -> None:
    """The heap's free memory given back to the system now (glibc's malloc_trim): once a large recording's pieces
    are read, the heap is left holding what they freed (about 100 MB at 600 s of a 64-CPU host, by mallinfo2) in
    holes the profile's rows, made next, do not fit; given back, the rows' peak is theirs alone."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator, its behaviour
        ctypes.CDLL(None).malloc_trim(0)


def no_vm(an: Analysis, recording: str, then: str) -> str:
    """The line for a recording without a VM: a damaged one says so (its VMs may be in what was skipped)."""
    damage = an.rec.damage()
    if damage:
        return f"{recording} has no readable VM: {damage}"
    return f"{recording} has no VM{then}"


def load_analysis(args: argparse.Namespace) -> Analysis:
    """The Analysis of REC with the options of add_recording_arguments."""
    from vmprof_tui.analyse.analysis import Analysis
    from vmprof_tui.record.recording import RecordingError, load
    from vmprof_tui.resolve.prepare import prepare, recording_span

    recording_path(args)
    with contextlib.suppress(OSError):  # an unreadable one fails with its line just below
        if os.path.getsize(args.recording) > LARGE_RECORDING:
            return_freed_memory()
    try:
        rec = load(Path(args.recording))
    except RecordingError as e:
        raise Failure(str(e)) from None
    time_range = None
    if args.time_range:
        lo, hi = args.time_range  # checked by time_range()
        w0, w1 = recording_span(rec)
        span = (w1 - w0) / 1e9
        if lo >= span:
            raise range_after_end(args, span)
        time_range = (lo, min(hi, span))
    bundles = _parse_bundles(args.guest_bundle)
    return _checked(args, Analysis(prepare(rec, bundles, time_range=time_range, keep=_mode(args))), bundles)


def range_after_end(args: argparse.Namespace, span_s: float) -> Failure:
    lo, hi = args.time_range
    return Failure(f"--time-range {lo:g}:{hi:g} starts after the end of {args.recording} "
                   f"(it spans 0 to {span_s:.2f} s)")


def _mode(args: argparse.Namespace) -> Callable[[np.ndarray], np.ndarray] | None:
    """The samples -K (user mode) or -U (kernel mode) keep; None: all."""
    from vmprof_tui.analyse.analysis import in_kernel

    if getattr(args, "hide_kernel", False):
        return lambda s: ~in_kernel(s)
    if getattr(args, "hide_user", False):
        return in_kernel
    return None


def recording_path(args: argparse.Namespace) -> str:
    """REC or -i FILE (given once), else ./vmprof.data; set as args.recording."""
    if args.recording and args.input and args.recording != args.input:
        raise Usage(f"give the recording once: REC ({args.recording}) or -i ({args.input})")
    given = args.recording or args.input
    if not given and not Path(DEFAULT_RECORDING).exists():
        raise Failure(f"no recording given and no ./{DEFAULT_RECORDING} here: vmprof record writes one")
    args.recording = given or DEFAULT_RECORDING
    return args.recording


def _checked(args: argparse.Namespace, an: A, bundles: dict[str, Path]) -> A:
    """The analysis, once --guest-bundle and --vm name VMs it has."""
    for vm, path in bundles.items():  # a bundle for a VM not recorded names nothing: a typo, most likely
        if vm not in an.vm_names():
            raise Failure(f"--guest-bundle {vm}={path}: no VM named {vm} in {args.recording} "
                          f"(VMs: {', '.join(an.vm_names()) or 'none'})")
    if args.vm and args.vm not in an.vm_names():
        raise Failure(f"no VM named {args.vm} in {args.recording} (VMs: {', '.join(an.vm_names()) or 'none'})")
    return an


def _scanned_large(args: argparse.Namespace, rows: int, stacks: bool = False) -> Scanned | None:
    """REC scanned (record/stream.scan; with its call stacks, if it has any and `stacks`) when it has more samples
    than a piece and can be read a piece at a time; None: load it whole."""
    from vmprof_tui.record.stream import sample_rows, scan

    if sample_rows(Path(recording_path(args))) <= rows:  # a look at the chunk headers: small ones load whole
        return None
    scanned = scan(Path(args.recording), stacks)
    return scanned if scanned is not None and scanned.samples > rows else None


def _streamed(args: argparse.Namespace, rows: int, make: Callable[[Scanned, dict[str, Path]], A],
              free_memory: bool = False, stacks: bool = False) -> A | None:
    """make(REC scanned, the guest bundles) when REC is larger than a piece of `rows` samples and can be read a
    piece at a time (record/stream.scan; with its call stacks when `stacks`); None: load it whole (load_analysis),
    as when make gives up (WholeNeeded).  free_memory: large arrays given back when freed (return_freed_memory)."""
    from vmprof_tui.analyse import stream
    from vmprof_tui.record.recording import RecordingError

    if (scanned := _scanned_large(args, rows, stacks)) is None:
        return None
    bundles = _parse_bundles(args.guest_bundle)
    with contextlib.suppress(OSError):
        if free_memory and os.path.getsize(args.recording) > LARGE_RECORDING:
            return_freed_memory()
    try:
        an = make(scanned, bundles)
    except RecordingError as e:
        raise Failure(str(e)) from None
    except stream.WholeNeeded:
        return None
    except stream.RangeAfterEnd as e:
        raise range_after_end(args, e.span_s) from None
    if scanned.samples > LARGE_PIECES * rows:
        give_back_free_memory()
    return _checked(args, an, bundles)


def load_streamed_steal(args: argparse.Namespace) -> StreamedSteal | None:
    """REC for `vmprof steal`, its samples read a piece at a time (analyse/stream_steal.py; --time-range cuts
    them) when it is larger than a piece and can be read so; None: load it whole (load_analysis)."""
    from vmprof_tui.analyse import stream, stream_steal

    return _streamed(args, stream.PIECE_ROWS, lambda scanned, bundles: stream_steal.StreamedSteal(
        scanned, bundles, stream.PIECE_ROWS, args.time_range), True)


def load_streamed_trace(args: argparse.Namespace, level: str) -> StreamedTrace | None:
    """REC for `vmprof report --format chrome`, its samples read a piece at a time (analyse/stream_trace.py) when
    it is larger than a piece and can be read so (no call stacks, no --time-range); None: load it whole."""
    from vmprof_tui.analyse import stream
    from vmprof_tui.analyse.stream_trace import StreamedTrace
    from vmprof_tui.show.formats.chrome import slice_label

    if args.time_range:
        return None
    cpu = args.cpu if level == "host" else None
    rows = stream.PIECE_ROWS
    return _streamed(args, rows, lambda scanned, bundles: StreamedTrace(scanned, slice_label, bundles, level, args.vm,
                                                                        args.vcpu, rows, cpu), True)


def without_call_stacks(recording: str) -> Failure:
    return Failure(f"{recording} was recorded without call stacks: record with vmprof record -g")


def load_streamed(args: argparse.Namespace, level: str, kernel: bool,
                  piece_rows: int | None = None, stacks: bool = False,
                  call_graph: bool = False) -> StreamedAnalysis | None:
    """REC analysed a piece at a time (analyse/stream.py) for the profiles of `level` (host, or guest: of --vm
    or of every VM) when it is larger than a piece and can be read so (an intact recording); None: load it whole
    (load_analysis).  kernel: the rows carry their kernel-mode samples (row filters).  stacks: for the stack
    formats (analyse/stream_stacks.py: a host-level VM row split into its vCPU threads' rows) and the call graph
    views.  A recording with call stacks has its call paths summed too (analyse/stream_callgraph.py; without
    `stacks` only what their notes count).  call_graph: the call stacks are what is asked for (--children,
    --callers): a recording without them is refused before its pieces are read.  --cpu (host level) and
    --time-range cut the pieces (of a recording with call stacks too: its call paths are cut as its samples)."""
    from vmprof_tui.analyse import stream

    rows = piece_rows or stream.PIECE_ROWS
    cpu = getattr(args, "cpu", None) if level == "host" else None
    cut = {"cpu": cpu, "time_range": args.time_range}

    def make(scanned: Scanned, bundles: dict[str, Path]) -> StreamedAnalysis:
        if call_graph and scanned.rec.stacks is None:
            raise without_call_stacks(args.recording)
        if scanned.rec.stacks is not None:
            from vmprof_tui.analyse.stream_callgraph import StreamedCallGraph, stack_piece_rows

            return StreamedCallGraph(scanned, bundles, level, args.vm, stack_piece_rows(scanned, rows), _mode(args),
                                     kernel, paths=stacks, **cut)
        if stacks:
            from vmprof_tui.analyse.stream_stacks import StreamedStacks

            return StreamedStacks(scanned, bundles, level, args.vm, rows, _mode(args), kernel, **cut)
        return stream.StreamedAnalysis(scanned, bundles, level, args.vm, rows, _mode(args), kernel, **cut)

    return _streamed(args, rows, make, stacks=True)
