"""The hardened ELF reader: function symbols, loadable segments and the GNU build id of an object file.

Object files come from guest bundles (hostile) and from the host's own processes (maybe corrupt or
replaced while read), so every size, count and offset is checked before pyelftools sees the file, no
link is followed (`open_regular`), and any failure of a malformed file is one `ElfError` line: that
object's addresses stay unresolved, the analysis goes on.  The fuzz target `tests/fuzz/fuzz_bundle.py
elf` drives `elf_symbols_from_bytes`.
"""

from __future__ import annotations

import functools
import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import numpy as np

from vmprof_tui.resolve import cache
from vmprof_tui.resolve.symtab import SymbolTable
from vmprof_tui.resolve.untrusted import (
    DEFAULT_LIMITS,
    MAX_NAME,
    U64_MAX,
    BundleError,
    Limits,
    open_regular,
    safe_text,
)

T = TypeVar("T")

ET_EXEC, ET_DYN = 2, 3
NO_ADDR = np.uint64(U64_MAX)  # "no address" in uint64 arrays
HASHED_BYTES = 16 << 20  # files up to this size are cached by content (read_elf_symbols)


class ElfError(BundleError):
    """An object file is not an ELF file this reader accepts."""


class MappedFile(Protocol):
    """Where a file is mapped: a guest bundle's map or a host process's (anything with these two)."""

    start: int  # the first mapped address
    offset: int  # the file offset mapped there


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int  # PF_X 1, PF_W 2, PF_R 4


@dataclass
class ElfSymbols(SymbolTable):
    """Function symbols of one ELF file (a symbol without size ends where the next one starts) and its
    loadable segments."""

    segments: list[Segment]
    elf_type: int  # ET_EXEC, ET_DYN
    build_id: str | None

    def link_addrs(self, m: MappedFile, addrs: np.ndarray) -> np.ndarray:
        """Link-time addresses for sampled addresses inside mapping `m` of this file: as they are for an
        executable linked at its run address, else through the file offset (NO_ADDR where none)."""
        if self.elf_type == ET_EXEC:
            return np.asarray(addrs, dtype=np.uint64)
        return self.vaddrs_for_map(m, addrs)

    def file_offsets_to_vaddrs(self, offsets: np.ndarray) -> np.ndarray:
        """Map file offsets to link-time addresses through the PT_LOAD segments (uint64; NO_ADDR where
        no segment covers the offset)."""
        off = np.asarray(offsets, dtype=np.uint64)
        out = np.full(off.shape, NO_ADDR, dtype=np.uint64)
        free = np.ones(off.shape, dtype=bool)
        for seg in self.segments:
            if seg.filesz <= 0:
                continue
            lo = np.uint64(seg.offset)
            hi = np.uint64(min(seg.offset + seg.filesz, U64_MAX))
            inside = free & (off >= lo) & (off < hi)
            out[inside] = (off[inside] - lo) + np.uint64(seg.vaddr)  # uint64: wraps, never raises
            free &= ~inside
        return out

    def vaddrs_for_map(self, m: MappedFile, addrs: np.ndarray) -> np.ndarray:
        """Link-time addresses for sampled virtual addresses inside mapping `m` of this file (NO_ADDR
        where the file offset lies outside every PT_LOAD segment)."""
        a = np.asarray(addrs, dtype=np.uint64) - np.uint64(m.start)
        a = a + np.uint64(m.offset) if m.offset >= 0 else a - np.uint64(-m.offset)
        return self.file_offsets_to_vaddrs(a)


@functools.cache
def _elf_errors() -> tuple[type[BaseException], ...]:
    from elftools.common.exceptions import ELFError, ELFParseError
    from elftools.construct.core import ConstructError

    return (ELFError, ELFParseError, ConstructError, struct.error, ValueError, KeyError, IndexError, TypeError,
            AttributeError, OverflowError, ZeroDivisionError, UnicodeDecodeError, AssertionError, RecursionError)


_SYM64 = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                   ("value", "<u8"), ("size", "<u8")])
_SYM32 = np.dtype([("name", "<u4"), ("value", "<u4"), ("size", "<u4"), ("info", "u1"), ("other", "u1"),
                   ("shndx", "<u2")])
STT_FUNC, STT_GNU_IFUNC = 2, 10
SHT_SYMTAB, SHT_DYNSYM, SHT_STRTAB, PT_LOAD, PT_NOTE = 2, 11, 3, 1, 4
MAX_STRTAB = 256 << 20


