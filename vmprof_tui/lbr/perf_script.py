"""Import of `perf record -b` data through `perf script` text, so hosts with a PMU can use
the block analysis today.

Record and convert on the PMU host (call/return filter, user mode, counters grouped
so that every sample carries both counts)::

    perf record -e '{cycles,instructions}:Su' -j any_call,any_ret,u -c 1000003 -- ./prog
    perf script -F comm,pid,tid,cpu,time,period,event,ip,sym,dso,brstack --show-mmap-events > prog.txt

(``-b`` / ``-j any,u`` records every branch: exact blocks; add ``-F +brstackinsn`` for
perf's own per-block listing, which stands in for object files that are not at hand.)
With ``:S`` perf reads the whole group at each sample of the leader and prints one line
per member, each with its count since the previous sample as the period: the cycles and
instructions lines of one sample share pid/tid/cpu/time and are merged into one
:class:`~vmprof_tui.lbr.model.LbrSample`.

``brstack`` entries are ``FROM/TO/EVENT/INTX/ABORT/CYCLES[/TYPE[/SPEC]]``, newest first
(perf-script(1)); older perf versions print only the first six fields.  Entries whose
EVENT contains ``N`` (not taken, ARM SPE/BRBE) delimit no block and are skipped.
The format here follows perf's documentation and builtin-script.c; no PMU host was
available to produce the test fixtures, which were written by hand to that format.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.lbr.model import BranchFilter, Fields, LbrSample, Resolve, ResolvedAddr
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE
from vmprof_tui.record.recording import VMS_KEY, Recording, snapshot
from vmprof_tui.resolve.elfcode import ElfError, ElfResolver, ImageCache

_HEADER = re.compile(
    r"^\s*(?P<comm>\S.*?)\s+(?P<pid>-?\d+)(?:/(?P<tid>-?\d+))?\s+(?:\[(?P<cpu>\d+)\]\s+)?"
    r"(?P<time>\d+\.\d+):\s+(?:(?P<period>\d+)\s+)?(?P<event>\S+?):\s+(?P<rest>.*)$")
_BR = re.compile(r"(?<!\S)(0x[0-9a-fA-F]+)/(0x[0-9a-fA-F]+)/([^\s/]*)/([^\s/]*)/([^\s/]*)/(\d+|-)(?:/([^\s/]*))?"
                 r"(?:/([^\s/]*))?(?!\S)")
_IP_SYM = re.compile(r"^\s*(?P<ip>[0-9a-fA-F]+)\s+(?P<sym>.*?)(?:\+0x(?P<off>[0-9a-fA-F]+))?\s+\((?P<dso>[^)]*)\)")
_MMAP = re.compile(
    r"PERF_RECORD_MMAP2?\s+(?P<pid>-?\d+)/(?P<tid>-?\d+):\s+\[(?P<start>0x[0-9a-fA-F]+)\((?P<len>0x[0-9a-fA-F]+)\)"
    r"\s+@\s+(?P<pgoff>0x[0-9a-fA-F]+|\d+)[^\]]*\]:\s+(?P<prot>\S+)\s+(?P<path>.+?)\s*$")
_INSN = re.compile(r"^\t(?P<addr>[0-9a-fA-F]{6,16})\t(?P<text>.*)$")
_SYMLINE = re.compile(r"^\t(?P<sym>[^\t]+?)(?:[+-]\d+)?:\s*(?:\t.*)?$")
_JUMP_CYCLES = re.compile(r"#.*?(?P<cyc>\d+) cycles \[\d+\]")


class PerfScriptError(ValueError):
    """perf script text that cannot be used (one line saying what and how to fix it)."""


@dataclass
class PerfMmap:
    pid: int
    start: int
    length: int
    pgoff: int
    path: str


@dataclass
class PerfScriptData:
    samples: list[LbrSample]
    mmaps: list[PerfMmap] = field(default_factory=list)
    # (pid, dso path) -> (ip, symbol, offset) seen on sample lines, to place objects without mmap events
    anchors: dict[tuple[int, str], tuple[int, str, int]] = field(default_factory=dict)
    lines: int = 0
    skipped_not_taken: int = 0
    without_branches: int = 0  # samples with no branch entry (not recorded with -b / -j)
    events: dict[str, int] = field(default_factory=dict)


@dataclass
class _Pending:
    key: tuple[int, int, int, str]
    comm: str
    ip: int
    entries: list[tuple[int, int, int, str]]  # newest first: from, to, cycles, type
    cycles: int | None = None
    instructions: int | None = None
    insn_lines: list[tuple[int, bool, str]] = field(default_factory=list)  # addr, is_jump, symbol
    has_listing: bool = False
    listing_frozen: bool = False  # a later line of the same sample (group member) repeats the listing


def _time_ns(text: str) -> int:
    sec, _, frac = text.partition(".")
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])


def _listing_blocks(lines: list[tuple[int, bool, str]]) -> dict[tuple[int, int], tuple[int, str]]:
    """perf's brstackinsn listing -> {(block start, block end): (instructions, function)}.

    perf prints the oldest entry's source alone, then each block from the previous target
    to the next source (that line marked with '#'), then the unfinished block up to the
    sample, which is not a complete block and is ignored."""
    out: dict[tuple[int, int], tuple[int, str]] = {}
    cur: list[tuple[int, str]] = []
    first_jump = True
    for addr, is_jump, sym in lines:
        if not is_jump:
            cur.append((addr, sym))
            continue
        if first_jump and not cur:
            first_jump = False
            continue
        first_jump = False
        start, fn = cur[0] if cur else (addr, sym)
        out[(start, addr)] = (len(cur) + 1, fn)
        cur = []
    return out


def parse(text: str | Iterable[str], branch_filter: BranchFilter | None = None) -> PerfScriptData:
    """perf script text -> samples (entries oldest first), mmaps and symbol anchors."""
    lines = io.StringIO(text) if isinstance(text, str) else text
    data = PerfScriptData([])
    pending: _Pending | None = None
    sym = ""
    saw_types: set[str] = set()

    def flush() -> None:
        nonlocal pending
        if pending is None:
            return
        p = pending
        pending = None
        ents = p.entries[::-1]
        n = len(ents)
        if n == 0:
            data.without_branches += 1
            return
        s = LbrSample(
            from_=np.array([e[0] for e in ents], dtype=np.uint64), to=np.array([e[1] for e in ents], dtype=np.uint64),
            lbr_cycles=np.array([e[2] for e in ents], dtype=np.uint32),
            cycles=p.cycles, instructions=p.instructions, ip=p.ip, time_ns=_time_ns(p.key[3]),
            cpu=p.key[2], pid=p.key[0], tid=p.key[1], comm=p.comm,
            branch_filter=BranchFilter.CALL | BranchFilter.RETURN, fields=Fields.FROM | Fields.TO | Fields.INFO,
            branch_types=[e[3] for e in ents] if any(e[3] for e in ents) else None)
        if p.has_listing:
            s.listed_insns = _listing_blocks(p.insn_lines)
        data.samples.append(s)

    for raw in lines:
        data.lines += 1
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if "PERF_RECORD_MMAP" in line:
            m = _MMAP.search(line)
            if m and "x" in m["prot"]:
                pg = m["pgoff"]
                data.mmaps.append(PerfMmap(int(m["pid"]), int(m["start"], 16), int(m["len"], 16),
                                           int(pg, 16) if pg.startswith("0x") else int(pg), m["path"]))
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.startswith("\t") and pending is not None:
            if pending.listing_frozen:
                continue
            mi = _INSN.match(line)
            if mi:
                is_jump = "#" in mi["text"]
                pending.insn_lines.append((int(mi["addr"], 16), is_jump, sym))
                pending.has_listing = True
                continue
            ms = _SYMLINE.match(line)
            if ms and "mismatch" not in line and "not reaching" not in line:
                sym = ms["sym"].strip()
            continue
        h = _HEADER.match(line)
        if h is None:
            if "PERF_RECORD" in line:
                continue
            if _BR.search(line):
                raise PerfScriptError(
                    f"line {data.lines}: branch entries without the sample fields vmprof needs; convert with "
                    "perf script -F comm,pid,tid,cpu,time,period,event,ip,sym,dso,brstack")
            continue
        event = h["event"]
        data.events[event] = data.events.get(event, 0) + 1
        rest = h["rest"]
        if "/" in rest and not _BR.search(rest) and re.search(r"\S+\+0x[0-9a-f]+/\S+/[MP-]/", rest):
            raise PerfScriptError(f"line {data.lines}: symbolic branch entries (brstacksym); vmprof needs raw "
                                  "addresses: perf script -F ...,brstack")
        entries = []
        not_taken = 0
        for b in _BR.finditer(rest):
            flags = b[3]
            if "N" in flags:
                not_taken += 1
                continue
            typ = b[7] or ""
            if typ and typ != "-":
                saw_types.add(typ)
            entries.append((int(b[1], 16), int(b[2], 16), 0 if b[6] == "-" else int(b[6]), typ if typ != "-" else ""))
        before_br = _BR.split(rest, maxsplit=1)[0] if entries else rest
        ip = 0
        mi = _IP_SYM.match(before_br)
        pid = int(h["pid"])
        if mi:
            ip = int(mi["ip"], 16)
            dso = mi["dso"].strip()
            name = mi["sym"].strip()
            if dso.startswith("/") and name and name != "[unknown]":
                data.anchors.setdefault((pid, dso), (ip, name, int(mi["off"] or "0", 16)))
        else:
            tok = before_br.split()
            if tok and re.fullmatch(r"[0-9a-fA-F]+", tok[0]):
                ip = int(tok[0], 16)
        key = (pid, int(h["tid"] or h["pid"]), int(h["cpu"] or -1), h["time"])
        period = int(h["period"]) if h["period"] else None
        if pending is None or pending.key != key:
            flush()
            pending = _Pending(key, h["comm"].strip(), ip, entries)
            data.skipped_not_taken += not_taken
            sym = ""
        else:
            pending.listing_frozen = pending.has_listing
            if entries and not pending.entries:
                pending.entries = entries
        ev = event.split(":")[0].lower()
        if "instructions" in ev or ev.endswith("/instructions/") or "inst_retired" in ev:
            pending.instructions = period
        elif "cycles" in ev or "clk_unhalted" in ev:
            pending.cycles = period
    flush()
    flt = branch_filter
    if flt is None:
        listing = any(s.listed_insns for s in data.samples)
        if listing or saw_types & {"COND", "UNCOND", "IND", "COND_CALL", "COND_RET"}:
            flt = BranchFilter.ANY
        elif saw_types and saw_types <= {"CALL", "IND_CALL"}:
            flt = BranchFilter.CALL
        else:
            flt = BranchFilter.CALL | BranchFilter.RETURN
    for s in data.samples:
        s.branch_filter = flt
        if s.lbr_cycles is not None and not s.lbr_cycles.any():
            s.lbr_cycles = None
            s.fields = Fields.FROM | Fields.TO
    return data


def read(path: str, branch_filter: BranchFilter | None = None, stdin: io.TextIOBase | None = None) -> PerfScriptData:
    """Parse a perf script file ('-' reads stdin); PerfScriptError (one line) when it cannot be read or has
    no sample with branch records."""
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
    except OSError as e:
        raise PerfScriptError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        data = parse(text, branch_filter)
    except PerfScriptError as e:
        raise PerfScriptError(f"{path}: {e}") from e
    if not data.samples:
        raise PerfScriptError(f"{path}: no samples with branch records; record with `perf record -b` (or -j) and "
                              "convert with perf script -F comm,pid,tid,cpu,time,period,event,ip,sym,dso,brstack")
    return data


def as_recording(data: PerfScriptData, path: str) -> Recording:
    """The samples as a recording that `vmprof top` can replay: one host sample per perf sample (its ip, pid,
    tid, cpu and time) and each process's maps from the mmap events (no sched events, no VM)."""
    samples = np.zeros(len(data.samples), SAMPLE_DTYPE)
    samples["time_ns"] = [s.time_ns for s in data.samples]
    samples["host_ip"] = [s.ip for s in data.samples]
    samples["pid"] = [max(s.pid, 0) for s in data.samples]
    samples["tid"] = [max(s.tid, 0) for s in data.samples]
    samples["cpu"] = [max(s.cpu, 0) for s in data.samples]
    samples["stack_id"] = -1
    processes = {}
    for s in data.samples:
        if s.pid > 0 and s.pid not in processes:
            maps = "".join(f"{m.start:x}-{m.start + m.length:x} r-xp {m.pgoff:08x} 00:00 0 {m.path}\n"
                           for m in data.mmaps if m.pid == s.pid and m.path.startswith("/"))
            processes[s.pid] = {"pid": s.pid, "comm": s.comm, "cmdline": [], "exe": None, "maps": maps,
                                "build_ids": {}}
    samples = samples[np.argsort(samples["time_ns"], kind="stable")]
    span = float(samples["time_ns"][-1] - samples["time_ns"][0]) / 1e9 if len(samples) else 0.0
    rate = max(round(len(samples) / span), 1) if span > 0 else 1000  # perf samples by cycles: the mean rate
    rec = Recording(Path(path), {"backend": "perf script", "frequency": rate, "event": "perf record -b"}, samples,
                    np.zeros(0, SCHED_DTYPE), snapshot(vms=[], processes=processes))
    rec.end = {"duration_s": span, "lost": {"samples": [], "sched": []}, VMS_KEY: []}
    return rec


