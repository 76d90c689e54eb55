"""The `vmprof-guest` command.  Exit codes: 0 success, 1 runtime failure, 2 bad usage.

Runs inside a Linux guest, never while the host measures anything the agent itself
would disturb: `bundle` takes one snapshot; `watch` only listens for process events.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence

from vmprof_guest import __version__, cr3, procfs
from vmprof_guest.assemble import Builder, Options
from vmprof_guest.writer import OutputError, Writer, open_writer

EXAMPLES = """examples:
  vmprof-guest bundle -o /mnt/share/guest1            a bundle folder (e.g. on a virtiofs share)
  vmprof-guest bundle -o /tmp/guest1.tar               a tar file
  vmprof-guest bundle -o - > guest1.tar                a tar stream on stdout (what qemu-ga runs)
  vmprof-guest watch --until /run/vmprof.stop -o /tmp/g.tar   record processes until the file appears
  vmprof-guest watch --until 30 -o -                   ... for 30 seconds
  vmprof-guest cr3                                     which CR3 method works on this kernel, or what is missing
"""


def _log(args: argparse.Namespace, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(f"vmprof-guest: {msg}", file=sys.stderr, flush=True)


def _options(args: argparse.Namespace) -> Options:
    known: set[str] = set()
    if args.known_build_ids:
        try:
            with open(args.known_build_ids) as f:
                known = {line.strip().lower() for line in f if line.strip()}
        except OSError as e:
            raise OutputError(f"cannot read {args.known_build_ids}: {e.strerror}") from None
    return Options(vm=args.vm or socket.gethostname(), copy_objects=not args.no_objects,
                   known_build_ids=frozenset(known), max_object_bytes=int(args.max_object_mb * (1 << 20)),
                   max_total_bytes=int(args.max_total_mb * (1 << 20)))


def _kallsyms(builder: Builder) -> bytes | None:
    try:
        data, real = procfs.read_kallsyms()
    except OSError as e:
        builder.note(f"/proc/kallsyms unreadable ({e.strerror}); guest kernel samples stay unresolved")
        return None
    if not real:
        builder.note("/proc/kallsyms shows zero addresses (kptr_restrict): run as root; kernel samples stay raw")
        return None
    return data


def _cr3_summary(res: cr3.Cr3Result, with_cr3: int, total: int) -> str:
    if res.page_offset_base is None:
        return f"CR3 unavailable: {res.missing}"
    return (f"CR3 via {res.method} + {res.direct_map} (page_offset_base {res.page_offset_base:#x}"
            f"{', PTI pairs' if res.pti else ''}): {with_cr3} of {total} user processes")


def _write(args: argparse.Namespace, builder: Builder, writer: Writer, res: cr3.Cr3Result,
           kallsyms: bytes | None) -> int:
    try:
        stats = builder.write(writer, res, kallsyms)
    except OSError as e:
        writer.abort()
        raise OutputError(f"writing the bundle failed: {e.strerror or e}") from None
    users = [p for p in builder.processes if not p["kernel_thread"]]
    with_cr3 = sum(1 for p in users if p["cr3"])
    where = "stdout" if args.output == "-" else args.output
    _log(args, f"wrote {where}: {stats['processes']} processes, {stats['objects']} object files, "
               f"kallsyms {'yes' if kallsyms else 'no'}; {_cr3_summary(res, with_cr3, len(users))}")
    for note in builder.notes if args.verbose else []:
        _log(args, f"note: {note}")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    builder = Builder(_options(args))
    writer = open_writer(args.output)
    try:
        kallsyms = _kallsyms(builder)
        res = cr3.collect(use_bpf=not args.no_bpf, sched_window_s=args.sched_window, kallsyms=kallsyms,
                          pgd_methods=tuple(args.pgd_method or cr3.PGD_METHODS))
        me = os.getpid()
        for info in procfs.snapshot(with_maps=True):
            if info.pid == me:
                continue
            builder.add_process(info, [] if info.kernel_thread else res.roots(info.pid, info.name))
    except BaseException:
        builder.discard()
        writer.abort()
        raise
    return _write(args, builder, writer, res, kallsyms)


def cmd_watch(args: argparse.Namespace) -> int:
    from vmprof_guest.watch import Stop, Watcher

    try:
        stop = Stop.parse(args.until)
    except ValueError as e:
        print(f"vmprof-guest: {e}", file=sys.stderr)
        return 2
    builder = Builder(_options(args))
    writer = open_writer(args.output)
    kallsyms = _kallsyms(builder)
    watcher = Watcher(builder, stop, use_bpf=not args.no_bpf, events=args.events,
                      log=lambda msg: _log(args, msg), pgd_methods=tuple(args.pgd_method or cr3.PGD_METHODS),
                      sched_window_s=args.sched_window, kallsyms=kallsyms)
    try:
        res = watcher.run()
        watcher.finish()
    except BaseException:
        builder.discard()
        writer.abort()
        raise
    finally:
        watcher.close()
    exited = sum(1 for p in builder.processes if p.get("exited"))
    _log(args, f"watch ended: {len(builder.processes)} process records, {exited} of them ended during the watch")
    return _write(args, builder, writer, res, kallsyms)


def cmd_cr3(args: argparse.Namespace) -> int:
    res = cr3.collect(use_bpf=not args.no_bpf, sched_window_s=args.sched_window,
                      pgd_methods=tuple(args.pgd_method or cr3.PGD_METHODS))
    me = os.getpid()
    rows = []
    for info in procfs.snapshot(with_maps=False):
        if info.kernel_thread or info.pid == me:
            continue
        pgd = res.pgds.get(info.pid, (None, ""))[0]
        rows.append({"pid": info.pid, "name": info.name, "pgd": pgd, "cr3": res.roots(info.pid, info.name)})
    if args.json:
        print(json.dumps({**res.detail(), "processes": rows}, indent=1))
        return 0
    for t in res.tried:
        print(f"{t['method']:14} {t['result']}")
    if res.page_offset_base is None:
        print(f"CR3: unavailable; missing: {res.missing}")
        return 0
    print(f"CR3: {res.method} + {res.direct_map}; page_offset_base {res.page_offset_base:#x}; PTI {res.pti}")
    for r in rows:
        roots = " ".join(f"{v:#x}" for v in r["cr3"]) or "-"
        print(f"  {r['pid']:>7} {r['name'][:20]:20} {roots}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vmprof-guest", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Gather, inside a Linux guest, what the vmprof host needs to name guest samples "
                    "(processes, CR3 values, memory maps, object files, kernel symbols).")
    parser.add_argument("--version", action="version", version=f"vmprof-guest {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(p: argparse.ArgumentParser, output: bool = True) -> None:
        if output:
            p.add_argument("-o", "--output", required=True, metavar="PATH|-",
                           help="a new folder, a new .tar file, or - for a tar stream on stdout")
            p.add_argument("--vm", metavar="NAME", help="the VM's name for the host (default: the hostname)")
            p.add_argument("--no-objects", action="store_true", help="copy no object files (only name them)")
            p.add_argument("--known-build-ids", metavar="FILE",
                           help="build ids (hex, one a line) the host already has: those files are not copied")
            p.add_argument("--max-object-mb", type=float, default=256, metavar="MB",
                           help="do not copy object files larger than this (default 256)")
            p.add_argument("--max-total-mb", type=float, default=2048, metavar="MB",
                           help="stop copying object files beyond this total (default 2048)")
            p.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
            p.add_argument("-v", "--verbose", action="store_true", help="also print the bundle's notes")
        p.add_argument("--no-bpf", action="store_true", help="do not use BPF (then no CR3 values)")
        p.add_argument("--pgd-method", action="append", choices=cr3.PGD_METHODS, metavar="METHOD",
                       help="mm->pgd methods to try, in order (repeatable; default: " + ", ".join(cr3.PGD_METHODS)
                            + ")")
        p.add_argument("--sched-window", type=float, default=0.5, metavar="S",
                       help="how long the bpf-sched method watches context switches (default 0.5)")

    p = sub.add_parser("bundle", help="write a bundle of this guest now", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.set_defaults(func=cmd_bundle)
    p = sub.add_parser("watch", help="record processes (also those that exit) until FILE exists or SECONDS pass",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--until", required=True, metavar="FILE|SECONDS",
                   help="stop when this file exists, or after this many seconds (also on SIGINT/SIGTERM)")
    p.add_argument("--events", choices=("auto", "bpf", "proc-connector", "poll"), default="auto",
                   help="where process events come from (default: the best available)")
    common(p)
    p.set_defaults(func=cmd_watch)
    p = sub.add_parser("cr3", help="show which CR3 method works here (or what is missing) and the values")
    p.add_argument("--json", action="store_true")
    common(p, output=False)
    p.set_defaults(func=cmd_cr3)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except OutputError as e:
        print(f"vmprof-guest: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"vmprof-guest: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
