"""The `vmprof` command line: one module per command, each with HELP, EXAMPLES, add_arguments(p), run(args).

Exit codes: 0 success, 1 runtime failure (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

from vmprof_tui import __version__
from vmprof_tui.cli.common import Failure, Usage, fail

# One-shot analyses: millions of objects (rows, cells) and no cycles worth collecting, and the collector's passes
# over them are seconds of a large report (docs/performance.md).  Long-running commands (top, agent) keep it.
WITHOUT_GC = ("report", "steal")
COMMANDS = ("record", "report", "top", "steal", "blocks", "agent", "analyze", "history", "diff", "model", "predict",
            "guest", "doctor", "demo")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Examples as written, and every option's default after its help (none for flags and unset options)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """A bad option value is one line (what is wrong with which option), not the usage before it; an unknown
    option or a missing one still shows the command's usage."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):
            self.exit(2, f"{self.prog}: {message}\n")
        super().error(message)


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's parser (its usage is what a wrong option prints); with `only`,
    that command's alone: importing every command would slow every run."""
    parser = Parser(
        prog="vmprof", description="Profile a whole KVM host (host, VMMs, every guest) from the host alone.")
    parser.add_argument("--version", action="version", version=f"vmprof {__version__}")
    # not dest "command": a command's own positional of that name (record's COMMAND) would overwrite it
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    commands = {}
    for name in (only,) if only else COMMANDS:
        command = importlib.import_module(f"{__name__}.{name}")
        p = sub.add_parser(name, help=command.HELP, description=command.HELP, epilog=command.EXAMPLES,
                           formatter_class=HelpFormatter)
        p.set_defaults(func=command.run)
        command.add_arguments(p)
        commands[name] = p
    return parser, commands


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:  # without the parsers, which import every command
        print(f"vmprof {__version__}")
        return 0
    parser, commands = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would print the top-level usage; the command's own is the useful one
        command = commands[args.command_name] if args.command_name else parser
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _gc_paused() if args.command_name in WITHOUT_GC else contextlib.nullcontext():
            return args.func(args)
    except Failure as e:
        return fail(str(e))
    except Usage as e:
        print(f"vmprof {args.command_name}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`vmprof report REC | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