def notes_of(data: PerfScriptData) -> list[str]:
    """What a report of these data says about them."""
    notes = []
    if data.skipped_not_taken:
        notes.append(f"{data.skipped_not_taken} not-taken branch entries skipped")
    if not any(s.cycles is not None and s.instructions is not None for s in data.samples):
        notes.append("no instructions counts in the input: CPI unknown; record the group "
                     "-e '{cycles,instructions}:S' for measured CPI")
    return notes


def build_resolvers(data: PerfScriptData, objects: Iterable[str] = (),
                    cache: ImageCache | None = None) -> tuple[ElfResolver, dict[int, ElfResolver], list[str]]:
    """A global resolver from `objects` ("PATH" or "PATH@BIAS", bias = runtime - file vaddr)
    and one per pid from the mmap events, or else from the ip/symbol/dso of the sample lines."""
    cache = cache or ImageCache()
    errors: list[str] = []
    glob = ElfResolver(cache)
    for spec in objects:
        path, _, bias = spec.partition("@")
        try:
            b = int(bias, 0) if bias else 0
        except ValueError:
            raise PerfScriptError(f"--object {spec}: the bias after @ must be a number, e.g. 0x555555554000") from None
        if not glob.add(path, b):
            errors.extend(glob.errors[-1:])
    per_pid: dict[int, ElfResolver] = {}
    missing: set[str] = set()
    for m in data.mmaps:
        if not os.path.isfile(m.path):
            missing.add(m.path)
            continue
        r = per_pid.setdefault(m.pid, ElfResolver(cache))
        r.add_mmap(m.path, m.start, m.length, m.pgoff)
    for (pid, dso), (ip, name, off) in data.anchors.items():
        if pid in per_pid and any(m.pid == pid and m.path == dso for m in data.mmaps):
            continue
        if not os.path.isfile(dso):
            missing.add(dso)
            continue
        try:
            img = cache.get(dso)
        except ElfError as e:
            errors.append(str(e))
            continue
        funcs = img.functions_named(name)
        if len(funcs) != 1:
            continue
        r = per_pid.setdefault(pid, ElfResolver(cache))
        r.add(dso, ip - (funcs[0][0] + off))
    if missing:
        errors.append(f"not on this machine: {', '.join(sorted(missing))} (copy them here and pass --object PATH)")
    return glob, per_pid, errors


