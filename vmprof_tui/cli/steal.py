"""`vmprof steal`: steal and idle per VM and vCPU, who stole, and corrected execution times."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator

from vmprof_tui.cli.common import (
    Failure,
    add_recording_arguments,
    load_analysis,
    load_streamed_steal,
    no_vm,
    write_output,
)

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

    streamed = load_streamed_steal(args)  # a large recording: its samples a piece at a time
    an = streamed or load_analysis(args)
    vms = [args.vm] if args.vm else an.vm_names()
    if not vms:
        raise Failure(no_vm(an, args.recording, ", so there is no steal to show"))
    # one VM's report at a time, written as it is made: 20 VMs of a 64-CPU host have 750,000 function rows
    reports = (streamed.steal_report(vm) if streamed else steal_report(an, vm) for vm in vms)
    if args.format == "json":
        write_output(args, _json(reports, len(vms) > 1))
    else:
        write_output(args, (("\n" if i else "") + steal_table.render(r, args.limit) for i, r in enumerate(reports)))
    return 0


def _json(reports: Iterator[dict], many: bool) -> Iterator[str]:
    """json.dumps(reports if many else the one, indent=1) and a newline, a report at a time, each encoded a part at
    a time (a VM of the 64-CPU host has 60,000 function rows: its text and the encoder's pieces of it at once were
    most of the command's peak memory)."""
    if not many:
        yield from _blocks(_encode(next(reports)))
        yield "\n"
        return
    for i, r in enumerate(reports):  # an element of a list: its lines one level in
        yield ("," if i else "[") + "\n "
        yield from _blocks(part.replace("\n", "\n ") for part in _encode(r))
    yield "\n]\n"


def _encode(report: dict) -> Iterator[str]:
    """json.dumps(report, indent=1) in the encoder's parts (a newline is never inside a string's text)."""
    return json.JSONEncoder(indent=1).iterencode(report)


def _blocks(parts: Iterable[str], size: int = 1 << 16) -> Iterator[str]:
    """The parts joined into blocks of about `size` characters."""
    held: list[str] = []
    n = 0
    for part in parts:
        held.append(part)
        n += len(part)
        if n >= size:
            yield "".join(held)
            held, n = [], 0
    if held:
        yield "".join(held)
