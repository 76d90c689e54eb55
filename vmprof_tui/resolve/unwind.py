"""Unwinding copied user stacks (`vmprof record -g --call-graph cfi`) into call chains.

record → **resolve**: the sampler copied up to STACK_COPY_BYTES of each sample's user stack (host user
code, or a guest's through its page tables) with RIP, RSP and RBP (`struct vmprof_ustack`).  Here each
copy is unwound by the call-frame information of the object each pc falls in (`resolve/cfi.py`), by frame
pointers in an object that has none (the per-object default: CFI where there is some, frame pointers
otherwise), and the chain goes into the sample's stack record as a walked chain would
(`vmprof_stack.guest[]`), so everything after resolving is unchanged.

A chain ends complete at a return-address rule `undefined` (glibc's `_start`), a return address 0, or a
pc without a rule inside a process entry function (`stacks.ENTRY_FUNCTIONS`: the demo programs' `_start`
has no CFI).  Anything else ends it early and is counted by reason (`REASONS`): the copy ends before the
frame (`stack copy too small`), a pc in no mapping, no rule for a pc, a rule this reader does not follow,
a frame that does not climb the stack (a CFI loop, a corrupt table), the depth limit.  No frame is ever
made up: each return address is read from the copy at the place a rule names.

Work is per sample in Python with the rule of every distinct (address space, pc) looked up once (a
sample's frames repeat across samples: the lookups are the expensive part).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.record.bpf_records import KSTACK_TAIL, STACK_GUEST_MAX
from vmprof_tui.resolve.cfi import (
    BP_AT_SP,
    CFA_DEREF,
    CFA_PLT,
    CFA_REG,
    RA_AT_SP,
    RBP,
    RSP,
    SAME,
    SIGNAL_FRAME,
    UNDEFINED,
    UNSUPPORTED,
    CfiTable,
    empty_table,
    read_cfi,
)
from vmprof_tui.resolve.elf import ET_EXEC
from vmprof_tui.resolve.spaces import AddressSpace, Mapping, ObjectCache
from vmprof_tui.resolve.untrusted import BundleError

COMPLETE, SHORT_COPY, NO_MAPPING, NO_RULE, UNFOLLOWED, NOT_CLIMBING, TOO_DEEP, LOST = range(8)
REASONS = {LOST: "the stack copy was lost (its ring buffer was full)",
           SHORT_COPY: "the stack copy ended before the caller's frame (record --call-graph cfi,SIZE)",
           NO_MAPPING: "a return address in no mapped object",
           NO_RULE: "no call-frame information for an address",
           UNFOLLOWED: "a call-frame rule this unwinder does not follow",
           NOT_CLIMBING: "a frame that does not climb the stack (corrupt or looping call-frame information)",
           TOO_DEEP: f"deeper than {STACK_GUEST_MAX} frames"}
_U64 = struct.Struct("<Q")
_MASK = (1 << 64) - 1
GUEST_USER_TOP = 1 << 47  # guest addresses below are user space (the sampler's GUEST_USER_TOP)
_NO_CFI = (-1, 0, 0, 0, 0, 0, 0)  # an object without call-frame information: frame pointers
_NO_ROW = (-2, 0, 0, 0, 0, 0, 0)  # an object with CFI that has no row for the address
Rule = tuple[int, int, int, int, int, int, int]  # cfa kind, register, offset; ra, rbp rules; plt threshold; flags


@dataclass
class _Object:
    """One mapping's unwind table, ready for lookups one address at a time (bisect over Python lists)."""
    table: CfiTable
    starts: list[int]
    link_delta: int | None  # link-time address = address + link_delta (None: through the symbols' segments)
    mapping: Mapping
    symbols: object | None


