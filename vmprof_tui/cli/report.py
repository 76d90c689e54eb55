"""`vmprof report`: the papers' profile tables of a recording, at host or guest level, in any format."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.row_table import RowTable
from vmprof_tui.analyse.shares import row_ratios, whole_rows
from vmprof_tui.analyse.stream import StreamedAnalysis
from vmprof_tui.cli.common import (
    Failure,
    Usage,
    add_recording_arguments,
    load_analysis,
    load_streamed,
    load_streamed_trace,
    no_vm,
    without_call_stacks,
    write_output,
)
from vmprof_tui.lbr.recording import simulated_note
from vmprof_tui.show.formats import FORMATS
from vmprof_tui.show.formats.table import SORT_KEYS
from vmprof_tui.show.text import MIN_WIDTH, report_width

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis
    from vmprof_tui.analyse.shares import Profile, Row

ORDERED = ("table", "json", "csv")  # the formats whose rows --sort orders
FLAT = ("collapsed", "pprof", "speedscope", "svg")  # stack formats whose stacks are rows without call stacks
KNOWN_SHOWN = 8  # functions named when --callers matches none
Filters = list[tuple[str, Callable[["Row"], bool]]]  # (what, test) of a row filter

HELP = "profile tables of a recording, at host or guest level"
EXAMPLES = """examples:
  vmprof report                       host level of ./vmprof.data
  vmprof report run.vmprof --vm web1  guest level of VM web1: processes,
                                      functions, steal, idle
  vmprof report -i run.vmprof --vm web1 --vcpu 0 --format json
  vmprof report run.vmprof --cpu 1    host level, one pCPU only
  vmprof report --comm qemu-system-x86 --dso '[kernel.kallsyms]' --sort pid
  vmprof report run.vmprof -K         user-mode samples only, % of them (perf)
  vmprof report run.vmprof -K --percentage absolute   % of every sample
  vmprof report run.vmprof | less -S  whole names (--width N: cut to N columns)
  vmprof report run.vmprof --vm web1 --format collapsed > web1.folded
  vmprof report run.vmprof --vm web1 --guest-bundle web1=/srv/web1.tar
  vmprof report run.vmprof --vm web1 --format pprof -o web1.pb.gz
  vmprof report run.vmprof --format chrome -o run.json   (ui.perfetto.dev)
  vmprof report run.vmprof --format svg -o run.svg       flame graph
  vmprof report run.vmprof --format speedscope -o run.json   (speedscope)
  vmprof report run.vmprof --time-range 10:20   seconds 10 to 20 only
  vmprof report stacks.vmprof --vm web1 --children   (recorded with -g)
  vmprof report stacks.vmprof --vm web1 --callers compute_a"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recording_arguments(p)
    p.add_argument("--level", choices=("host", "guest"), default=None,
                   help="host (default without --vm) or guest (default with --vm)")
    p.add_argument("--vcpu", type=int, default=None, metavar="N", help="guest level: one vCPU")
    p.add_argument("--cpu", type=int, default=None, metavar="N", help="host level: one pCPU")
    p.add_argument("-s", "--sort", choices=SORT_KEYS, default="samples", metavar="KEY",
                   help="row order: samples, or grouped by process, pid, module, function (name = function)")
    p.add_argument("--comm", "--comms", action="append", default=[], metavar="NAME",
                   help="only rows of these processes (comma-separated, repeatable; host or guest process names)")
    p.add_argument("--pid", "--pids", action="append", default=[], metavar="PID",
                   help="only rows of these pids (comma-separated, repeatable)")
    p.add_argument("--dso", "--dsos", action="append", default=[], metavar="MODULE",
                   help="only rows of these modules (comma-separated, repeatable: libc.so.6, [kernel.kallsyms])")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-K", "--hide-kernel", action="store_true",
                      help="user-mode samples only, as perf's -K (host and guest kernels hidden)")
    mode.add_argument("-U", "--hide-user", action="store_true",
                      help="kernel-mode samples only, as perf's -U (host and guest user space hidden)")
    p.add_argument("--format", choices=FORMATS, default="table", metavar="FORMAT",
                   help=f"output format: {', '.join(FORMATS)} (docs/formats.md)")
    p.add_argument("--stdio", action="store_true", help="accepted for perf's habit: the table is text already")
    p.add_argument("--width", type=int, default=None, metavar="N",
                   help="lay tables out in N columns (default: COLUMNS, else the terminal's width; to a pipe or "
                        "-o FILE whole names, as perf --stdio)")
    p.add_argument("--percentage", choices=("relative", "absolute"), default="relative",
                   help="with --comm, --pid, --dso, -K or -U: totals, ratios and percentages of the rows kept "
                        "(relative, the default, as perf) or of the whole level (absolute)")
    views = p.add_mutually_exclusive_group()
    views.add_argument("--children", action="store_true",
                       help="call graph (recordings made with -g): per function, samples with it on the stack "
                            "(Children) and as the leaf (Self), as perf report --children")
    views.add_argument("--callers", metavar="FUNCTION", default=None,
                       help="call graph (recordings made with -g): every chain that leads to FUNCTION")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.show import formats

    level = args.level or ("guest" if args.vm else "host")
    if level == "host" and args.vcpu is not None:
        raise Usage("--vcpu applies to the guest level: add --vm NAME")
    if level == "guest" and args.cpu is not None:
        raise Usage("--cpu applies to the host level (a guest's vCPUs: --vcpu N)")
    if args.format == "pprof" and not args.output and sys.stdout.isatty():
        raise Usage("pprof output is binary (gzipped protobuf): write it with -o FILE.pb.gz, or pipe it")
    if (args.children or args.callers) and args.format != "table":
        raise Usage("--children and --callers are tables: leave out --format (flame graphs: --format collapsed)")
    if args.sort != "samples" and args.format not in ORDERED:
        raise Usage(f"--sort applies to {', '.join(ORDERED)}: {args.format} output has no row order")
    if args.limit is not None and args.format in ("pprof", "chrome"):
        raise Usage(f"--limit does not apply to {args.format}: it always holds every row")
    if args.width is not None and args.width < MIN_WIDTH:
        raise Usage(f"--width takes at least {MIN_WIDTH} columns, not {args.width}")
    cols = report_width(args.width, bool(args.output))
    filters = row_filters(args)
    if (args.children or args.callers) and (args.comm or args.pid or args.dso):
        raise Usage("--comm, --pid and --dso select profile rows: --children and --callers show every call path "
                    "(narrow them with --vm, --vcpu, --cpu, -K or -U)")
    if filters and args.format == "chrome":
        raise Usage("--comm, --pid, --dso, -K and -U select profile rows: chrome output is the whole timeline")
    streamable = args.format in ORDERED + FLAT  # made from the profiles alone
    views = bool(args.children or args.callers)
    paths = args.format in FLAT or views  # what is made of stacks or call paths
    an = (streamable and load_streamed(args, level, bool(filters), stacks=paths, call_graph=views)) \
        or (args.format == "chrome" and load_streamed_trace(args, level)) or load_analysis(args)
    check_selection(args, an, level)
    if args.children or args.callers:
        return _call_graph(args, an, level, cols, filters)
    fmt = formats.module(args.format)
    if level == "guest":
        vms = [args.vm] if args.vm else an.vm_names()
        if not vms:
            raise Failure(no_vm(an, args.recording, ": use --level host"))
        if len(vms) > 1 and fmt.ONE_PROFILE:
            raise Failure(f"the guest level of {args.format} output covers one VM: add --vm (one of {', '.join(vms)})")
    profiles = [with_stack_notes(an, p, args.cpu) for p in _profiles(args, an, level, args.format in ORDERED)]
    if filters:
        wholes: list[Profile | None] = [None] * len(profiles)
        if args.percentage == "absolute":  # of the level before the filters: -K/-U left samples out of `an`
            wholes = list(_profiles(args, _whole_level(args, an, level), level, table=True))
        profiles = [filtered(p, filters, w) for p, w in zip(profiles, wholes, strict=True)]
    profiles = [dataclasses.replace(p, rows=p.rows.whole() if isinstance(p.rows, RowTable) else whole_rows(p.rows))
                for p in profiles]
    if note := simulated_note(an.rec.meta):  # vmprof record --lbr=simulate: its times are not measured ones
        profiles = [dataclasses.replace(p, notes=[note, *p.notes]) for p in profiles]
    inp = formats.ReportInput(an, profiles, vm=args.vm, vcpu=args.vcpu, cpu=args.cpu, sort=args.sort,
                              limit=args.limit, cols=cols)
    write_output(args, fmt.render_parts(inp) if hasattr(fmt, "render_parts") else fmt.render(inp))
    return 0


