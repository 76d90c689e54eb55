"""Call-frame information of an object file as arrays: for each pc range, how to find the caller's frame.

record → **resolve**: `--call-graph cfi` copies user stacks at sample time; `resolve/unwind.py` unwinds
them with these tables.  pyelftools parses `.eh_frame` (else `.debug_frame`: the demo guest programs
have only that); the rules are then run here, per FDE, into rows of
`[start, end) -> CFA = reg + offset (or *(reg + offset)), return address at CFA + ra, RBP at CFA + bp`,
sorted by start, one table per object, cached by the file's content like its symbols (resolve/cache.py).

Only what x86-64 unwinding needs is kept: the CFA rule, the return address (DWARF register 16) and RBP
(6; it may be the next CFA's base).  Rules this reader does not follow (a register in another register,
expressions other than the PLT's and `*(reg + n)`) are kept as UNSUPPORTED: the unwinder stops there and
says why, never guesses.  A return-address rule `undefined` is the end of the stack (glibc's `_start`).

Object files are hostile (guest bundles) or may be corrupt: the file passes the ELF reader's checks
first, every count is bounded (`MAX_*`), and any failure of pyelftools on a malformed table is one
`ElfError` line (the object then unwinds by frame pointers, or not at all).  Memory stays bounded: a
section of at most MAX_SECTION bytes, at most one row per byte of it, rows held as int64.  The fuzz target
`tests/fuzz/fuzz_bundle.py cfi` drives `cfi_from_bytes`.
"""

from __future__ import annotations

import array
import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vmprof_tui.resolve.elf import ElfError, check_elf_header, guarded, parsed_once
from vmprof_tui.resolve.untrusted import DEFAULT_LIMITS, Limits

# CFA rule kinds (cfa_kind)
CFA_UNSUPPORTED, CFA_REG, CFA_DEREF, CFA_PLT = 0, 1, 2, 3
# return-address / RBP rule offsets that are no offset
UNDEFINED = np.iinfo(np.int32).min  # ra: the outermost frame; bp: the value is lost (no frame pointer to follow)
SAME = np.iinfo(np.int32).min + 1  # bp: unchanged from the callee
UNSUPPORTED = np.iinfo(np.int32).min + 2
RSP, RBP, RA = 7, 6, 16  # DWARF register numbers on x86-64
# row flags: a DW_CFA_expression `DW_OP_breg7 n` saves a register at RSP + n (glibc's __restore_rt: the
# interrupted registers in the signal frame); SIGNAL_FRAME: the CIE says "S", the caller's pc is no return address
RA_AT_SP, BP_AT_SP, SIGNAL_FRAME = 1, 2, 4
MAX_ENTRIES = 2_000_000  # CIEs and FDEs of one object
MAX_SECTION = 64 << 20  # bytes of one .eh_frame / .debug_frame (pyelftools holds every entry as objects)
MAX_ROWS = 4_000_000
MAX_INSTRUCTIONS = 10_000  # of one FDE (with its CIE's)
MAX_REMEMBER = 64  # nesting of DW_CFA_remember_state
# The expression gcc and binutils put in .plt FDEs: CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)
# (DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11 or lit10; DW_OP_ge; DW_OP_lit3;
# DW_OP_shl; DW_OP_plus); the threshold is kept in cfa_off's upper bits.
_PLT_HEAD, _PLT_TAIL = bytes([0x80, 0x00, 0x3F, 0x1A]), bytes([0x2A, 0x33, 0x24, 0x22])
_DW_OP_BREG0, _DW_OP_DEREF, _DW_OP_LIT0 = 0x70, 0x06, 0x30


