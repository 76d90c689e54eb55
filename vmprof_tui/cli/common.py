"""What every command shares: the one-line failure, clean stop on signals, output, recording arguments."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis


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


def write_output(args: argparse.Namespace, data: str | bytes) -> None:
    """To -o FILE when given, else to stdout (bytes as bytes)."""
    if getattr(args, "output", None):
        Path(args.output).write_bytes(data if isinstance(data, bytes) else data.encode())
    elif isinstance(data, bytes):
        sys.stdout.buffer.write(data)
    else:
        sys.stdout.write(data)


def add_recording_arguments(p: argparse.ArgumentParser) -> None:
    """REC and the options of every command that analyses a recording (report, steal)."""
    p.add_argument("recording", metavar="REC", nargs="?", default=None,
                   help=f"a recording written by vmprof record (default: -i, else ./{DEFAULT_RECORDING})")
    p.add_argument("-i", "--input", default=None, metavar="FILE", help="the recording, as perf's -i")
    p.add_argument("--vm", default=None, metavar="NAME", help="one VM")
    p.add_argument("--guest-bundle", action="append", default=[], metavar="VM=PATH",
                   help="guest bundle (folder or tar) naming VM's guest samples (repeatable)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N rows")
    p.add_argument("--time-range", default=None, metavar="FROM:TO",
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
    large block is freed: a large recording's tables then stay in RSS once freed (260 of the 1,200 MB of a
    3.84M-sample report).  A fixed 1 MiB threshold gives every large array back when freed, at the cost of
    page faults on each new one (+0.2 s at 600k samples, +1.2 s at 3.84M): worth it for large recordings only."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator, its behaviour
        ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD; fixing it also stops the raising


def no_vm(an: Analysis, recording: str, then: str) -> str:
    """The line for a recording without a VM: a damaged one says so (its VMs may be in what was skipped)."""
    damage = an.rec.damage()
    if damage:
        return f"{recording} has no readable VM: {damage}"
    return f"{recording} has no VM{then}"


def load_analysis(args: argparse.Namespace) -> Analysis:
    """The Analysis of REC with the options of add_recording_arguments."""
    from vmprof_tui.analyse.analysis import Analysis, in_kernel, recording_window
    from vmprof_tui.record.recording import RecordingError, load

    if args.recording and args.input and args.recording != args.input:
        raise Usage(f"give the recording once: REC ({args.recording}) or -i ({args.input})")
    given = args.recording or args.input
    if not given and not Path(DEFAULT_RECORDING).exists():
        raise Failure(f"no recording given and no ./{DEFAULT_RECORDING} here: vmprof record writes one")
    args.recording = given or DEFAULT_RECORDING
    with contextlib.suppress(OSError):  # an unreadable one fails with its line just below
        if os.path.getsize(args.recording) > LARGE_RECORDING:
            return_freed_memory()
    try:
        rec = load(Path(args.recording))
    except RecordingError as e:
        raise Failure(str(e)) from None
    time_range = None
    if args.time_range:
        try:
            lo, hi = (float(x) for x in args.time_range.split(":"))
        except ValueError:
            raise Usage(f"--time-range takes FROM:TO in seconds, not {args.time_range!r}") from None
        w0, w1 = recording_window(rec)
        span = (w1 - w0) / 1e9
        if lo < 0 or hi <= lo:
            raise Usage(f"--time-range {args.time_range}: FROM must be at least 0 and below TO")
        if lo >= span:
            raise Failure(f"--time-range {args.time_range} starts after the end of {args.recording} "
                          f"(it spans 0 to {span:.2f} s)")
        time_range = (lo, min(hi, span))
    keep = None
    if getattr(args, "hide_kernel", False):
        keep = lambda s: ~in_kernel(s)  # noqa: E731
    elif getattr(args, "hide_user", False):
        keep = in_kernel
    bundles = _parse_bundles(args.guest_bundle)
    an = Analysis(rec, bundles, time_range=time_range, keep=keep)
    for vm, path in bundles.items():  # a bundle for a VM not recorded names nothing: a typo, most likely
        if vm not in an.vm_names():
            raise Failure(f"--guest-bundle {vm}={path}: no VM named {vm} in {args.recording} "
                          f"(VMs: {', '.join(an.vm_names()) or 'none'})")
    if args.vm and args.vm not in an.vm_names():
        raise Failure(f"no VM named {args.vm} in {args.recording} (VMs: {', '.join(an.vm_names()) or 'none'})")
    return an