def make_resolve_pid(glob: ElfResolver, per_pid: dict[int, ElfResolver]) -> Callable[[int], Resolve]:
    """resolve_pid for analyse(): the process's own mappings first, then the global objects."""

    def for_pid(pid: int) -> Resolve:
        own = per_pid.get(pid)
        if own is None:
            return glob

        def both(addr: int) -> ResolvedAddr | None:
            return own(addr) or glob(addr)

        return both

    cache: dict[int, Resolve] = {}

    def resolve_pid(pid: int) -> Resolve:
        if pid not in cache:
            cache[pid] = for_pid(pid)
        return cache[pid]

    return resolve_pid


def to_text(samples: Iterable[LbrSample], event_cycles: str = "cycles:u",
            event_instructions: str = "instructions:u", resolve: Resolve | None = None) -> str:
    """Samples -> perf script text in the documented format (one cycles and one instructions
    line per sample, brstack newest first; `ip sym+off (dso)` when `resolve` is given).
    Used to round-trip the import in the tests."""
    out = []
    for s in samples:
        r = resolve(s.ip) if resolve is not None and s.ip else None
        symbol = f"{r.function}+0x{r.vaddr - r.func_start:x}" if r else "[unknown]"
        dso = r.object_path if r else "[unknown]"
        ents = []
        n = s.nr
        for j in range(n - 1, -1, -1):
            cyc = int(s.lbr_cycles[j]) if s.lbr_cycles is not None else 0
            typ = s.branch_types[j] if s.branch_types else ""
            ents.append(f"0x{int(s.from_[j]):x}/0x{int(s.to[j]):x}/P/-/-/{cyc}/{typ or '-'}/-")
        t = f"{s.time_ns // 1_000_000_000}.{s.time_ns % 1_000_000_000:09d}"
        head = f"{s.comm or 'prog':>16} {s.pid:>7}/{s.tid:<7} [{max(s.cpu, 0):03d}] {t}:"
        where = f"{s.ip:16x} {symbol} ({dso})"
        for ev, val in ((event_cycles, s.cycles), (event_instructions, s.instructions)):
            if val is None:
                continue
            out.append(f"{head} {val:>10} {ev}: {where} " + " ".join(ents))
    return "\n".join(out) + "\n"