@dataclass
class CfiTable:
    """Unwind rows of one object, sorted by start (link-time addresses)."""
    start: np.ndarray  # uint64
    end: np.ndarray  # uint64
    cfa_kind: np.ndarray  # uint8: CFA_*
    cfa_reg: np.ndarray  # int8: DWARF register of the CFA rule
    cfa_off: np.ndarray  # int64 (CFA_PLT: the rsp offset; plt_at: the rip & 15 threshold)
    ra: np.ndarray  # int32: return address at CFA + ra, or UNDEFINED / UNSUPPORTED
    bp: np.ndarray  # int32: saved RBP at CFA + bp, or SAME / UNDEFINED / UNSUPPORTED
    plt_at: np.ndarray  # uint8: CFA_PLT's rip & 15 threshold
    flags: np.ndarray  # uint8: RA_AT_SP, BP_AT_SP (the offset is from the frame's RSP, not the CFA), SIGNAL_FRAME
    source: str = ""  # ".eh_frame", ".debug_frame" or "" (no call-frame information)

    def __len__(self) -> int:
        return len(self.start)

    def row(self, addr: int) -> int:
        """The row covering link-time address `addr`, or -1."""
        i = int(np.searchsorted(self.start, np.uint64(addr), side="right")) - 1
        return i if i >= 0 and addr < int(self.end[i]) else -1


def empty_table(source: str = "") -> CfiTable:
    return CfiTable(np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.uint8), np.empty(0, np.int8),
                    np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.uint8),
                    np.empty(0, np.uint8), source)


def read_cfi(path: Path, limits: Limits = DEFAULT_LIMITS) -> CfiTable:
    """The unwind table of an object file, parsed once per file content (or identity, for large files)."""
    return parsed_once(path, "cfi3", limits, _parse_guarded, _to_arrays, _from_arrays)


def cfi_from_bytes(data: bytes, limits: Limits = DEFAULT_LIMITS, what: str = "object") -> CfiTable:
    """The same for an in-memory file (the fuzz target)."""
    return _parse_guarded(io.BytesIO(data), len(data), limits, what)


def _to_arrays(t: CfiTable) -> dict[str, np.ndarray]:
    return {k: getattr(t, k) for k in _COLUMNS} | {"source": np.array([t.source])}


def _from_arrays(a: dict[str, np.ndarray]) -> CfiTable:
    return CfiTable(*(a[k] for k in _COLUMNS), source=str(a["source"][0]))


_COLUMNS = ("start", "end", "cfa_kind", "cfa_reg", "cfa_off", "ra", "bp", "plt_at", "flags")


def _parse_guarded(f: BinaryIO, size: int, limits: Limits, what: str) -> CfiTable:
    return guarded(_parse, "call-frame information", f, size, limits, what)


