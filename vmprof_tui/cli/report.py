"""`vmprof report`: the papers' profile tables of a recording, at host or guest level, in any format."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vmprof_tui.cli.common import Failure, Usage, add_recording_arguments, load_analysis, write_output
from vmprof_tui.show.formats import FORMATS

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis

HELP = "profile tables of a recording, at host or guest level"
EXAMPLES = """examples:
  vmprof report                       host level of ./vmprof.data
  vmprof report run.vmprof --vm web1  guest level of VM web1: processes,
                                      functions, steal, idle
  vmprof report -i run.vmprof --vm web1 --vcpu 0 --format json
  vmprof report run.vmprof --cpu 1    host level, one pCPU only
  vmprof report run.vmprof --vm web1 --format collapsed > web1.folded
  vmprof report run.vmprof --vm web1 --guest-bundle web1=/srv/web1.tar
  vmprof report run.vmprof --vm web1 --format pprof -o web1.pb.gz
  vmprof report run.vmprof --format chrome -o run.json   (ui.perfetto.dev)
  vmprof report run.vmprof --time-range 10:20   seconds 10 to 20 only
  vmprof report stacks.vmprof --vm web1 --children   (recorded with -g)
  vmprof report stacks.vmprof --vm web1 --callers compute_a"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recording_arguments(p)
    p.add_argument("--level", choices=("host", "guest"), default=None,
                   help="host (default without --vm) or guest (default with --vm)")
    p.add_argument("--vcpu", type=int, default=None, metavar="N", help="guest level: one vCPU")
    p.add_argument("--cpu", type=int, default=None, metavar="N", help="host level: one pCPU")
    p.add_argument("--sort", choices=("samples", "name"), default="samples", help="row order")
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
