"""LBR block timing with measured CPI (Yamamoto et al. 2014; docs/papers.md, item 4).

For each sample, consecutive branch entries delimit instruction blocks: the target of
entry N-1 to the source of entry N (both inclusive) ran without a recorded branch in
between.  Each block's instruction count (IC) comes from disassembling that range of the
object file; its time is the sample's measured CPI (cycles / instructions since the
previous sample) x IC, in cycles and, given the CPU frequency, in ns.  Where the CPU
recorded cycles per LBR entry (timed LBR), that measurement is shown beside it.

Blocks are *exact* when the counted range is certainly the path that ran: every taken
branch was recorded (the "any" filter) or the range holds no branch instruction at all.
Under a call/return filter a block that contains jumps or loops is still counted
(statically, once through) but marked not exact: the paper's own limitation (its section 5).

Impossible blocks are rejected and counted by reason, never guessed (see STATUS_NAMES).
Everything after resolution is vectorised over all blocks of all samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.lbr.disasm import KIND_NAMES, CodeCache
from vmprof_tui.lbr.model import (
    LBR_CYCLES_SATURATED,
    CodeReader,
    Fields,
    LbrSample,
    Resolve,
    ResolvedAddr,
)
from vmprof_tui.lbr.reconstruct import reconstruct
from vmprof_tui.resolve.elfcode import ImageCache


class BlocksError(Exception):
    """A runtime failure of the block analysis, with one line for the user."""


STATUS_OK = 0
STATUS_UNKNOWN = 1
STATUS_UNRESOLVED = 2
STATUS_CROSSES_OBJECT = 3
STATUS_CROSSES_FUNCTION = 4
STATUS_BACKWARDS = 5
STATUS_NOT_BOUNDARY = 6
STATUS_NAMES = {
    STATUS_OK: "ok",
    STATUS_UNKNOWN: "endpoint not collected",  # reduced pattern, not reconstructable
    STATUS_UNRESOLVED: "unmapped",  # an endpoint in no known object / function symbol
    STATUS_CROSSES_OBJECT: "crosses objects",
    STATUS_CROSSES_FUNCTION: "crosses a function end",
    STATUS_BACKWARDS: "end before start",
    STATUS_NOT_BOUNDARY: "not an instruction boundary",
}

BLOCK_DTYPE = np.dtype([
    ("sample", "<i4"),  # index into BlockReport.samples
    ("pos", "<i2"),  # block number within the sample: 1 = the oldest (entry 0 -> entry 1)
    ("status", "i1"),
    ("exact", "?"),
    ("reconstructed", "?"),  # an endpoint was filled in from the code (reduced pattern)
    ("start", "<u8"),  # runtime addresses: target of entry pos-1, source of entry pos
    ("end", "<u8"),
    ("vstart", "<u8"),  # the same in the object file's address space
    ("vend", "<u8"),
    ("func", "<i4"),  # index into BlockReport.functions, -1 if none
    ("touches", "<i4"),  # the function of its start (else of its end), also for a rejected block; -1 if none
    ("ic", "<i8"),  # instructions in [start, end], -1 unless ok
    ("internal", "<i4"),  # branch instructions inside the range (before its last instruction)
    ("ic_listed", "<i8"),  # instructions perf script -F brstackinsn listed for the block, -1 if none
    ("cpi", "<f8"),
    ("est_cycles", "<f8"),  # CPI x IC
    ("est_ns", "<f8"),
    ("lbr_cycles", "<i8"),  # timed LBR: cycles the CPU recorded for this block, -1 if none
    ("lbr_ns", "<f8"),
])


@dataclass(frozen=True)
class FunctionInfo:
    object_path: str
    name: str
    start: int  # vaddr in the object
    end: int


@dataclass
class SampleInfo:
    index: int  # position in the input sample list
    time_ns: int
    cpu: int
    pid: int
    tid: int
    comm: str
    vm: str | None
    ip: int
    ip_symbol: str
    cycles: int | None
    instructions: int | None
    cpi: float | None
    nr: int  # branch entries
    reconstructed: int  # entry halves filled in from the code


@dataclass(frozen=True)
class ChainEntry:
    kind: str  # call, return, jmp, jcc, far, or perf's type, or "?"
    from_: int
    to: int
    from_symbol: str
    to_symbol: str


def _pcts(x: np.ndarray) -> dict[str, float] | None:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return None
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "min": float(x.min()), "max": float(x.max())}


@dataclass
class BlockStat:
    function: str
    object_path: str
    start: int  # vaddr in the object
    end: int
    ic: int
    exact: bool
    count: int
    cycles: dict[str, float] | None  # CPI x IC statistics over the occurrences
    ns: dict[str, float] | None
    lbr_count: int
    lbr_cycles: dict[str, float] | None  # timed LBR statistics
    total_cycles: float  # sum of CPI x IC over the occurrences


@dataclass
class FunctionStat:
    function: str
    object_path: str
    blocks: int  # block occurrences
    samples: int  # samples with at least one block in it
    distinct_blocks: int
    instructions: int  # sum of IC over the occurrences
    exact_share: float
    cycles: dict[str, float] | None  # per-block-occurrence CPI x IC statistics
    ns: dict[str, float] | None
    lbr_cycles: dict[str, float] | None
    total_cycles: float


@dataclass
class BlockReport:
    samples: list[SampleInfo]
    blocks: np.ndarray  # BLOCK_DTYPE
    functions: list[FunctionInfo]
    chains: Sequence[list[ChainEntry]]  # per sample, built when asked for
    freq_hz: float | None
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def rejected(self) -> dict[str, int]:
        st = self.blocks["status"]
        return {STATUS_NAMES[k]: int(np.count_nonzero(st == k)) for k in STATUS_NAMES if k != STATUS_OK
                and np.count_nonzero(st == k)}

    def function_ids(self, name: str | None) -> np.ndarray:
        if name is None:
            return np.arange(len(self.functions))
        return np.array([i for i, f in enumerate(self.functions) if f.name == name], dtype=np.int64)

    def ok_blocks(self, function: str | None = None) -> np.ndarray:
        b = self.blocks[self.blocks["status"] == STATUS_OK]
        if function is not None:
            b = b[np.isin(b["func"], self.function_ids(function))]
        return b

    def samples_with(self, function: str | None) -> list[int]:
        """Indices (into .samples) of samples with at least one ok block in `function`."""
        return [int(i) for i in np.unique(self.ok_blocks(function)["sample"])]

    def shown_samples(self, function: str | None, max_samples: int | None) -> tuple[list[int], int]:
        """The samples a report lists (those with `function`, or all) cut to max_samples, and how many
        there were before the cut."""
        every = self.samples_with(function) if function else list(range(len(self.samples)))
        return (every if max_samples is None else every[:max_samples]), len(every)

    def block_stats(self, function: str | None = None) -> list[BlockStat]:
        b = self.ok_blocks(function)
        if b.size == 0:
            return []
        order = np.lexsort((b["vend"], b["vstart"], b["func"]))
        b = b[order]
        change = (np.diff(b["func"]) != 0) | (np.diff(b["vstart"]) != 0) | (np.diff(b["vend"]) != 0)
        bounds = np.concatenate([[0], np.nonzero(change)[0] + 1, [b.size]])
        out: list[BlockStat] = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            g = b[lo:hi]
            f = self.functions[int(g["func"][0])]
            lbr = g["lbr_cycles"][g["lbr_cycles"] >= 0].astype(np.float64)
            est = g["est_cycles"]
            out.append(BlockStat(
                f.name, f.object_path, int(g["vstart"][0]), int(g["vend"][0]), int(g["ic"][0]),
                bool(g["exact"].all()), int(g.size), _pcts(est), _pcts(g["est_ns"]), int(lbr.size), _pcts(lbr),
                float(np.nansum(est))))
        out.sort(key=lambda s: (-s.total_cycles, -s.count, s.start))
        return out

    def function_stats(self, function: str | None = None) -> list[FunctionStat]:
        b = self.ok_blocks(function)
        out: list[FunctionStat] = []
        for fid in np.unique(b["func"]):
            g = b[b["func"] == fid]
            f = self.functions[int(fid)]
            lbr = g["lbr_cycles"][g["lbr_cycles"] >= 0].astype(np.float64)
            distinct = np.unique(np.stack([g["vstart"], g["vend"]], axis=1), axis=0).shape[0]
            out.append(FunctionStat(
                f.name, f.object_path, int(g.size), int(np.unique(g["sample"]).size), int(distinct),
                int(g["ic"].sum()), float(g["exact"].mean()), _pcts(g["est_cycles"]), _pcts(g["est_ns"]),
                _pcts(lbr), float(np.nansum(g["est_cycles"]))))
        out.sort(key=lambda s: (-s.total_cycles, -s.blocks, s.function))
        return out

    def sample_blocks(self, i: int) -> np.ndarray:
        return self.blocks[self.blocks["sample"] == i]

    def function_name(self, block: np.void) -> str:
        fid = int(block["func"])
        return self.functions[fid].name if fid >= 0 else "?"


class _Chains(Sequence[list[ChainEntry]]):
    """The call/return chain of each sample, symbolised when asked for (a report may hold
    millions of entries; formatters show a few samples)."""

    def __init__(self, offsets: np.ndarray, ent_from: np.ndarray, ent_to: np.ndarray, inv_from: np.ndarray,
                 inv_to: np.ndarray, u_res: list[ResolvedAddr | None], u_kind: list[str],
                 types: list[list[str] | None]) -> None:
        self._o, self._f, self._t, self._if, self._it = offsets, ent_from, ent_to, inv_from, inv_to
        self._res, self._kind, self._types = u_res, u_kind, types

    def __len__(self) -> int:
        return len(self._o) - 1

    def __getitem__(self, i: int) -> list[ChainEntry]:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        lo, hi = int(self._o[i]), int(self._o[i + 1])
        types = self._types[i]
        out = []
        for j in range(lo, hi):
            frm, to = int(self._f[j]), int(self._t[j])
            kind = self._kind[int(self._if[j])] if frm else "?"
            if kind in ("?", "-") and types and j - lo < len(types) and types[j - lo]:
                kind = types[j - lo].lower()
            out.append(ChainEntry(kind, frm, to, _sym(self._res[int(self._if[j])], frm) if frm else "?",
                                  _sym(self._res[int(self._it[j])], to) if to else "?"))
        return out


def _sym(r: ResolvedAddr | None, addr: int) -> str:
    if r is None:
        return f"{addr:#x}"
    off = r.vaddr - r.func_start
    return f"{r.function}+{off:#x}" if off else r.function


def analyse(samples: Sequence[LbrSample], resolve: Resolve, freq_hz: float | None = None, *,
            read_code: CodeReader | None = None, resolve_pid: Callable[[int], Resolve | None] | None = None,
            process: str | None = None, vm: str | None = None, reconstruct_missing: bool = True) -> BlockReport:
    """Blocks, instruction counts and CPI-based times for every sample.

    ``resolve(addr)`` maps a runtime address to its object/function (or None);
    ``resolve_pid(pid)``, when given, returns the resolver for one process instead.
    ``read_code(object_path, vaddr, size)`` returns code bytes (default: the ELF file on
    disk).  ``process`` keeps samples whose comm or pid equals it; ``vm`` those whose
    ``vm`` equals it.  ``freq_hz`` converts cycles to ns (None: no ns columns).
    """
    code = CodeCache(read_code or ImageCache())
    notes: list[str] = []
    chosen: list[tuple[int, LbrSample]] = []
    for i, s in enumerate(samples):
        if process is not None and s.comm != process and str(s.pid) != process:
            continue
        if vm is not None and s.vm != vm:
            continue
        chosen.append((i, s))

    def resolver_for(s: LbrSample) -> Resolve:
        if resolve_pid is not None:
            r = resolve_pid(s.pid)
            if r is not None:
                return r
        return resolve

    # reduced patterns: fill in what the code determines (on copies: the caller's samples stay as they were)
    work: list[tuple[int, LbrSample, int]] = []
    for i, s in chosen:
        filled = 0
        if reconstruct_missing and (s.fields & (Fields.FROM | Fields.TO)) != (Fields.FROM | Fields.TO):
            s = dataclasses.replace(s, from_=s.from_.copy(), to=s.to.copy())
            filled = reconstruct(s, resolver_for(s), code)
        work.append((i, s, filled))

    # --- all entries of all samples, concatenated (oldest first within each sample)
    space_of: dict[int, int] = {}  # id(resolver) -> space number
    resolvers: list[Resolve] = []
    spaces = np.zeros(len(work), dtype=np.int64)
    for k, (_, s, _) in enumerate(work):
        r = resolver_for(s)
        sp = space_of.setdefault(id(r), len(resolvers))
        if sp == len(resolvers):
            resolvers.append(r)
        spaces[k] = sp
    nrs = np.array([s.nr for _, s, _ in work], dtype=np.int64)
    offsets = np.zeros(len(work) + 1, dtype=np.int64)
    np.cumsum(nrs, out=offsets[1:])
    n_ent = int(offsets[-1])
    ent_from = np.concatenate([s.from_ for _, s, _ in work]) if work else np.zeros(0, np.uint64)
    ent_to = np.concatenate([s.to for _, s, _ in work]) if work else np.zeros(0, np.uint64)
    ent_cyc = np.concatenate([s.lbr_cycles.astype(np.int64) if s.lbr_cycles is not None
                              else np.zeros(s.nr, np.int64) for _, s, _ in work]) if work else np.zeros(0, np.int64)
    ent_sample = np.repeat(np.arange(len(work)), nrs)
    first = np.zeros(n_ent, dtype=bool)
    first[offsets[:-1][nrs > 0]] = True
    last = np.zeros(n_ent, dtype=bool)
    last[offsets[1:][nrs > 0] - 1] = True
    # block k of a sample: target of entry k-1 .. source of entry k
    starts = ent_to[~last]
    ends = ent_from[~first]
    b_sample = ent_sample[~first]
    total = int(starts.size)
    b_pos = (np.arange(n_ent) - offsets[ent_sample])[~first]
    c = ent_cyc[~first]
    lbr = np.where(c > 0, c, -1)
    filled_arr = np.array([f for _, _, f in work], dtype=np.int64)
    recon = filled_arr[b_sample] > 0 if total else np.zeros(0, bool)
    listed = np.full(total, -1, dtype=np.int64)
    for k, (_, s, _) in enumerate(work):
        if s.listed_insns and s.nr > 1:
            o = int(offsets[k]) - k
            for j in range(s.nr - 1):
                hit = s.listed_insns.get((int(s.to[j]), int(s.from_[j + 1])))
                if hit is not None:
                    listed[o + j] = hit[0]

    # --- resolve every distinct (address space, address) once; unique per space on plain uint64
    ips = np.array([s.ip for _, s, _ in work], dtype=np.uint64)
    all_addr = np.concatenate([ent_from, ent_to, ips])
    all_space = np.concatenate([spaces[ent_sample], spaces[ent_sample], spaces])
    inv = np.zeros(all_addr.size, dtype=np.int64)
    u_addr_parts: list[np.ndarray] = []
    u_space_parts: list[np.ndarray] = []
    base = 0
    for sp in range(len(resolvers)):
        m = all_space == sp
        ua, ui = np.unique(all_addr[m], return_inverse=True)
        inv[m] = ui.ravel() + base
        u_addr_parts.append(ua)
        u_space_parts.append(np.full(ua.size, sp))
        base += ua.size
    u_addrs = np.concatenate(u_addr_parts) if u_addr_parts else np.zeros(0, np.uint64)
    u_spaces = np.concatenate(u_space_parts) if u_space_parts else np.zeros(0, np.int64)
    nu = int(u_addrs.size)
    u_func = np.full(nu, -1, dtype=np.int64)
    u_idx = np.full(nu, -1, dtype=np.int64)
    u_cumb = np.zeros(nu, dtype=np.int64)
    u_cumu = np.zeros(nu, dtype=np.int64)
    u_vaddr = np.zeros(nu, dtype=np.uint64)
    u_obj = np.full(nu, -1, dtype=np.int64)
    u_res: list[ResolvedAddr | None] = [None] * nu
    u_kind: list[str] = ["?"] * nu
    functions: list[FunctionInfo] = []
    func_ids: dict[tuple[str, int], int] = {}
    obj_ids: dict[str, int] = {}
    unresolved_addrs = 0
    for u in range(nu):
        addr = int(u_addrs[u])
        if addr == 0:
            continue
        r = resolvers[int(u_spaces[u])](addr)
        if r is None:
            unresolved_addrs += 1
            continue
        u_res[u] = r
        fid = func_ids.get((r.object_path, r.func_start))
        if fid is None:
            fid = func_ids[(r.object_path, r.func_start)] = len(functions)
            functions.append(FunctionInfo(r.object_path, r.function, r.func_start, r.func_end))
        u_func[u] = fid
        u_obj[u] = obj_ids.setdefault(r.object_path, len(obj_ids))
        u_vaddr[u] = r.vaddr
        fc = code.get(r.object_path, r.function, r.func_start, r.func_end)
        idx = fc.index_of(r.vaddr)
        if idx >= 0:
            u_idx[u] = idx
            u_cumb[u] = fc.cum_branches[idx]
            u_cumu[u] = fc.cum_uncond[idx]
            u_kind[u] = KIND_NAMES[int(fc.kinds[idx])]
    inv_from = inv[:n_ent]
    inv_to = inv[n_ent:2 * n_ent]
    inv_ip = inv[2 * n_ent:]

    # --- per block, vectorised
    si, ei = inv_to[~last], inv_from[~first]
    unknown = (starts == 0) | (ends == 0)
    unres = ~unknown & ((u_obj[si] < 0) | (u_obj[ei] < 0))
    rest = ~unknown & ~unres
    xobj = rest & (u_obj[si] != u_obj[ei])
    rest &= ~xobj
    xfn = rest & (u_func[si] != u_func[ei])
    rest &= ~xfn
    back = rest & (u_vaddr[ei] < u_vaddr[si])
    rest &= ~back
    notb = rest & ((u_idx[si] < 0) | (u_idx[ei] < 0))
    ok = rest & ~notb
    status = np.select([unknown, unres, xobj, xfn, back, notb],
                       [STATUS_UNKNOWN, STATUS_UNRESOLVED, STATUS_CROSSES_OBJECT, STATUS_CROSSES_FUNCTION,
                        STATUS_BACKWARDS, STATUS_NOT_BOUNDARY], STATUS_OK).astype(np.int8)
    ic = np.where(ok, u_idx[ei] - u_idx[si] + 1, -1)
    internal = np.where(ok, u_cumb[ei] - u_cumb[si], 0)
    internal_u = np.where(ok, u_cumu[ei] - u_cumu[si], 0)
    any_filter = np.array([s.branch_filter.records_all_taken_branches for _, s, _ in work], dtype=bool)
    exact = ok & (internal_u == 0) & (any_filter[b_sample] | (internal == 0))

    # perf's own listing (brstackinsn) stands in for objects we do not have
    use_listed = unres & (listed >= 0)
    listed_func = np.full(total, -1, dtype=np.int64)
    listed_ids: dict[str, int] = {}
    for j in np.nonzero(use_listed)[0]:
        s = work[int(b_sample[j])][1]
        name = s.listed_insns[(int(starts[j]), int(ends[j]))][1] or "?"
        fid = listed_ids.get(name)
        if fid is None:
            fid = listed_ids[name] = len(functions)
            functions.append(FunctionInfo("[perf listing]", name, 0, 0))
        listed_func[j] = fid
    if use_listed.any():
        status[use_listed] = STATUS_OK
        ic[use_listed] = listed[use_listed]
        exact[use_listed] = any_filter[b_sample[use_listed]]
        notes.append(f"{int(use_listed.sum())} blocks counted from perf's brstackinsn listing "
                     "(their object file was not available)")

    cpi = np.array([s.cpi if s.cpi is not None else np.nan for _, s, _ in work], dtype=np.float64)
    blocks = np.zeros(total, dtype=BLOCK_DTYPE)
    blocks["sample"] = b_sample
    blocks["pos"] = b_pos
    blocks["status"] = status
    blocks["exact"] = exact
    blocks["reconstructed"] = recon
    blocks["start"] = starts
    blocks["end"] = ends
    blocks["vstart"] = np.where(ok, u_vaddr[si], starts)
    blocks["vend"] = np.where(ok, u_vaddr[ei], ends)
    blocks["func"] = np.where(ok, u_func[si], listed_func)
    blocks["touches"] = np.where(ok | use_listed, blocks["func"], np.where(u_func[si] >= 0, u_func[si], u_func[ei]))
    ok_all = status == STATUS_OK
    blocks["ic"] = np.where(ok_all, ic, -1)
    blocks["internal"] = internal
    blocks["ic_listed"] = listed
    blocks["cpi"] = cpi[b_sample]
    est = np.where(ok_all, cpi[b_sample] * blocks["ic"], np.nan)
    blocks["est_cycles"] = est
    blocks["lbr_cycles"] = lbr
    if freq_hz:
        blocks["est_ns"] = est / freq_hz * 1e9
        blocks["lbr_ns"] = np.where(lbr >= 0, lbr / freq_hz * 1e9, np.nan)
    else:
        blocks["est_ns"] = np.nan
        blocks["lbr_ns"] = np.nan
        notes.append("no CPU frequency given: times in cycles only (pass freq_hz / --freq-mhz for ns)")

    infos = [SampleInfo(i, s.time_ns, s.cpu, s.pid, s.tid, s.comm, s.vm, s.ip,
                        _sym(u_res[int(inv_ip[k])], s.ip) if s.ip else "?", s.cycles, s.instructions, s.cpi, s.nr,
                        filled) for k, (i, s, filled) in enumerate(work)]
    chains = _Chains(offsets, ent_from, ent_to, inv_from, inv_to, u_res, u_kind,
                     [s.branch_types for _, s, _ in work])

    saturated = int(np.count_nonzero(lbr == LBR_CYCLES_SATURATED))
    if saturated:
        notes.append(f"{saturated} timed-LBR cycle counts saturated at {LBR_CYCLES_SATURATED} (lower bounds)")
    counts = {
        "samples_in": len(samples),
        "samples": len(work),
        "samples_without_cpi": int(np.count_nonzero(np.isnan(cpi))),
        "entries": n_ent,
        "blocks": total,
        "blocks_ok": int(np.count_nonzero(status == STATUS_OK)),
        "blocks_exact": int(np.count_nonzero(blocks["exact"])),
        "blocks_rejected": int(np.count_nonzero(status != STATUS_OK)),
        "blocks_timed_lbr": int(np.count_nonzero(lbr >= 0)),
        "blocks_listed_mismatch": int(np.count_nonzero(ok_all & (listed >= 0) & (listed != blocks["ic"]))),
        "unresolved_addresses": unresolved_addrs,
        "reconstructed_values": int(filled_arr.sum()),
    }
    return BlockReport(infos, blocks, functions, chains, freq_hz, counts, notes)
