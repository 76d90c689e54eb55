"""`vmprof guest fetch`: collect a guest bundle from a libvirt VM through the QEMU guest agent."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vmprof_tui.cli.common import seconds
from vmprof_tui.collect.guest_fetch import FetchError, fetch_bundle
from vmprof_tui.resolve.bundle import GuestBundle

HELP = "guest bundles: collect one from a libvirt VM through the QEMU guest agent"


FETCH_EXAMPLES = """examples:
  vmprof guest fetch --vm web1     bundle of libvirt domain web1 as
                                   ./guests/web1.tar
  vmprof guest fetch --vm web1 -o rec1/guests   next to a recording
  vmprof guest fetch --vm web1 --connect qemu:///system \\
                     --guest-command "python3 -m vmprof_guest"
"""


def _fetch_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `vmprof guest fetch`."""
    p.add_argument("--vm", required=True, metavar="NAME", help="libvirt domain name (see: virsh list)")
    p.add_argument("-o", "--output", default="guests", metavar="DIR",
                   help="folder for <NAME>.tar (default: ./guests)")
    p.add_argument("--connect", "-c", metavar="URI", help="libvirt URI (virsh -c), e.g. qemu:///system")
    p.add_argument("--guest-command", default="vmprof-guest", metavar="CMD",
                   help="how to run the agent in the guest (default: vmprof-guest)")
    p.add_argument("--timeout", type=seconds, default=300, metavar="S", help="give up after S seconds (default 300)")
    p.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for vmprof-guest bundle, repeatable (e.g. --agent-arg=--no-objects)")


def _fetch(args: argparse.Namespace) -> int:
    summary: list[str] = []

    def describe(bundle: GuestBundle) -> None:
        with_cr3 = sum(1 for p in bundle.processes if p.cr3)
        summary.append(f"VM {bundle.vm}, {len(bundle.processes)} processes ({with_cr3} with CR3, method "
                       f"{bundle.cr3_method}), "
                       f"{'kallsyms' if bundle.kernel and bundle.kernel.symbols else 'no kallsyms'}")

    try:
        path = fetch_bundle(args.vm, Path(args.output), connect=args.connect,
                            guest_command=args.guest_command.split(), extra_args=args.agent_arg,
                            timeout_s=args.timeout, on_loaded=describe,
                            log=lambda msg: print(f"vmprof guest fetch: {msg}", file=sys.stderr, flush=True))
    except FetchError as e:
        print(f"vmprof: {e}", file=sys.stderr)
        return 1
    print(f"{path}: {summary[0]}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="guest_command_name", metavar="SUBCOMMAND")
    f = sub.add_parser("fetch", help="collect a guest bundle through libvirt and the QEMU guest agent",
                       description="Collect a guest bundle through libvirt and the QEMU guest agent (no SSH).",
                       epilog=FETCH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _fetch_arguments(f)
    f.set_defaults(func=_fetch)


def run(args: argparse.Namespace) -> int:
    print("usage: vmprof guest fetch --vm NAME [-o DIR]", file=sys.stderr)
    return 2


EXAMPLES = FETCH_EXAMPLES