def _parse(f: BinaryIO, size: int, limits: Limits, what: str) -> CfiTable:
    from elftools.dwarf.callframe import FDE
    from elftools.elf.elffile import ELFFile

    f.seek(0)
    check_elf_header(f.read(64), size, limits, what)
    f.seek(0)
    elf = ELFFile(f)
    if elf.num_sections() > limits.max_elf_sections:
        raise ElfError(f"{what}: {elf.num_sections()} sections, over the limit of {limits.max_elf_sections}")
    for name in (".eh_frame", ".debug_frame"):
        sec = elf.get_section_by_name(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS" or sec["sh_offset"] + sec["sh_size"] > size:
            continue
        if sec["sh_size"] > MAX_SECTION:
            raise ElfError(f"{what}: {name} of {sec['sh_size']} bytes, over the limit of {MAX_SECTION}")
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
        entries = dwarf.EH_CFI_entries() if name == ".eh_frame" else dwarf.CFI_entries()
        if len(entries) > MAX_ENTRIES:
            raise ElfError(f"{what}: {len(entries)} call-frame entries, over the limit of {MAX_ENTRIES}")
        # every row comes from an FDE's own instruction or its end (a CIE's instructions only set the initial
        # rules): never more rows than the section has bytes, held as 9 int64 each, not as Python tuples
        most = min(MAX_ROWS, int(sec["sh_size"]))
        rows = array.array("q")
        for entry in entries:
            if isinstance(entry, FDE):
                _fde_rows(entry, rows)
                if len(rows) > 9 * most:
                    raise ElfError(f"{what}: more than {most} call-frame rows in {name}")
        if rows:
            return _table(rows, name)
    return empty_table()


def _table(rows: array.array, source: str) -> CfiTable:
    arr = np.frombuffer(rows, dtype=np.int64).reshape(-1, 9)
    arr = arr[np.argsort(arr[:, 0].astype(np.uint64), kind="stable")]
    return CfiTable(arr[:, 0].astype(np.uint64), arr[:, 1].astype(np.uint64), arr[:, 2].astype(np.uint8),
                    arr[:, 3].astype(np.int8), arr[:, 4], arr[:, 5].astype(np.int32), arr[:, 6].astype(np.int32),
                    arr[:, 7].astype(np.uint8), arr[:, 8].astype(np.uint8), source)


def _cfa_expression(expr: bytes) -> tuple[int, int, int, int]:
    """(kind, register, offset, plt threshold) of a DW_CFA_def_cfa_expression this reader follows."""
    if len(expr) >= 2 and _DW_OP_BREG0 <= expr[0] < _DW_OP_BREG0 + 32:
        off, n = _sleb(expr, 1)
        off = _clamp(off)
        rest = expr[n:]
        if rest == bytes([_DW_OP_DEREF]):
            return CFA_DEREF, expr[0] - _DW_OP_BREG0, off, 0
        if expr[0] == _DW_OP_BREG0 + RSP and len(rest) == 9 and rest[:4] == _PLT_HEAD and rest[5:] == _PLT_TAIL \
                and _DW_OP_LIT0 <= rest[4] < _DW_OP_LIT0 + 16:
            return CFA_PLT, RSP, off, rest[4] - _DW_OP_LIT0
    return CFA_UNSUPPORTED, 0, 0, 0


def _at_sp(expr: bytes) -> tuple[str, int] | int:
    """A register rule DW_CFA_expression `DW_OP_breg7 n`: saved at RSP + n (a signal frame's registers)."""
    if len(expr) >= 2 and expr[0] == _DW_OP_BREG0 + RSP:
        off, end = _sleb(expr, 1)
        if end == len(expr) and -(1 << 30) < off < 1 << 30:
            return ("sp", off)
    return UNSUPPORTED


def _sleb(data: bytes, pos: int) -> tuple[int, int]:
    """A signed LEB128 at data[pos:]: (value, position after it)."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if b & 0x40:
                value -= 1 << shift
            return value, pos
    return 0, len(data) + 1  # cut short: matches no pattern


def _fde_rows(fde: object, rows: array.array) -> None:
    """Run the CIE's and the FDE's instructions, one row per address range with one rule set."""
    cie = fde.cie  # type: ignore[attr-defined]
    code_align = int(cie["code_alignment_factor"] or 1)
    data_align = int(cie["data_alignment_factor"] or 1)
    ra_reg = int(cie["return_address_register"])
    start = int(fde["initial_location"])  # type: ignore[index]
    end = start + int(fde["address_range"])  # type: ignore[index]
    if end <= start or start < 0 or end >= 1 << 64:
        return
    instructions = list(cie.instructions) + list(fde.instructions)  # type: ignore[attr-defined]
    if len(instructions) > MAX_INSTRUCTIONS:
        return
    n_cie = len(cie.instructions)
    state = {"cfa": (CFA_UNSUPPORTED, 0, 0, 0), RA: UNDEFINED, RBP: SAME}
    initial = dict(state)
    remembered: list[dict] = []
    loc = start

    signal = SIGNAL_FRAME if b"S" in bytes(cie["augmentation"] or b"") else 0

    def emit(upto: int) -> None:
        if upto > loc and loc < end:  # rows stay inside the FDE's range (addresses as int64 bit patterns)
            kind, reg, off, plt = state["cfa"]
            if not 0 <= reg < 64 or off == UNSUPPORTED:
                kind, reg, off = CFA_UNSUPPORTED, 0, 0
            ra, bp = state[RA], state[RBP]
            flags = signal | (RA_AT_SP if isinstance(ra, tuple) else 0) | (BP_AT_SP if isinstance(bp, tuple) else 0)
            rows.extend((_signed(loc), _signed(min(upto, end)), kind, reg, off, ra[1] if isinstance(ra, tuple) else ra,
                         bp[1] if isinstance(bp, tuple) else bp, plt, flags))

    def set_reg(reg: int, rule: int | tuple[str, int]) -> None:
        if reg == ra_reg:
            state[RA] = rule
        elif reg == RBP:
            state[RBP] = rule

    for i, ins in enumerate(instructions):
        if i == n_cie:
            initial = dict(state)
        name = _name(ins.opcode)
        args = ins.args
        if name in ("advance_loc", "advance_loc1", "advance_loc2", "advance_loc4"):
            if i >= n_cie:  # a CIE's instructions set the initial rules only
                emit(loc + args[0] * code_align)
                loc += args[0] * code_align
        elif name == "set_loc":
            if i >= n_cie:
                emit(args[0])
                loc = max(loc, int(args[0]))
        elif name == "def_cfa":
            state["cfa"] = (CFA_REG, args[0], _clamp(args[1]), 0)
        elif name == "def_cfa_sf":
            state["cfa"] = (CFA_REG, args[0], _clamp(args[1] * data_align), 0)
        elif name == "def_cfa_register":
            _kind, _reg, off, _plt = state["cfa"]
            state["cfa"] = (CFA_REG, args[0], off, 0)
        elif name == "def_cfa_offset":
            kind, reg, _off, _plt = state["cfa"]
            state["cfa"] = (kind if kind == CFA_REG else CFA_UNSUPPORTED, reg, _clamp(args[0]), 0)
        elif name == "def_cfa_offset_sf":
            kind, reg, _off, _plt = state["cfa"]
            state["cfa"] = (kind if kind == CFA_REG else CFA_UNSUPPORTED, reg, _clamp(args[0] * data_align), 0)
        elif name == "def_cfa_expression":
            state["cfa"] = _cfa_expression(bytes(args[0]))
        elif name in ("offset", "offset_extended", "offset_extended_sf"):
            set_reg(args[0], _clamp(args[1] * data_align))
        elif name in ("restore", "restore_extended"):
            set_reg(args[0], initial[RA] if args[0] == ra_reg else initial[RBP])
        elif name == "undefined":
            set_reg(args[0], UNDEFINED)
        elif name == "same_value":
            set_reg(args[0], SAME)
        elif name == "expression":
            set_reg(args[0], _at_sp(bytes(args[1])))
        elif name in ("register", "val_expression", "val_offset", "val_offset_sf"):
            set_reg(args[0], UNSUPPORTED)
        elif name == "remember_state":
            if len(remembered) >= MAX_REMEMBER:
                return
            remembered.append(dict(state))
        elif name == "restore_state" and remembered:  # the CFA rule too, as gcc's epilogues expect
            state.clear()
            state.update(remembered.pop())
        # nop, GNU_args_size, GNU_window_save: nothing to follow
    emit(end)


def _signed(addr: int) -> int:
    """An address below 2**64 as the int64 of its bits (a kernel's high addresses; `_table` reads them back)."""
    return addr - (1 << 64) if addr >= 1 << 63 else addr


def _clamp(off: int) -> int:
    return off if -(1 << 30) < off < 1 << 30 else UNSUPPORTED


_NAMES: dict[int, str] = {}


def _name(opcode: int) -> str:
    if not _NAMES:
        from elftools.dwarf import constants

        for k, v in vars(constants).items():
            if k.startswith("DW_CFA_") and isinstance(v, int):
                _NAMES.setdefault(v, k[len("DW_CFA_"):])
    return _NAMES.get(opcode, "")