def _whole_level(args: argparse.Namespace, an: Analysis | StreamedAnalysis,
                 level: str) -> Analysis | StreamedAnalysis:
    """The level without -K/-U (--percentage absolute: its totals and ratios): read as `an` was, a piece at a
    time when it was (only its profiles' totals are read: no row's kernel-mode samples)."""
    if not (args.hide_kernel or args.hide_user):
        return an
    whole = argparse.Namespace(**{**vars(args), "hide_kernel": False, "hide_user": False})
    return (isinstance(an, StreamedAnalysis) and load_streamed(whole, level, False)) or load_analysis(whole)


def _call_graph(args: argparse.Namespace, an: Analysis, level: str, cols: int | None, filters: Filters) -> int:
    from vmprof_tui.analyse.callgraph import CallGraph, callers, children
    from vmprof_tui.analyse.stream_callgraph import StreamedCallGraph
    from vmprof_tui.show.callgraph_table import render_callers, render_children

    # read a piece at a time, a recording with call stacks has them summed (StreamedCallGraph); one without is
    # refused before its pieces are read (load_streamed)
    streamed = an if isinstance(an, StreamedCallGraph) else None
    graph = CallGraph(an) if not isinstance(an, StreamedAnalysis) else None
    if not (streamed is not None or (graph is not None and graph.recorded)):
        raise without_call_stacks(args.recording)
    vms = [args.vm] if level == "guest" else [None]
    if level == "guest" and not args.vm:
        vms = an.vm_names()
        if not vms:
            raise Failure(no_vm(an, args.recording, ": use --level host"))
    parts, known = [], []
    for vm in vms:
        profile = an.guest_profile(vm, args.vcpu) if vm else an.host_profile(args.cpu)
        if filters:  # -K/-U: the header's totals are of that mode's samples, as the call graph's
            profile = filtered(profile, filters)
        if streamed is not None:
            ws = streamed.weighted(level, vm, args.vcpu)
        else:
            assert graph is not None  # checked above
            ws = graph.weighted(level, vm, args.vcpu, args.cpu)
        if args.callers and not callers(ws, args.callers):
            known += [r.function for r in children(ws)[:KNOWN_SHOWN]]
            continue
        parts.append(render_callers(profile, ws, args.callers, args.limit, cols) if args.callers
                     else render_children(profile, ws, args.limit, cols))
    if not parts:
        some = ", ".join(dict.fromkeys(known)) or "none"
        raise Failure(f"--callers {args.callers} matches no function on a call path; the most sampled are: {some} "
                      "(vmprof report --children lists them all)")
    write_output(args, "\n".join(parts))
    return 0


