"""`vmprof blocks`: LBR block times with measured CPI, from a recording (REC) or `perf script` text."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vmprof_tui.lbr import format_csv, format_json, format_table, patterns
from vmprof_tui.lbr.blocks import BlockReport, BlocksError, analyse
from vmprof_tui.lbr.model import BranchFilter
from vmprof_tui.lbr.perf_script import PerfScriptError, build_resolvers, make_resolve_pid, notes_of, read
from vmprof_tui.lbr.recording import samples_of_recording, simulated_note
from vmprof_tui.record.recording import RecordingError, load
from vmprof_tui.resolve.elfcode import ImageCache

HELP = "time the instruction blocks before each sample from LBR records and measured CPI"
EXAMPLES = """examples:
  vmprof blocks --perf-script prog.txt -f quantum_toffoli --freq-mhz 3300
      import `perf script` text of `perf record -b` (docs/lbr.md)
  vmprof blocks --perf-script prog.txt --object ./shor -f quantum_toffoli \\
      --format json
  vmprof blocks REC -f main --vm vm1 --process shor --format csv
  vmprof blocks --patterns --rate 1000 --cpus 16   the patterns' data volume
  vmprof blocks --check            can this host collect LBR? (needs a PMU)"""

FORMATTERS = {"table": format_table.render, "json": format_json.render, "csv": format_csv.render}
FILTERS = {"any": BranchFilter.ANY, "callret": BranchFilter.CALL | BranchFilter.RETURN, "call": BranchFilter.CALL}

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recording", nargs="?", metavar="REC", help="a vmprof recording with LBR samples")
    p.add_argument("--perf-script", metavar="FILE", help="import `perf script` text of `perf record -b` data "
                   "('-' reads stdin)")
    p.add_argument("--function", "-f", metavar="NAME", help="show the blocks of this function")
    p.add_argument("--vm", metavar="NAME", help="only samples of this VM")
    p.add_argument("--process", "-p", metavar="NAME", help="only samples of this process (comm or pid)")
    p.add_argument("--format", choices=sorted(FORMATTERS), default="table", help="output format")
    p.add_argument("--freq-mhz", type=float, metavar="MHZ", help="CPU frequency, to show times in ns")
    p.add_argument("--object", action="append", default=[], metavar="PATH[@BIAS]",
                   help="object file to resolve addresses with (bias = runtime - file address; default 0); "
                        "repeatable; objects named by the perf script lines are found by themselves")
    p.add_argument("--branch-filter", choices=["auto", *FILTERS], default="auto",
                   help="what the LBR recorded (auto: from perf's branch types, else call+return)")
    p.add_argument("--samples", type=int, default=3, metavar="N",
                   help="per-sample tables for the first N samples (table/json/csv; default 3, -1 all)")
    p.add_argument("--patterns", action="store_true", help="show the data volume of each collection pattern")
    p.add_argument("--rate", type=float, default=1000.0, metavar="HZ", help="samples/s per CPU for --patterns")
    p.add_argument("--cpus", type=int, default=1, metavar="N", help="CPUs for --patterns")
    p.add_argument("--lbr-depth", type=int, default=16, metavar="N", help="LBR entries for --patterns")
    p.add_argument("--check", action="store_true", help="say whether this host can collect LBR samples")


def render(report: BlockReport, fmt: str, function: str | None, max_samples: int | None) -> str:
    try:
        return FORMATTERS[fmt](report, function, max_samples)
    except KeyError:
        raise BlocksError(f"unknown format {fmt!r}; choose from {', '.join(FORMATTERS)}") from None


def run_blocks_from_perf_script(path: str, function: str | None, fmt: str = "table", objects: Sequence[str] = (),
                                freq_hz: float | None = None, branch_filter: BranchFilter | None = None,
                                process: str | None = None, max_samples: int | None = 3) -> str:
    """`vmprof blocks --perf-script FILE`: parse, resolve against ELF files on disk, analyse, format."""
    try:
        data = read(path, branch_filter)
        cache = ImageCache()
        glob, per_pid, errors = build_resolvers(data, objects, cache)
    except PerfScriptError as e:
        raise BlocksError(str(e)) from e
    report = analyse(data.samples, glob, freq_hz, read_code=cache, resolve_pid=make_resolve_pid(glob, per_pid),
                     process=process)
    report.notes.extend(f"object not used: {e}" for e in errors)
    report.notes.extend(notes_of(data))
    return render(report, fmt, function, max_samples)


def run(args: argparse.Namespace) -> int:
    """The `vmprof blocks` command: 0 success, 1 runtime failure, 2 bad usage."""
    if args.check:
        from vmprof_tui.lbr.capability import detect

        flt = FILTERS.get(args.branch_filter, BranchFilter.CALL | BranchFilter.RETURN)
        caps = detect(flt)
        print(caps.message, file=sys.stdout if caps.ok else sys.stderr)
        return 0 if caps.ok else 1
    if args.patterns:
        print(patterns.volume_table(args.lbr_depth, args.rate, args.cpus, info=False))
        print()
        print(patterns.volume_table(args.lbr_depth, args.rate, args.cpus, info=True))
        return 0
    freq = args.freq_mhz * 1e6 if args.freq_mhz else None
    max_samples = None if args.samples is not None and args.samples < 0 else args.samples
    flt = FILTERS.get(args.branch_filter)
    try:
        if args.perf_script:
            if args.recording:
                print("vmprof: give either REC or --perf-script, not both", file=sys.stderr)
                return 2
            out = run_blocks_from_perf_script(args.perf_script, args.function, args.format, args.object, freq, flt,
                                              args.process, max_samples)
        elif args.recording:
            rec = load(Path(args.recording))
            samples, resolve, resolve_pid, read_code = samples_of_recording(rec, args.vm, args.process)
            report = analyse(samples, resolve, freq, read_code=read_code,  # type: ignore[arg-type]
                             resolve_pid=resolve_pid, vm=args.vm, process=args.process)  # type: ignore[arg-type]
            if note := simulated_note(rec.meta):
                report.notes.insert(0, note)
            out = render(report, args.format, args.function, max_samples)
        else:
            print("vmprof: blocks needs a recording (REC) or --perf-script FILE; see vmprof blocks --help",
                  file=sys.stderr)
            return 2
    except (BlocksError, RecordingError) as e:
        print(f"vmprof: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0
