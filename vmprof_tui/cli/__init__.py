"""The `vmprof` command line: one module per command, each with HELP, EXAMPLES, add_arguments(p), run(args).

Exit codes: 0 success, 1 runtime failure (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from vmprof_tui import __version__
from vmprof_tui.cli.common import Failure, fail

COMMANDS = ("record", "report", "top", "steal", "blocks", "guest", "doctor", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vmprof", description="Profile a whole KVM host (host, VMMs, every guest) from the host alone.")
    parser.add_argument("--version", action="version", version=f"vmprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        command = importlib.import_module(f"{__name__}.{name}")
        p = sub.add_parser(name, help=command.HELP, description=command.HELP, epilog=command.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=command.run)
        command.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except Failure as e:
        return fail(str(e))
    except BrokenPipeError:  # the reader went away (`vmprof report REC | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