def check_selection(args: argparse.Namespace, an: Analysis | StreamedAnalysis, level: str) -> None:
    """--vcpu and --cpu name a vCPU or CPU the recording has: one that matches nothing is an error, with the
    valid values (an empty report would look like an idle one)."""
    if args.vcpu is not None:
        vcpus = {vm: [vcpu for vcpu, _tid in an.vcpu_threads(vm)] for vm in ([args.vm] if args.vm else an.vm_names())}
        if not any(args.vcpu in v for v in vcpus.values()):
            have = "; ".join(f"VM {vm} has vCPUs {_ranges(v) or 'none'}" for vm, v in vcpus.items())
            raise Failure(f"--vcpu {args.vcpu} matches nothing in {args.recording}: {have or 'it has no VM'}")
    if args.cpu is not None and level == "host":
        cpus = int(an.rec.meta.get("cpus") or 0)
        sampled = an.sample_cpus if isinstance(an, StreamedAnalysis) else set(np.unique(an.rec.samples["cpu"]).tolist())
        seen = sorted(set(range(cpus)) | sampled)
        if args.cpu not in seen:
            raise Failure(f"--cpu {args.cpu} matches nothing: {args.recording} has CPUs "
                          f"{_ranges(seen) or 'none'}")


def _ranges(values: list[int]) -> str:
    """0-3, 5: sorted integers as ranges."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in out)


def with_stack_notes(an: Analysis | StreamedAnalysis, profile: Profile, cpu: int | None) -> Profile:
    """The profile with the notes of its call stacks (a recording made with -g): how many were partial,
    truncated or missing, which every format carries as it carries the analysis' notes."""
    if an.rec.stacks is None:
        return profile
    from vmprof_tui.analyse.callgraph import call_graph
    from vmprof_tui.analyse.stream_callgraph import StreamedCallGraph

    if isinstance(an, StreamedAnalysis):
        # load_streamed makes a StreamedCallGraph of every recording with call stacks
        assert isinstance(an, StreamedCallGraph)
        notes = an.stack_notes_of(profile.level, profile.vm, profile.vcpu)  # summed counts: no path is made
    else:
        graph = call_graph(an)
        if not graph.recorded:
            return profile
        notes = graph.weighted(profile.level, profile.vm, profile.vcpu, cpu).notes()
    return dataclasses.replace(profile, notes=[*profile.notes, *notes])