@dataclass
class Rules:
    """The unwind rule of each (address space, pc) met, found once."""
    objects: ObjectCache
    entries: frozenset[str]  # the functions a complete chain starts in (_start, ...)
    notes: list[str] = field(default_factory=list)
    _tables: dict[str, tuple[CfiTable, list[int]]] = field(default_factory=dict)
    _spaces: dict[int, tuple[list[int], list[int], list[Mapping]]] = field(default_factory=dict)
    _objects: dict[tuple[int, int], _Object] = field(default_factory=dict)
    _rules: dict[tuple[int, int], Rule | None] = field(default_factory=dict)
    _entry: dict[tuple[int, int], bool] = field(default_factory=dict)
    # the spaces keyed by id above, held so that no other takes their id (the object cache drops spaces, and one
    # Rules serves every piece of a recording: resolve.stacks.Unwinding)
    _held: dict[int, AddressSpace] = field(default_factory=dict)

    def is_entry(self, space: AddressSpace, pc: int) -> bool:
        """`pc` lies in a process or thread entry function."""
        key = (id(space), pc)
        if key not in self._entry:
            self._held[id(space)] = space
            self._entry[key] = space.resolve(np.array([pc], np.uint64), self.objects)[0][0] in self.entries
        return self._entry[key]

    def _table(self, m: Mapping) -> tuple[CfiTable, list[int]]:
        key = str(m.object_path)
        if key not in self._tables:
            try:
                table = read_cfi(m.object_path)  # type: ignore[arg-type]
            except (BundleError, OSError) as e:
                if len(self.notes) < 100:
                    self.notes.append(f"{e}: its frames unwind by frame pointers")
                table = empty_table()
            self._tables[key] = (table, table.start.tolist())
        return self._tables[key]

    def _object(self, space: AddressSpace, mi: int, m: Mapping) -> _Object:
        key = (id(space), mi)
        if key not in self._objects:
            sym = self.objects.symbols(m)
            table, starts = self._table(m) if sym is not None and m.object_path is not None else (empty_table(), [])
            delta = None
            if sym is not None and sym.elf_type == ET_EXEC:
                delta = 0
            elif sym is not None:  # the segment the mapping's file offset lies in gives every address's
                for seg in sym.segments:
                    if seg.offset <= m.offset < seg.offset + max(seg.filesz, 1):
                        delta = m.offset - m.start + seg.vaddr - seg.offset
                        break
            self._objects[key] = _Object(table, starts, delta, m, sym)
        return self._objects[key]

    def rule(self, space: AddressSpace, pc: int) -> Rule | None:
        """(cfa kind, cfa register, cfa offset, ra offset, rbp rule, plt threshold, flags) for `pc` (a lookup
        address), _NO_CFI, _NO_ROW, or None when no mapping holds it."""
        key = (id(space), pc)
        rule = self._rules.get(key, False)
        if rule is not False:
            return rule  # type: ignore[return-value]
        if id(space) not in self._spaces:
            self._held[id(space)] = space
            maps = sorted(space.maps, key=lambda m: m.start)
            self._spaces[id(space)] = ([m.start for m in maps], [m.end for m in maps], maps)
        starts, ends, maps = self._spaces[id(space)]
        mi = bisect.bisect_right(starts, pc) - 1
        rule = None
        if mi >= 0 and pc < ends[mi]:
            obj = self._object(space, mi, maps[mi])
            if not len(obj.table):
                rule = _NO_CFI
            else:
                link = pc + obj.link_delta if obj.link_delta is not None else \
                    int(obj.symbols.link_addrs(obj.mapping, np.array([pc], np.uint64))[0])  # type: ignore[union-attr]
                t, i = obj.table, bisect.bisect_right(obj.starts, link) - 1
                rule = _NO_ROW if i < 0 or link >= int(t.end[i]) else _rule(t, i)
        if len(self._rules) >= 1 << 20:
            self._rules.clear()
        self._rules[key] = rule
        return rule


@dataclass
class KernelRules:
    """The rules of a guest kernel linked where it runs, from its ELF file in the VM's bundle (no mappings:
    `space` is unused)."""
    table: CfiTable
    starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.starts = self.table.start.tolist()

    def is_entry(self, space: object, pc: int) -> bool:
        return False

    def rule(self, space: object, pc: int) -> Rule:
        t, i = self.table, bisect.bisect_right(self.starts, pc) - 1
        return _NO_ROW if i < 0 or pc >= int(t.end[i]) else _rule(t, i)


def _rule(t: CfiTable, i: int) -> Rule:
    return (int(t.cfa_kind[i]), int(t.cfa_reg[i]), int(t.cfa_off[i]), int(t.ra[i]), int(t.bp[i]), int(t.plt_at[i]),
            int(t.flags[i]))