def check_elf_header(head: bytes, size: int, limits: Limits, what: str) -> tuple[bool, str]:
    """Cheap structural checks before any ELF library sees the file: ('64-bit?', endianness)."""
    if len(head) < 52 or head[:4] != b"\x7fELF":
        raise ElfError(f"{what}: not an ELF file")
    if head[4] not in (1, 2) or head[5] not in (1, 2) or head[6] != 1:
        raise ElfError(f"{what}: malformed ELF: bad class, data encoding or version")
    is64, endian = head[4] == 2, "<" if head[5] == 1 else ">"
    if is64:
        if len(head) < 64:
            raise ElfError(f"{what}: malformed ELF: truncated header")
        phoff, shoff = struct.unpack_from(endian + "QQ", head, 32)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHHHH", head, 54)
        want_ph, want_sh = 56, 64
    else:
        phoff, shoff = struct.unpack_from(endian + "II", head, 28)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHHHH", head, 42)
        want_ph, want_sh = 32, 40
    if phnum and (phentsize != want_ph or phoff + phnum * phentsize > size or phnum > limits.max_elf_segments):
        raise ElfError(f"{what}: malformed ELF: program header table out of bounds")
    if shoff and (shentsize != want_sh or shoff + max(shnum, 1) * shentsize > size):
        raise ElfError(f"{what}: malformed ELF: section header table out of bounds")
    if shnum > limits.max_elf_sections:
        raise ElfError(f"{what}: {shnum} sections, over the limit of {limits.max_elf_sections}")
    if shnum and shstrndx >= shnum and shstrndx != 0xFFFF:
        raise ElfError(f"{what}: malformed ELF: section name table index out of range")
    return is64, endian


def read_elf_symbols(path: Path, limits: Limits = DEFAULT_LIMITS, host: bool = False) -> ElfSymbols:
    """Function symbols (.symtab, else also .dynsym) and PT_LOAD segments of an untrusted ELF file; parsed
    once per file (resolve/cache.py), later runs load the arrays.  A file up to HASHED_BYTES is known by
    its content (guest objects extracted anew for every run hit the cache too); a larger one, and a `host`
    file (one a host process mapped, at its path on this machine), by its identity here (path, device, inode,
    size, mtime): hashing a 100 MB library would cost more than the cache saves, and a busy host's report
    would read and hash hundreds of MB of libraries on every run."""
    return parsed_once(path, "elf", limits, _parse_elf_guarded, _to_arrays, _from_arrays, by_identity=host)


def parsed_once(path: Path, kind: str, limits: Limits, parse: Callable[[BinaryIO, int, Limits, str], T],
                to_arrays: Callable[[T], dict], from_arrays: Callable[[dict], T], by_identity: bool = False) -> T:
    """`parse(file, size, limits, name)` of an untrusted object file, once per file (resolve/cache.py, as `kind`):
    a file up to HASHED_BYTES is known by its content, a larger one (or any, by_identity) by its identity on this
    machine.  Identity is for files at their own paths only: an extracted guest file's size and mtime are the
    guest's, and its inode may be an earlier extraction's."""
    what = Path(path).name
    with open_regular(Path(path), limits.max_object_bytes, what) as f:
        st = os.fstat(f.fileno())
        source: BinaryIO = f
        if st.st_size <= HASHED_BYTES and not by_identity:
            data = f.read(HASHED_BYTES + 1)
            key = cache.content_key(kind, data)
            source = io.BytesIO(data)
        else:
            key = cache.content_key(f"{kind}-file", f"{path}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0"
                                                    f"{st.st_mtime_ns}".encode())
        size = st.st_size if source is f else len(data)
        return cache.parsed(key, lambda: parse(source, size, limits, what), to_arrays, from_arrays)


def read_elf_symbols_uncached(path: Path, limits: Limits = DEFAULT_LIMITS) -> ElfSymbols:
    """The same, without the cache: `vmprof agent` reads each build once and keeps it in its spool, so the
    measured host is spared hashing and writing cache files."""
    what = Path(path).name
    with open_regular(Path(path), limits.max_object_bytes, what) as f:
        return _parse_elf_guarded(f, os.fstat(f.fileno()).st_size, limits, what)