def _values(given: list[str]) -> set[str]:
    return {v.strip() for g in given for v in g.split(",") if v.strip()}


def _of_a_mode(r: Row) -> bool:
    """A row of code of a mode: a function, or at the host a VM's guest code (not the host's idle task)."""
    if r.kind is RowKind.VM:
        return True
    return r.kind in (RowKind.FUNCTION, RowKind.UNKNOWN) and not (r.vm is None and r.pid == 0)


def row_filters(args: argparse.Namespace) -> Filters:
    """(what, test) of --comm, --pid, --dso and -K/-U; a row passes when it passes every one given."""
    out: Filters = []
    for what, given in (("process", args.comm), ("pid", args.pid), ("module", args.dso)):
        values = _values(given)
        if what == "pid" and not all(v.isdigit() for v in values):
            raise Usage(f"--pid takes numbers, not {','.join(sorted(values))}")
        if values:
            out.append((f"{what} {', '.join(sorted(values))}",
                        lambda r, what=what, values=values: str(getattr(r, what)) in values))
    if args.hide_kernel or args.hide_user:  # the samples of the mode (load_analysis keeps only those), which are
        # function rows and, at the host, VM rows: blank time (idle, steal), the host's idle task, KVM's and the
        # VMM's work for a vCPU (a guest's steal) and halt polling are neither mode of what the level profiles
        out.append(("user mode" if args.hide_kernel else "kernel mode", _of_a_mode))
    return out


def _profiles(args: argparse.Namespace, an: Analysis | StreamedAnalysis, level: str,
              table: bool = False) -> list[Profile]:
    """The profiles a report shows: the host's (or one CPU's), or each VM's asked for (or one vCPU's).  table:
    a streamed analysis gives the rows as columns (row_table.RowTable: the formats that write rows)."""
    kw = {"table": True} if table and isinstance(an, StreamedAnalysis) else {}
    if level == "host":
        return [an.host_profile(args.cpu, **kw)]
    return [an.guest_profile(vm, args.vcpu, **kw) for vm in ([args.vm] if args.vm else an.vm_names())]


def filtered(profile: Profile, filters: Filters, whole: Profile | None = None) -> Profile:
    """The profile with only the rows that pass.  Its totals, ratios and percentages are of the rows kept (perf's
    default, --percentage relative), or, given `whole` (the level without the filters), of the whole level
    (--percentage absolute); the header says which.  Rows as columns (RowTable) are filtered as columns."""
    table = isinstance(profile.rows, RowTable)
    tests = [test for _what, test in filters]
    rows = profile.rows.passing(tests) if table else [r for r in profile.rows if all(t(r) for t in tests)]
    what = "rows only of " + "; ".join(what for what, _test in filters)
    if whole is not None:
        return dataclasses.replace(profile, rows=rows, total_samples=whole.total_samples, ratios=whole.ratios,
                                   unresolved_samples=whole.unresolved_samples, virtual_samples=whole.virtual_samples,
                                   notes=[*profile.notes, f"{what}: totals, ratios and percentages are of the whole "
                                                          "level (--percentage absolute)"])
    if isinstance(rows, RowTable):
        unresolved, total, ratios = rows.unresolved(), rows.total(), rows.ratios(profile.level)
    else:
        unresolved = sum(r.samples for r in rows if r.kind is RowKind.UNKNOWN)
        total, ratios = sum(r.samples for r in rows), row_ratios(profile.level, rows)
    return dataclasses.replace(profile, rows=rows, total_samples=total, ratios=ratios,
                               unresolved_samples=int(round(unresolved)),
                               virtual_samples=None,
                               notes=[*profile.notes, f"{what}: totals, ratios and percentages are of these rows "
                                                      "(--percentage absolute: of the whole level)"])
