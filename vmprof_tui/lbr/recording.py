"""LBR samples stored in a vmprof recording (`vmprof record --lbr`), named through the recording's
snapshot of each process's memory maps: the same symbol sources as `vmprof report`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vmprof_tui.lbr.model import LbrSample, Resolve, ResolvedAddr
from vmprof_tui.lbr.records import to_samples
from vmprof_tui.record.recording import Recording, RecordingError, load
from vmprof_tui.resolve.spaces import ObjectCache, parse_proc_maps


def process_resolver(maps_text: str, objects: ObjectCache) -> Resolve:
    maps = parse_proc_maps(maps_text)
    cache: dict[int, ResolvedAddr | None] = {}

    def resolve(addr: int) -> ResolvedAddr | None:
        if addr in cache:
            return cache[addr]
        found = None
        for m in maps:
            if m.start <= addr < m.end and m.object_path is not None:
                syms = objects.get(m.object_path)
                if syms is None:
                    break
                vaddr = int(syms.link_addrs(m, np.array([addr], np.uint64))[0])
                idx = int(syms.lookup(np.array([vaddr], np.uint64))[0])
                if idx >= 0:
                    found = ResolvedAddr(str(m.object_path), vaddr, str(syms.names[idx]), int(syms.starts[idx]),
                                         int(syms.ends[idx]))
                break
        cache[addr] = found
        return found

    return resolve


def simulated_note(meta: dict) -> str | None:
    """The line every output of a simulated recording carries (`vmprof record --lbr=simulate`), else None."""
    lbr = meta.get("lbr") if isinstance(meta, dict) else None
    if not isinstance(lbr, dict) or not lbr.get("simulated"):
        return None
    argv = [str(c) for c in lbr.get("command") or []]
    command = " ".join([Path(argv[0]).name, *argv[1:]])[:120] if argv else ""
    return (f"SIMULATED LBR (no PMU): {command or 'the command'} single-stepped, "
            f"{int(lbr.get('instructions') or 0):,} instructions; cycles from a synthetic cost model, "
            f"sampled every {int(lbr.get('period_cycles') or 0):,} cycles"
            + (f"; stopped at {lbr['stopped']}" if lbr.get("stopped") else ""))


def samples_of_recording(path: str | Recording, vm: str | None = None, process: str | None = None
                         ) -> tuple[list[LbrSample], Resolve, Callable[[int], Resolve | None], None]:
    """(samples, resolve, resolve_pid, read_code) for analyse.blocks.analyse, from a recording or its path
    (RecordingError when it cannot be read or has no branch records)."""
    rec: Recording = path if isinstance(path, Recording) else load(Path(path))
    if rec.lbr is None or not len(rec.lbr):
        raise RecordingError(f"{rec.path} has no branch records: record with `vmprof record --lbr` on a host with "
                          "LBR (or --lbr=simulate -- CMD anywhere), or use `perf record -b` there and --perf-script")
    snaps = rec.processes()
    samples = to_samples(rec.lbr, {pid: snap["comm"] for pid, snap in snaps.items()})
    objects = ObjectCache()
    resolvers: dict[int, Resolve | None] = {}

    def resolve_pid(pid: int) -> Resolve | None:
        if pid not in resolvers:
            snap = snaps.get(pid)
            resolvers[pid] = process_resolver(snap["maps"], objects) if snap else None
        return resolvers[pid]

    return samples, (lambda _addr: None), resolve_pid, None