def _to_arrays(e: ElfSymbols) -> dict[str, np.ndarray]:
    segs = np.array([(g.vaddr, g.offset, g.filesz, g.memsz, g.flags) for g in e.segments], np.uint64).reshape(-1, 5)
    return {"starts": e.starts, "ends": e.ends, "names": cache.pack_strings(e.names.tolist()),
            "count": np.array([len(e.names)]), "segments": segs, "elf_type": np.array([e.elf_type]),
            "build_id": np.array([e.build_id or ""])}


def _from_arrays(a: dict[str, np.ndarray]) -> ElfSymbols:
    segments = [Segment(*(int(v) for v in row)) for row in a["segments"].tolist()]
    return ElfSymbols(starts=a["starts"], ends=a["ends"], names=cache.packed_names(a["names"], int(a["count"][0])),
                      segments=segments, elf_type=int(a["elf_type"][0]), build_id=str(a["build_id"][0]) or None)


def elf_symbols_from_bytes(data: bytes, limits: Limits = DEFAULT_LIMITS, what: str = "object") -> ElfSymbols:
    """The same for an in-memory file (used by the fuzz target)."""
    return _parse_elf_guarded(io.BytesIO(data), len(data), limits, what)


def _parse_elf_guarded(f: BinaryIO, size: int, limits: Limits, what: str) -> ElfSymbols:
    return guarded(_parse_elf, "ELF", f, size, limits, what)


def guarded(parse: Callable[[BinaryIO, int, Limits, str], T], part: str, f: BinaryIO, size: int, limits: Limits,
            what: str) -> T:
    """`parse` of an untrusted object file with every failure of a malformed one (its `part`: ELF, call-frame
    information) turned into one ElfError line."""
    try:
        return parse(f, size, limits, what)
    except BundleError:
        raise
    except MemoryError:
        raise ElfError(f"{what}: malformed {part}: sizes too large to read") from None
    except _elf_errors() as e:
        raise ElfError(f"{what}: malformed {part}: {type(e).__name__}: {str(e)[:200]}") from None
    except OSError as e:
        raise ElfError(f"{what}: read error: {e.strerror or e}") from None


def _read_at(f: BinaryIO, offset: int, length: int, size: int, what: str) -> bytes:
    if offset < 0 or length < 0 or offset + length > size:
        raise ElfError(f"{what}: malformed ELF: data out of bounds")
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise ElfError(f"{what}: truncated while reading")
    return data