def unwind_one(ip: int, sp: int, bp: int | None, data: bytes, space: object, rules: Rules | KernelRules,
               user_top: int | None = None) -> tuple[list[int], int]:
    """(the chain leaf first: ip then return addresses, why it ended) of one stack copy `data` taken at `sp`.
    With `user_top` (a guest kernel's stack), the first return address below it is the entry frame's user RIP:
    the chain ends there, complete."""
    chain = [ip]
    if space is None:
        return chain, NO_MAPPING
    size = len(data)

    def read(addr: int) -> int | None:
        off = addr - sp0
        return _U64.unpack_from(data, off)[0] if 0 <= off <= size - 8 else None

    sp0, pc, exact = sp, ip, True
    while True:
        # a return address points after its call: its rule is the call's (one byte back), as perf does; the
        # leaf and a pc a signal interrupted are exact
        lookup = pc if exact else pc - 1
        rule = rules.rule(space, lookup)
        if rule is None:
            return chain, NO_MAPPING
        kind, reg, off, ra_off, bp_rule, plt, flags = rule
        if kind == _NO_ROW[0]:
            return chain, COMPLETE if rules.is_entry(space, lookup) else NO_RULE
        if kind == _NO_CFI[0]:  # an object without CFI: its frames are frame-pointer frames
            if bp is None or not sp <= bp < sp0 + size:
                return chain, COMPLETE if rules.is_entry(space, lookup) else NO_RULE
            kind, reg, off, ra_off, bp_rule = CFA_REG, RBP, 16, -8, -16
        if kind == CFA_PLT:
            cfa = sp + off + (8 if (pc & 15) >= plt else 0)
        elif kind in (CFA_REG, CFA_DEREF) and reg in (RSP, RBP):
            base = sp if reg == RSP else bp
            if base is None:
                return chain, UNFOLLOWED
            cfa = base + off if kind == CFA_REG else read(base + off)
            if cfa is None:
                return chain, SHORT_COPY
        else:
            return chain, UNFOLLOWED
        if ra_off == UNDEFINED:
            return chain, COMPLETE
        if ra_off in (SAME, UNSUPPORTED):
            return chain, UNFOLLOWED
        if cfa <= sp:  # each caller's frame lies above its callee's: anything else loops or is corrupt
            return chain, NOT_CLIMBING
        ra = read((sp if flags & RA_AT_SP else cfa) + ra_off)
        if ra is None:
            return chain, SHORT_COPY
        if bp_rule not in (SAME, UNDEFINED, UNSUPPORTED):
            bp = read((sp if flags & BP_AT_SP else cfa) + bp_rule)
        elif bp_rule != SAME:
            bp = None
        if ra == 0:
            return chain, COMPLETE
        if len(chain) >= STACK_GUEST_MAX:
            return chain, TOO_DEEP
        chain.append(ra)
        if user_top is not None and ra < user_top:
            return chain, COMPLETE
        sp, pc, exact = cfa & _MASK, ra, bool(flags & SIGNAL_FRAME)


def unwind(ustacks: np.ndarray, rows: np.ndarray, spaces: list[AddressSpace | None], rules: Rules
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chains (n, STACK_GUEST_MAX) leaf first, their depths and why each ended, for the ustack `rows` and the
    address space of each (None: unknown process).  The copies are read in place (8 KiB each)."""
    n = len(rows)
    chains = np.zeros((n, STACK_GUEST_MAX), np.uint64)
    depth = np.zeros(n, np.uint8)
    reason = np.zeros(n, np.int8)
    data = ustacks["data"]
    regs = zip(rows.tolist(), *(ustacks[k][rows].tolist() for k in ("ip", "sp", "bp", "copied")), strict=True)
    for i, (row, ip, sp, bp, copied) in enumerate(regs):
        chain, why = unwind_one(ip, sp, bp, data[row, :min(copied, data.shape[1])].tobytes(), spaces[i], rules)
        chains[i, :len(chain)] = chain
        depth[i], reason[i] = len(chain), why
    return chains, depth, reason


def unwind_guest_kernel(ustacks: np.ndarray, rows: np.ndarray, leaves: np.ndarray, rules: KernelRules
                        ) -> list[tuple[list[int], int]]:
    """A guest-kernel sample's kernel frames, leaf first, through its entry frame's user RIP (the last), and why
    they ended, from the kernel stack at the end of each copy (`USTACK_GUEST_KERNEL`, bpf/sample.h)."""
    tails = ustacks["data"][rows, ustacks["data"].shape[1] - KSTACK_TAIL:]
    out = []
    for ip, tail in zip(leaves.tolist(), tails, strict=True):
        raw = tail.tobytes()
        sp, bp = _U64.unpack_from(raw, 0)[0], _U64.unpack_from(raw, 8)[0]
        out.append(unwind_one(ip, sp, bp, raw[16:], rules, rules, GUEST_USER_TOP))
    return out


def reason_notes(reason: np.ndarray, what: str) -> list[str]:
    """One note per reason that ended chains early."""
    counts = np.bincount(reason.astype(np.int64), minlength=len(REASONS) + 1)
    return [f"{int(counts[r])} {what} chains unwound by call-frame information end [partial]: {text}"
            for r, text in REASONS.items() if counts[r]]
