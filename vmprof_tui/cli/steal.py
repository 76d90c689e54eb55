"""`vmprof steal`: steal and idle per VM and vCPU, who stole, and corrected execution times."""

from __future__ import annotations

import argparse
import json

from vmprof_tui.cli.common import Failure, add_recording_arguments, load_analysis, no_vm, write_output

HELP = "steal and idle per VM and vCPU, who stole, and corrected execution times"
EXAMPLES = """examples:
  vmprof steal run.vmprof     every VM: steal type 1/2, idle, who stole,
                              corrected times
  vmprof steal run.vmprof --vm web1 --format json"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recording_arguments(p)
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    from vmprof_tui.analyse.steal import steal_report
    from vmprof_tui.show import steal_table

    an = load_analysis(args)
    vms = [args.vm] if args.vm else an.vm_names()
    if not vms:
        raise Failure(no_vm(an, args.recording, ", so there is no steal to show"))
    reports = [steal_report(an, vm) for vm in vms]
    if args.format == "json":
        write_output(args, json.dumps(reports if len(reports) > 1 else reports[0], indent=1) + "\n")
    else:
        write_output(args, "\n".join(steal_table.render(r, args.limit) for r in reports))
    return 0
