"""Instruction tables per function, by a linear capstone sweep from the function's start.

A block [start, end] is counted as the instructions of this table from the one at
`start` to the one at `end`, both inclusive.  Starting the sweep at the function's first
byte (not at the block start) keeps x86's variable-length decoding in step with the
compiler's instruction boundaries; a block endpoint that is not one of those boundaries
is impossible and gets rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone
import numpy as np

from vmprof_tui.lbr.model import CodeReader

KIND_OTHER = 0
KIND_JCC = 1  # conditional branch (jcc, loop, jrcxz)
KIND_JMP = 2
KIND_CALL = 3
KIND_RET = 4
KIND_FAR = 5  # syscall, sysenter, int, iret, sysret: leaves the user-mode instruction stream
KIND_NAMES = {KIND_OTHER: "-", KIND_JCC: "jcc", KIND_JMP: "jmp", KIND_CALL: "call", KIND_RET: "return",
              KIND_FAR: "far"}
MAX_FUNCTION_BYTES = 4 << 20

_FAR = {"syscall", "sysenter", "sysexit", "sysret", "sysretq", "int", "int1", "int3", "into", "iret", "iretd",
        "iretq", "ud2", "hlt"}


def classify(mnemonic: str) -> int:
    m = mnemonic.split()[-1] if mnemonic else ""  # drop prefixes such as "bnd", "notrack", "rep"
    if m.startswith("call"):
        return KIND_CALL
    if m.startswith("ret"):
        return KIND_RET
    if m.startswith("jmp") or m == "ljmp":
        return KIND_JMP
    if m.startswith("j") or m.startswith("loop"):
        return KIND_JCC
    if m in _FAR:
        return KIND_FAR
    return KIND_OTHER


@dataclass
class FunctionCode:
    """The instruction table of one function: addresses (vaddr), sizes, kinds, direct targets."""

    object_path: str
    name: str
    start: int
    end: int
    addrs: np.ndarray  # uint64, ascending
    sizes: np.ndarray  # uint8
    kinds: np.ndarray  # int8, KIND_*
    targets: np.ndarray  # uint64 direct branch target, 0 if indirect or not a branch
    cum_branches: np.ndarray  # int64, len n+1: branch instructions (any kind but OTHER) before index k
    cum_uncond: np.ndarray  # int64, len n+1: unconditional transfers (jmp, call, return, far) before index k

    @property
    def n(self) -> int:
        return int(self.addrs.shape[0])

    def index_of(self, vaddr: int) -> int:
        """Index of the instruction starting exactly at `vaddr`, or -1."""
        i = int(np.searchsorted(self.addrs, np.uint64(vaddr)))
        return i if i < self.n and int(self.addrs[i]) == vaddr else -1


def decode_function(code: bytes, object_path: str, name: str, start: int, end: int) -> FunctionCode:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    code = code[: max(0, min(end - start, MAX_FUNCTION_BYTES))]
    addrs: list[int] = []
    sizes: list[int] = []
    kinds: list[int] = []
    targets: list[int] = []
    off = 0
    while off < len(code):
        last_end = off
        for addr, size, mnemonic, op_str in md.disasm_lite(code[off:], start + off):
            k = classify(mnemonic)
            addrs.append(addr)
            sizes.append(size)
            kinds.append(k)
            tgt = 0
            if k in (KIND_CALL, KIND_JMP, KIND_JCC) and op_str.startswith("0x"):
                try:
                    tgt = int(op_str, 16)
                except ValueError:
                    tgt = 0
            targets.append(tgt)
            last_end = addr + size - start
        # capstone stops at an undecodable byte: skip it (addresses in it are no instruction boundaries)
        off = last_end + 1 if last_end < len(code) else last_end
    kinds_a = np.array(kinds, dtype=np.int8)
    cum = np.zeros(len(kinds) + 1, dtype=np.int64)
    np.cumsum(kinds_a != KIND_OTHER, out=cum[1:])
    cum_u = np.zeros(len(kinds) + 1, dtype=np.int64)
    np.cumsum((kinds_a != KIND_OTHER) & (kinds_a != KIND_JCC), out=cum_u[1:])
    return FunctionCode(object_path, name, start, end, np.array(addrs, dtype=np.uint64),
                        np.array(sizes, dtype=np.uint8), kinds_a, np.array(targets, dtype=np.uint64), cum, cum_u)


class CodeCache:
    """Decoded functions, keyed by (object path, function start); decoded once."""

    def __init__(self, read_code: CodeReader) -> None:
        self.read_code = read_code
        self._funcs: dict[tuple[str, int], FunctionCode] = {}

    def get(self, object_path: str, name: str, start: int, end: int) -> FunctionCode:
        key = (object_path, start)
        fc = self._funcs.get(key)
        if fc is None:
            size = max(0, min(end - start, MAX_FUNCTION_BYTES))
            fc = decode_function(self.read_code(object_path, start, size), object_path, name, start, end)
            self._funcs[key] = fc
        return fc


def listing(read_code: CodeReader, object_path: str, start: int, end: int) -> list[tuple[int, int, str, str]]:
    """(address, size, mnemonic, operands) of each instruction of [start, end), by the same linear sweep as
    decode_function (an undecodable byte is shown as `.byte`)."""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    code = read_code(object_path, start, max(0, min(end - start, MAX_FUNCTION_BYTES)))
    out: list[tuple[int, int, str, str]] = []
    off = 0
    while off < len(code):
        last_end = off
        for addr, size, mnemonic, op_str in md.disasm_lite(code[off:], start + off):
            out.append((addr, size, mnemonic, op_str))
            last_end = addr + size - start
        if last_end < len(code):
            out.append((start + last_end, 1, ".byte", f"{code[last_end]:#04x}"))
            last_end += 1
        off = last_end
    return out