def _parse_elf(f: BinaryIO, size: int, limits: Limits, what: str) -> ElfSymbols:
    from elftools.elf.elffile import ELFFile

    f.seek(0)
    head = f.read(64)
    is64, endian = check_elf_header(head, size, limits, what)
    f.seek(0)
    elf = ELFFile(f)
    segments: list[Segment] = []
    nseg = elf.num_segments()
    if nseg > limits.max_elf_segments:
        raise ElfError(f"{what}: {nseg} segments, over the limit of {limits.max_elf_segments}")
    for i in range(nseg):
        seg = elf.get_segment(i).header
        if seg["p_type"] == "PT_LOAD":
            segments.append(Segment(int(seg["p_vaddr"]), int(seg["p_offset"]), int(seg["p_filesz"]),
                                    int(seg["p_memsz"]), int(seg["p_flags"])))
    build_id = _phdr_build_id(f, head, size, is64, endian, what)
    nsec = elf.num_sections()
    if nsec > limits.max_elf_sections:
        raise ElfError(f"{what}: {nsec} sections, over the limit of {limits.max_elf_sections}")
    tables: dict[str, tuple[int, int, int]] = {}  # kind -> (offset, size, strtab index)
    # Section headers only (pyelftools' get_section would build section objects and follow their links).
    headers = [elf._get_section_header(i) for i in range(nsec)]
    for h in headers:
        kind = {"SHT_SYMTAB": "symtab", "SHT_DYNSYM": "dynsym"}.get(h["sh_type"])
        if kind and kind not in tables:
            tables[kind] = (int(h["sh_offset"]), int(h["sh_size"]), int(h["sh_link"]))
    dtype = _SYM64 if is64 else _SYM32
    if endian == ">":
        dtype = dtype.newbyteorder(">")
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    names: list[str] = []
    total = 0
    for kind in ("symtab", "dynsym"):
        if kind not in tables:
            continue
        off, length, link = tables[kind]
        count = length // dtype.itemsize
        total += count
        if total > limits.max_symbols:
            raise ElfError(f"{what}: {total} symbols, over the limit of {limits.max_symbols}")
        if not 0 < link < nsec:
            raise ElfError(f"{what}: malformed ELF: {kind} links to no string table")
        strh = headers[link]
        if strh["sh_type"] != "SHT_STRTAB":
            raise ElfError(f"{what}: malformed ELF: {kind} string table has the wrong type")
        if count == 0:
            continue
        if int(strh["sh_size"]) > MAX_STRTAB:
            raise ElfError(f"{what}: a string table of {int(strh['sh_size'])} bytes, over the limit of {MAX_STRTAB}")
        syms = np.frombuffer(_read_at(f, off, count * dtype.itemsize, size, what), dtype=dtype)
        strtab = _read_at(f, int(strh["sh_offset"]), int(strh["sh_size"]), size, what)
        kinds = syms["info"] & 0xF
        keep = ((kinds == STT_FUNC) | (kinds == STT_GNU_IFUNC)) & (syms["shndx"] != 0) & (syms["value"] != 0)
        chosen = syms[keep]
        for name_off in chosen["name"].tolist():
            if name_off >= len(strtab):
                names.append("?")
                continue
            end = strtab.find(b"\0", name_off, name_off + MAX_NAME)
            raw = strtab[name_off:end if end >= 0 else name_off + MAX_NAME]
            names.append(safe_text(raw.decode("utf-8", "replace"), MAX_NAME))
        value = chosen["value"].astype(np.uint64)
        starts.append(value)
        ends.append(value + chosen["size"].astype(np.uint64))
    if starts:
        s = np.concatenate(starts)
        e = np.concatenate(ends)
        n = np.array(names, dtype=object)
        order = np.lexsort((n.astype(str), s))
        s, e, n = s[order], e[order], n[order]
        # .dynsym repeats .symtab entries: keep the first of each (start, name) pair
        keep = np.ones(len(s), dtype=bool)
        keep[1:] = (s[1:] != s[:-1]) | (n[1:] != n[:-1])
        s, e, n = s[keep], e[keep], n[keep]
        nxt = np.append(s[1:], np.uint64(U64_MAX))
        no_size = e <= s
        e = np.where(no_size, np.maximum(nxt, s + np.uint64(1)), e)
    else:
        s = np.zeros(0, dtype=np.uint64)
        e = np.zeros(0, dtype=np.uint64)
        n = np.zeros(0, dtype=object)
    e_type = {"ET_EXEC": ET_EXEC, "ET_DYN": ET_DYN}.get(elf.header["e_type"], 0)
    return ElfSymbols(starts=s, ends=e, names=n, segments=segments, elf_type=e_type, build_id=build_id)


def read_build_id(path: Path, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """The GNU build id of an ELF file from its program headers alone (None: none, or not a usable ELF)."""
    what = Path(path).name
    try:
        with open_regular(Path(path), limits.max_object_bytes, what) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            is64, endian = check_elf_header(head, size, limits, what)
            return _phdr_build_id(f, head, size, is64, endian, what)
    except (BundleError, OSError, struct.error):
        return None


def _phdr_build_id(f: BinaryIO, head: bytes, size: int, is64: bool, endian: str, what: str) -> str | None:
    """The build id in the first PT_NOTE segment that has one (`head`: the ELF header, checked by
    check_elf_header)."""
    (phoff,) = struct.unpack_from(endian + ("Q" if is64 else "I"), head, 32 if is64 else 28)
    phentsize, phnum = struct.unpack_from(endian + "HH", head, 54 if is64 else 42)
    table = _read_at(f, phoff, phentsize * phnum, size, what)
    for i in range(phnum):
        if is64:
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(endian + "IIQQQQ", table,
                                                                                    i * phentsize)
        else:
            p_type, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(endian + "IIIII", table, i * phentsize)
        if p_type == PT_NOTE and 0 < p_filesz <= 1 << 16:
            build_id = _note_build_id(_read_at(f, p_offset, p_filesz, size, what), endian)
            if build_id:
                return build_id
    return None


def _note_build_id(data: bytes, endian: str) -> str | None:
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(endian + "III", data, pos)
        pos += 12
        desc = pos + ((namesz + 3) & ~3)
        if desc + descsz > len(data):
            return None
        if ntype == 3 and data[pos:pos + namesz].rstrip(b"\0") == b"GNU" and 0 < descsz <= 64:
            return data[desc:desc + descsz].hex()
        pos = desc + ((descsz + 3) & ~3)
    return None
