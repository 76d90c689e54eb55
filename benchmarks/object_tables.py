"""What storing host objects' symbol tables costs `vmprof agent`, per object, and what reading them back
costs the analysis node, side by side with reading the ELF file itself.

    .venv/bin/python benchmarks/object_tables.py [PID | OBJECT...]   (default: this Python process's objects)

Per executable mapping with a build id: symbols, the agent's CPU to read and encode the table
(`read_object_table` and gzip, on the writer thread once per build id), the gzipped bytes in the spool, and the
analysis node's CPU to decode it vs to parse the ELF file (ratio; without resolve/cache.py).
"""

from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path

from vmprof_tui.collect.session import build_id, read_object_table
from vmprof_tui.resolve.elf import read_elf_symbols_uncached
from vmprof_tui.resolve.object_table import decode_object_table


def cpu(fn, *args):  # noqa: ANN001, ANN202 - a timing helper
    t = time.thread_time()
    out = fn(*args)
    return out, time.thread_time() - t


def main() -> None:
    args = sys.argv[1:]
    if args and not args[0].isdigit():
        paths = args
    else:
        maps_text = Path(f"/proc/{args[0] if args else 'self'}/maps").read_text()
        maps = [line.split(maxsplit=5) for line in maps_text.splitlines()]
        paths = sorted({m[5] for m in maps if len(m) == 6 and "x" in m[1] and m[5].startswith("/")})
    print(f"{'object':<36} {'symbols':>8} {'agent ms':>9} {'spool KiB':>9} {'decode ms':>9} {'ELF ms':>7} {'ratio':>6}")
    totals = [0, 0.0, 0, 0.0, 0.0]
    for path in paths:
        bid = build_id(path)
        if not bid:
            continue
        table, agent_s = cpu(read_object_table, path, bid)
        if table is None:
            continue
        gz, gzip_s = cpu(gzip.compress, table, 6)  # as Spool.store_object writes it
        agent_s, stored = agent_s + gzip_s, len(gz)
        sym, decode_s = cpu(decode_object_table, table, bid)
        _, elf_s = cpu(read_elf_symbols_uncached, Path(path))
        print(f"{Path(path).name[:36]:<36} {len(sym):>8} {agent_s * 1e3:>9.1f} {stored / 1024:>9.1f} "
              f"{decode_s * 1e3:>9.1f} {elf_s * 1e3:>7.1f} {decode_s / max(elf_s, 1e-9):>6.2f}")
        for i, v in enumerate((len(sym), agent_s, stored, decode_s, elf_s)):
            totals[i] += v
    n, agent_s, stored, decode_s, elf_s = totals
    print(f"{'total':<36} {n:>8} {agent_s * 1e3:>9.1f} {stored / 1024:>9.1f} {decode_s * 1e3:>9.1f} "
          f"{elf_s * 1e3:>7.1f} {decode_s / max(elf_s, 1e-9):>6.2f}")


if __name__ == "__main__":
    main()
