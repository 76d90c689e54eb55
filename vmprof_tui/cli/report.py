"""`vmprof report`: the papers' profile tables of a recording, at host or guest level, in any format."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from vmprof_tui.cli.common import Failure, Usage, add_recording_arguments, load_analysis, write_output
from vmprof_tui.resolve.lbr_recording import simulated_note
from vmprof_tui.show.formats import FORMATS
from vmprof_tui.show.formats.table import SORT_KEYS

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis, Profile, Row

ORDERED = ("table", "json", "csv")  # the formats whose rows --sort orders

HELP = "profile tables of a recording, at host or guest level"
EXAMPLES = """examples:
  vmprof report                       host level of ./vmprof.data
  vmprof report run.vmprof --vm web1  guest level of VM web1: processes,
                                      functions, steal, idle
  vmprof report -i run.vmprof --vm web1 --vcpu 0 --format json
  vmprof report run.vmprof --cpu 1    host level, one pCPU only
  vmprof report --comm qemu-system-x86 --dso '[kernel.kallsyms]' --sort pid
  vmprof report run.vmprof -K         user-mode samples only (as perf)
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
    filters = row_filters(args)
    if filters and args.format == "chrome":
        raise Usage("--comm, --pid, --dso, -K and -U select profile rows: chrome output is the whole timeline")
    an = load_analysis(args)
    if args.children or args.callers:
        return _call_graph(args, an, level)
    fmt = formats.module(args.format)
    if level == "guest":
        vms = [args.vm] if args.vm else an.vm_names()
        if not vms:
            raise Failure(f"{args.recording} has no VM: use --level host")
        if len(vms) > 1 and fmt.ONE_PROFILE:
            raise Failure(f"the guest level of {args.format} output covers one VM: add --vm (one of {', '.join(vms)})")
        profiles = [an.guest_profile(vm, args.vcpu) for vm in vms]
    else:
        profiles = [an.host_profile(args.cpu)]
    if filters:
        profiles = [filtered(p, filters) for p in profiles]
    if note := simulated_note(an.rec.meta):  # vmprof record --lbr=simulate: its times are not measured ones
        profiles = [dataclasses.replace(p, notes=[note, *p.notes]) for p in profiles]
    inp = formats.ReportInput(an, profiles, vm=args.vm, vcpu=args.vcpu, cpu=args.cpu, sort=args.sort,
                              limit=args.limit)
    write_output(args, fmt.render(inp))
    return 0


def _call_graph(args: argparse.Namespace, an: Analysis, level: str) -> int:
    from vmprof_tui.analyse.callgraph import CallGraph
    from vmprof_tui.show.callgraph_table import render_callers, render_children

    graph = CallGraph(an)
    if not graph.recorded:
        raise Failure(f"{args.recording} was recorded without call stacks: record with vmprof record -g")
    vms = [args.vm] if level == "guest" else [None]
    if level == "guest" and not args.vm:
        vms = an.vm_names()
        if not vms:
            raise Failure(f"{args.recording} has no VM: use --level host")
    parts = []
    for vm in vms:
        profile = an.guest_profile(vm, args.vcpu) if vm else an.host_profile(args.cpu)
        ws = graph.weighted(level, vm, args.vcpu, args.cpu)
        parts.append(render_callers(profile, ws, args.callers, args.limit) if args.callers
                     else render_children(profile, ws, args.limit))
    write_output(args, "\n".join(parts))
    return 0


def _values(given: list[str]) -> set[str]:
    return {v.strip() for g in given for v in g.split(",") if v.strip()}


def row_filters(args: argparse.Namespace) -> list[tuple[str, Callable[[Row], bool]]]:
    """(what, test) of --comm, --pid, --dso and -K/-U; a row passes when it passes every one given."""
    out: list[tuple[str, Callable[[Row], bool]]] = []
    for what, given in (("process", args.comm), ("pid", args.pid), ("module", args.dso)):
        values = _values(given)
        if what == "pid" and not all(v.isdigit() for v in values):
            raise Usage(f"--pid takes numbers, not {','.join(sorted(values))}")
        if values:
            out.append((f"{what} {', '.join(sorted(values))}",
                        lambda r, what=what, values=values: str(getattr(r, what)) in values))
    if args.hide_kernel or args.hide_user:  # idle and steal are neither mode's code
        out.append(("user mode" if args.hide_kernel else "kernel mode", lambda r: not r.kind.is_virtual))
    return out


def filtered(profile: Profile, filters: list[tuple[str, Callable[[Row], bool]]]) -> Profile:
    """The profile with only the rows that pass (totals and ratios stay those of the whole level, as perf's
    default absolute percentages)."""
    rows = [r for r in profile.rows if all(test(r) for _what, test in filters)]
    note = "rows only of " + "; ".join(what for what, _test in filters)
    return dataclasses.replace(profile, rows=rows, notes=[*profile.notes, note])
