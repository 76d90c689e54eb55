"""Guest bundles on the host (docs/bundle.md): reading hostile input safely.

A bundle comes from inside a guest, so everything in it is untrusted: the index
may lie about types and sizes, the tar may hold links, devices, traversal names
or decompression bombs, the object files may be malformed ELF.  This module
bounds every size and count (`Limits`), follows no link, never writes outside a
private folder, never unpickles or executes anything, and reports a rejected
bundle with one line (`BundleError`).  The caller then leaves that guest's rows
as raw addresses with the message as a note; other guests are unaffected.

Demo VMs and real guests (the `vmprof-guest` agent) write the same format, so
both resolve through this one code path.
"""

from __future__ import annotations

import bz2
import errno
import functools
import gzip
import io
import json
import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

FORMAT = "vmprof-guest-bundle"
VERSIONS = (1,)
INDEX = "bundle.json"
KALLSYMS = "kallsyms"
OBJECT_RE = re.compile(r"^objects/([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")
CR3_ADDR_MASK = 0x000F_FFFF_FFFF_F000  # bits 51:12 of CR3: the page-table root
U64_MAX = (1 << 64) - 1
ET_EXEC, ET_DYN = 2, 3
NO_ADDR = np.uint64(U64_MAX)  # "no address" in uint64 arrays


@dataclass(frozen=True)
class Limits:
    """Bounds on what one bundle may contain.  Defaults fit any real guest with room to spare."""

    max_index_bytes: int = 64 << 20  # bundle.json
    max_kallsyms_bytes: int = 64 << 20
    max_object_bytes: int = 512 << 20  # one object file
    max_total_bytes: int = 4 << 30  # everything in the bundle (decompressed)
    max_members: int = 100_000  # files in a tar or under objects/
    max_processes: int = 100_000
    max_maps_per_process: int = 100_000
    max_maps_total: int = 2_000_000
    max_symbols: int = 4_000_000  # kallsyms lines; symbols of one ELF file
    max_string: int = 4096  # one name, path or argument
    max_list: int = 100_000  # cmdline arguments, tids, modules, notes, cr3 values
    max_tar_header_bytes: int = 1 << 20  # one PAX or GNU long-name header
    max_elf_sections: int = 32_768
    max_elf_segments: int = 4_096


DEFAULT_LIMITS = Limits()


class BundleError(Exception):
    """A bundle (or one of its files) was rejected; str() is one line saying why."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


class ElfError(BundleError):
    """An object file is not an ELF file this reader accepts."""


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _safe_text(value: str, limit: int) -> str:
    """Guest strings end up in terminals: no control characters, bounded length."""
    value = value[:limit]
    return value.translate(_CONTROL) if _CONTROL_RE.search(value) else value


_CONTROL = {i: "?" for i in [*range(32), 127]}
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


# -- the data model ------------------------------------------------------------------


@dataclass
class SymbolTable:
    """Sorted function ranges: addresses in [starts[i], ends[i]) belong to names[i].  One class for host
    and guest kallsyms and ELF symbol tables, so every lookup behaves alike."""

    starts: np.ndarray  # uint64, sorted
    ends: np.ndarray  # uint64, exclusive
    names: np.ndarray  # object (str)

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, addrs: np.ndarray) -> np.ndarray:
        """Index of the symbol containing each address, -1 where none does."""
        a = np.asarray(addrs, dtype=np.uint64)
        idx = np.searchsorted(self.starts, a, side="right").astype(np.int64) - 1
        ok = idx >= 0
        ok[ok] &= a[ok] < self.ends[idx[ok]]
        return np.where(ok, idx, -1)

    @functools.cached_property
    def names_or_unknown(self) -> np.ndarray:
        """Names with '[unknown]' last so that index -1 reads it."""
        return np.append(self.names, "[unknown]").astype(object)


@dataclass
class KernelSymbols(SymbolTable):
    """Kernel text symbols from a kallsyms text; each ends where the next one starts."""

    modules: np.ndarray  # object (str, "" for the kernel image)

    @functools.cached_property
    def _bracketed_modules(self) -> np.ndarray:
        """'[module]' per symbol, '' for the kernel image and (last) for index -1."""
        return np.array([f"[{m}]" if m else "" for m in self.modules.tolist()] + [""], dtype=object)

    def module_labels(self, idx: np.ndarray, image: str) -> np.ndarray:
        """'[module]' for symbols of modules; `image` for the kernel image and for index -1."""
        labels = self._bracketed_modules[idx]
        labels[labels == ""] = image
        return labels


@dataclass
class GuestModule:
    name: str
    start: int
    size: int


@dataclass
class GuestKernel:
    release: str | None
    build_id: str | None
    symbols: KernelSymbols | None
    modules: list[GuestModule] = field(default_factory=list)


@dataclass
class GuestMap:
    start: int
    end: int
    perms: str
    offset: int
    path: str
    object_path: Path | None  # a validated regular file inside the bundle, or None
    build_id: str | None

    @property
    def executable(self) -> bool:
        return "x" in self.perms


@dataclass
class GuestProcess:
    pid: int
    tids: list[int]
    name: str
    cmdline: list[str]
    exe: str | None
    cr3: list[int]  # normalised page-table roots
    maps: list[GuestMap]
    exited: bool = False  # ended during a `vmprof-guest watch` (its CR3 may have been reused since)
    kernel_thread: bool = False


@dataclass
class GuestBundle:
    vm: str
    created_by: str
    cr3_method: str
    kernel: GuestKernel | None
    processes: list[GuestProcess]
    notes: list[str]
    source: Path
    root: Path  # where objects/ lives (the folder itself, or a private extraction folder for tars)
    cr3_detail: dict[str, Any] = field(default_factory=dict)
    _cleanup: Any = field(default=None, repr=False)

    def close(self) -> None:
        """Remove the private extraction folder of a tar bundle (also done when garbage-collected)."""
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> GuestBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- ELF symbols ---------------------------------------------------------------------------


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

    def link_addrs(self, m: GuestMap, addrs: np.ndarray) -> np.ndarray:
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

    def vaddrs_for_map(self, m: GuestMap, addrs: np.ndarray) -> np.ndarray:
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
MAX_NAME = 1024
MAX_STRTAB = 256 << 20


def _open_regular(path: Path, limit: int, what: str) -> BinaryIO:
    """Open a file that must be a regular file (never through a final symlink) no larger than limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BundleError(f"{what} is a symbolic link; links are not followed") from None
        raise BundleError(f"{what}: cannot open: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BundleError(f"{what}: not a regular file")
    if st.st_size > limit:
        os.close(fd)
        raise BundleError(f"{what}: {st.st_size} bytes, over the limit of {limit}")
    return os.fdopen(fd, "rb")


def _check_elf_header(head: bytes, size: int, limits: Limits, what: str) -> tuple[bool, str]:
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


def read_elf_symbols(path: Path, limits: Limits = DEFAULT_LIMITS) -> ElfSymbols:
    """Function symbols (.symtab, else also .dynsym) and PT_LOAD segments of an untrusted ELF file."""
    what = Path(path).name
    with _open_regular(Path(path), limits.max_object_bytes, what) as f:
        return _parse_elf_guarded(f, os.fstat(f.fileno()).st_size, limits, what)


def elf_symbols_from_bytes(data: bytes, limits: Limits = DEFAULT_LIMITS, what: str = "object") -> ElfSymbols:
    """The same for an in-memory file (used by the fuzz target)."""
    return _parse_elf_guarded(io.BytesIO(data), len(data), limits, what)


def _parse_elf_guarded(f: BinaryIO, size: int, limits: Limits, what: str) -> ElfSymbols:
    """_parse_elf with every failure of a malformed file turned into one ElfError line."""
    try:
        return _parse_elf(f, size, limits, what)
    except BundleError:
        raise
    except MemoryError:
        raise ElfError(f"{what}: malformed ELF: sizes too large to read") from None
    except _elf_errors() as e:
        raise ElfError(f"{what}: malformed ELF: {type(e).__name__}: {e}") from None
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
    is64, endian = _check_elf_header(head, size, limits, what)
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
            names.append(_safe_text(raw.decode("utf-8", "replace"), MAX_NAME))
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
        with _open_regular(Path(path), limits.max_object_bytes, what) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            is64, endian = _check_elf_header(head, size, limits, what)
            return _phdr_build_id(f, head, size, is64, endian, what)
    except (BundleError, OSError, struct.error):
        return None


def _phdr_build_id(f: BinaryIO, head: bytes, size: int, is64: bool, endian: str, what: str) -> str | None:
    """The build id in the first PT_NOTE segment that has one (`head`: the ELF header, checked by
    _check_elf_header)."""
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


# -- CR3 ---------------------------------------------------------------------------------------


def normalise_cr3(value: int) -> int:
    """The page-table root in a sampled CR3: PCID (11:0), LAM (62:61) and no-flush (63) bits cleared.

    With page-table isolation a process runs on two roots 4 KiB apart (kernel and user);
    bundles list both, so bit 12 is kept.
    """
    return int(value) & CR3_ADDR_MASK


def normalise_cr3_array(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.uint64) & np.uint64(CR3_ADDR_MASK)


# -- the index ---------------------------------------------------------------------------------


class _Checker:
    """Type and range checks of the untrusted index, with the JSON path in every message."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def obj(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise BundleError(f"{where} must be an object")
        return value

    def int(self, parent: dict, key: str, where: str, optional: bool = False, lo: int = 0,
            hi: int = U64_MAX) -> int | None:
        value = parent.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BundleError(f"{where}.{key} must be an integer")
        if not lo <= value <= hi:
            raise BundleError(f"{where}.{key} is out of range")
        return value

    def str(self, parent: dict, key: str, where: str, optional: bool = False) -> str | None:
        value = parent.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise BundleError(f"{where}.{key} must be a string")
        if len(value) > self.limits.max_string:
            raise BundleError(f"{where}.{key} is longer than {self.limits.max_string} characters")
        return _safe_text(value, self.limits.max_string)

    def list(self, parent: dict, key: str, where: str, limit: int, optional: bool = False) -> list:
        value = parent.get(key)
        if value is None and optional:
            return []
        if not isinstance(value, list):
            raise BundleError(f"{where}.{key} must be a list")
        if len(value) > limit:
            raise BundleError(f"{where}.{key} has {len(value)} entries, over the limit of {limit}")
        return value

    def build_id(self, parent: dict, key: str, where: str) -> str | None:
        value = self.str(parent, key, where, optional=True)
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{2,128}", value):
            raise BundleError(f"{where}.{key} is not a hex build id")
        return value.lower() if value else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_index(data: bytes, limits: Limits = DEFAULT_LIMITS) -> dict:
    """Decode and check bundle.json (format, version, types, counts).  Object paths are checked by
    the caller against what the bundle really holds."""
    if len(data) > limits.max_index_bytes:
        raise BundleError(f"{INDEX} is {len(data)} bytes, over the limit of {limits.max_index_bytes}")
    try:
        index = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BundleError(f"{INDEX} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{INDEX} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:
        raise BundleError(f"{INDEX} is not acceptable JSON: {e}") from None
    c = _Checker(limits)
    c.obj(index, INDEX)
    if index.get("format") != FORMAT:
        raise BundleError(f"not a guest bundle: {INDEX} format is {str(index.get('format'))[:60]!r}, "
                          f"expected {FORMAT!r}")
    version = index.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise BundleError(f"unsupported bundle version {str(version)[:20]} (this vmprof reads version "
                          f"{', '.join(map(str, VERSIONS))}); upgrade vmprof or use a matching vmprof-guest")
    c.str(index, "vm", INDEX, optional=True)
    c.str(index, "created_by", INDEX, optional=True)
    c.str(index, "cr3_method", INDEX, optional=True)
    kernel = index.get("kernel")
    if kernel is not None:
        c.obj(kernel, f"{INDEX}.kernel")
        c.str(kernel, "release", "kernel", optional=True)
        c.build_id(kernel, "build_id", "kernel")
        ks = c.str(kernel, "kallsyms", "kernel", optional=True)
        if ks is not None and ks != KALLSYMS:
            raise BundleError(f"kernel.kallsyms must be {KALLSYMS!r} or null, not {ks[:60]!r}")
        for i, m in enumerate(c.list(kernel, "modules", "kernel", limits.max_list, optional=True)):
            c.obj(m, f"kernel.modules[{i}]")
            c.str(m, "name", f"kernel.modules[{i}]")
            c.int(m, "start", f"kernel.modules[{i}]")
            c.int(m, "size", f"kernel.modules[{i}]")
    procs = c.list(index, "processes", INDEX, limits.max_processes)
    total_maps = 0
    for i, p in enumerate(procs):
        w = f"processes[{i}]"
        c.obj(p, w)
        c.int(p, "pid", w, hi=(1 << 32) - 1)
        for j, t in enumerate(c.list(p, "tids", w, limits.max_list, optional=True)):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 1 << 32:
                raise BundleError(f"{w}.tids[{j}] must be an integer")
        c.str(p, "name", w, optional=True)
        for j, a in enumerate(c.list(p, "cmdline", w, limits.max_list, optional=True)):
            if not isinstance(a, str) or len(a) > limits.max_string:
                raise BundleError(f"{w}.cmdline[{j}] must be a string of at most {limits.max_string} characters")
        c.str(p, "exe", w, optional=True)
        for j, v in enumerate(c.list(p, "cr3", w, 64, optional=True)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= U64_MAX:
                raise BundleError(f"{w}.cr3[{j}] must be an integer")
        maps = c.list(p, "maps", w, limits.max_maps_per_process, optional=True)
        total_maps += len(maps)
        if total_maps > limits.max_maps_total:
            raise BundleError(f"more than {limits.max_maps_total} maps in all")
        for j, m in enumerate(maps):
            mw = f"{w}.maps[{j}]"
            c.obj(m, mw)
            start = c.int(m, "start", mw)
            end = c.int(m, "end", mw)
            assert start is not None and end is not None
            if end < start:
                raise BundleError(f"{mw} ends before it starts")
            perms = c.str(m, "perms", mw)
            if perms is None or not re.fullmatch(r"[r-][w-][x-][ps-]", perms):
                raise BundleError(f"{mw}.perms must look like 'r-xp'")
            c.int(m, "offset", mw, lo=-(1 << 63), hi=U64_MAX)
            c.str(m, "path", mw, optional=True)
            c.build_id(m, "build_id", mw)
            obj = m.get("object")
            if obj is not None:
                check_object_name(obj, mw)
    c.list(index, "notes", INDEX, limits.max_list, optional=True)
    return index


def check_object_name(name: Any, where: str = "object") -> str:
    """An `object` reference: objects/<key>, relative, no traversal, a plain file name."""
    if not isinstance(name, str):
        raise BundleError(f"{where}.object must be a string or null")
    shown = _safe_text(name, 80)
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise BundleError(f"{where}.object {shown!r} is an absolute path; objects must be under objects/")
    if ".." in name.replace("\\", "/").split("/"):
        raise BundleError(f"{where}.object {shown!r} contains '..' (path traversal)")
    m = OBJECT_RE.match(name)
    if not m or m.group(1) in (".", ".."):
        raise BundleError(f"{where}.object {shown!r} is not objects/<name> with a plain file name")
    return m.group(1)


# -- kallsyms -----------------------------------------------------------------------------------


def parse_kallsyms(data: bytes, limits: Limits = DEFAULT_LIMITS) -> KernelSymbols:
    if len(data) > limits.max_kallsyms_bytes:
        raise BundleError(f"kallsyms is {len(data)} bytes, over the limit of {limits.max_kallsyms_bytes}")
    lines = data.split(b"\n")
    if len(lines) > limits.max_symbols + 1:
        raise BundleError(f"kallsyms has {len(lines)} lines, over the limit of {limits.max_symbols} symbols")
    addrs: list[int] = []
    names: list[str] = []
    mods: list[str] = []
    for n, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3 or len(parts[1]) != 1 or len(parts[0]) > 16:
            raise BundleError(f"kallsyms line {n} is not 'ADDRESS TYPE NAME [MODULE]'")
        if parts[1] not in (b"t", b"T", b"w", b"W"):
            continue
        try:
            addr = int(parts[0], 16)
        except ValueError:
            raise BundleError(f"kallsyms line {n}: bad address") from None
        addrs.append(addr)
        names.append(_safe_text(parts[2][:MAX_NAME].decode("utf-8", "replace"), MAX_NAME))
        mod = parts[3].strip(b"[]") if len(parts) > 3 else b""
        mods.append(_safe_text(mod[:256].decode("utf-8", "replace"), 256))
    a = np.array(addrs, dtype=np.uint64)
    order = np.argsort(a, kind="stable")
    a = a[order]
    ends = np.append(a[1:], a[-1:] + np.uint64(4096))
    return KernelSymbols(starts=a, ends=ends, names=np.array(names, dtype=object)[order],
                         modules=np.array(mods, dtype=object)[order])


# -- reading folders and tars --------------------------------------------------------------------


class _LimitedReader(io.RawIOBase):
    """Reads at most `limit` bytes from a (decompressing) stream: the bound on a tar or gzip bomb."""

    def __init__(self, f: BinaryIO, limit: int, what: str) -> None:
        self.f, self.left, self.what = f, limit, what

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = len(buf)
        if n == 0:
            return 0
        if self.left <= 0:
            raise BundleError(f"{self.what}: more data than the bundle size limit allows (a decompression bomb?)")
        data = self.f.read(min(n, self.left))
        self.left -= len(data)
        buf[: len(data)] = data
        return len(data)


def _safe_tarinfo_class(limits: Limits) -> type[tarfile.TarInfo]:
    class SafeTarInfo(tarfile.TarInfo):
        """Refuses oversized PAX / GNU long-name headers before tarfile reads them into memory."""

        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                             tarfile.GNUTYPE_LONGLINK) and self.size > limits.max_tar_header_bytes:
                raise BundleError(f"tar member {_safe_text(self.name, 80)!r} has an extended header of "
                                  f"{self.size} bytes, over the limit of {limits.max_tar_header_bytes}")
            return super()._proc_member(tar)

    return SafeTarInfo


def _open_decompressed(raw: BinaryIO) -> BinaryIO:
    head = raw.read(6)
    raw.seek(0)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head[:3] == b"BZh":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    if head == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw, mode="rb")  # type: ignore[return-value]
    return raw


def _member_key(name: str) -> str:
    """Classify a tar member name: 'index', 'kallsyms', 'dir', or the object key.  Rejects anything else."""
    shown = _safe_text(name, 80)
    if name.startswith("/"):
        raise BundleError(f"tar member {shown!r} has an absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"tar member {shown!r} contains '..' (path traversal)")
    clean = "/".join(p for p in parts if p not in ("", "."))
    if clean == INDEX:
        return "index"
    if clean == KALLSYMS:
        return "kallsyms"
    if clean in ("", "objects"):
        return "dir"
    m = OBJECT_RE.match(clean)
    if not m or m.group(1) in (".", ".."):
        raise BundleError(f"unexpected tar member {shown!r} (a version-1 bundle holds {INDEX}, {KALLSYMS} "
                          "and objects/<name> only)")
    return m.group(1)


def _copy_limited(src: BinaryIO, dst_fd: int, size: int, what: str) -> None:
    left = size
    while left > 0:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            raise BundleError(f"{what}: truncated")
        os.write(dst_fd, chunk)
        left -= len(chunk)


def _extract_tar(path: Path, workdir: Path, limits: Limits) -> tuple[bytes, bytes | None, dict[str, Path]]:
    """Stream the tar once: keep the index and kallsyms in memory, write objects into workdir/objects.
    Nothing is ever written anywhere else; no link, device or sparse member is accepted."""
    objects_dir = workdir / "objects"
    objects_dir.mkdir(mode=0o700)
    dir_fd = os.open(objects_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    index: bytes | None = None
    kallsyms: bytes | None = None
    objects: dict[str, Path] = {}
    seen: set[str] = set()
    total = members = 0
    try:
        with open(path, "rb") as raw:
            if os.fstat(raw.fileno()).st_size > limits.max_total_bytes + (64 << 20):
                raise BundleError(f"the archive is larger than the bundle limit of {limits.max_total_bytes} bytes")
            stream = _LimitedReader(_open_decompressed(raw), limits.max_total_bytes + (64 << 20), "the archive")
            try:
                tar = tarfile.open(fileobj=io.BufferedReader(stream, 1 << 16), mode="r|",  # noqa: SIM115
                                   tarinfo=_safe_tarinfo_class(limits))
            except _archive_errors() as e:
                raise BundleError(f"not a tar archive, or a corrupt one: {e}") from None
            with tar:
                while True:
                    try:
                        member = tar.next()
                    except _archive_errors() as e:
                        raise BundleError(f"malformed or truncated archive: {e}") from None
                    if member is None:
                        break
                    members += 1
                    if members > limits.max_members:
                        raise BundleError(f"more than {limits.max_members} tar members")
                    tar.members = []  # do not accumulate TarInfo objects
                    key = _member_key(member.name)
                    shown = _safe_text(member.name, 80)
                    if key == "dir":
                        if not member.isdir():
                            raise BundleError(f"tar member {shown!r} must be a directory")
                        continue
                    if member.issym() or member.islnk():
                        raise BundleError(f"tar member {shown!r} is a link; bundles hold regular files only")
                    if not member.isreg() or member.issparse():
                        raise BundleError(f"tar member {shown!r} is not a regular file")
                    if key in seen:
                        raise BundleError(f"tar member {shown!r} appears twice")
                    seen.add(key)
                    limit = {"index": limits.max_index_bytes, "kallsyms": limits.max_kallsyms_bytes}.get(
                        key, limits.max_object_bytes)
                    if member.size > limit:
                        raise BundleError(f"{shown}: {member.size} bytes, over the limit of {limit}")
                    total += member.size
                    if total > limits.max_total_bytes:
                        raise BundleError(f"the bundle holds more than {limits.max_total_bytes} bytes")
                    data = tar.extractfile(member)
                    assert data is not None
                    try:
                        if key in ("index", "kallsyms"):
                            content = data.read(member.size)
                            if len(content) != member.size:
                                raise BundleError(f"{shown}: truncated")
                            if key == "index":
                                index = content
                            else:
                                kallsyms = content
                            continue
                        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o600, dir_fd=dir_fd)
                        try:
                            _copy_limited(data, fd, member.size, shown)
                        finally:
                            os.close(fd)
                        objects[key] = objects_dir / key
                    except _archive_errors() as e:
                        raise BundleError(f"{shown}: the archive is truncated or corrupt ({e})") from None
    except OSError as e:
        raise BundleError(f"cannot read the archive: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)
    if index is None:
        raise BundleError(f"the archive has no {INDEX}")
    return index, kallsyms, objects


@functools.cache
def _archive_errors() -> tuple[type[BaseException], ...]:
    """What tarfile and the decompressors raise on corrupt input (bz2 raises OSError)."""
    import zlib

    return (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


def _read_dir(root: Path, limits: Limits) -> tuple[bytes, bytes | None]:
    idx_path = root / INDEX
    with _open_regular(idx_path, limits.max_index_bytes, INDEX) as f:
        index = f.read(limits.max_index_bytes + 1)
    kallsyms = None
    if (root / KALLSYMS).exists() or (root / KALLSYMS).is_symlink():
        with _open_regular(root / KALLSYMS, limits.max_kallsyms_bytes, KALLSYMS) as f:
            kallsyms = f.read(limits.max_kallsyms_bytes + 1)
    return index, kallsyms


def _check_dir_objects(root: Path, keys: set[str], limits: Limits) -> dict[str, Path]:
    """Each referenced object: objects/ is a real directory, the file a regular file (no link), bounded."""
    if not keys:
        return {}
    objects_dir = root / "objects"
    try:
        st = os.lstat(objects_dir)
    except OSError:
        raise BundleError("objects/ is referenced but missing") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BundleError("objects/ is not a directory (a link is not followed)")
    if len(keys) > limits.max_members:
        raise BundleError(f"more than {limits.max_members} object files")
    dir_fd = os.open(objects_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    out: dict[str, Path] = {}
    total = 0
    try:
        for key in sorted(keys):
            try:
                st = os.stat(key, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                raise BundleError(f"objects/{key} is referenced but missing") from None
            if stat.S_ISLNK(st.st_mode):
                raise BundleError(f"objects/{key} is a symbolic link; links are not followed")
            if not stat.S_ISREG(st.st_mode):
                raise BundleError(f"objects/{key} is not a regular file")
            if st.st_size > limits.max_object_bytes:
                raise BundleError(f"objects/{key}: {st.st_size} bytes, over the limit of {limits.max_object_bytes}")
            total += st.st_size
            if total > limits.max_total_bytes:
                raise BundleError(f"the bundle holds more than {limits.max_total_bytes} bytes")
            out[key] = objects_dir / key
    finally:
        os.close(dir_fd)
    return out


def _check_objects_are_elf(objects: dict[str, Path], limits: Limits) -> None:
    for key, path in objects.items():
        with _open_regular(path, limits.max_object_bytes, f"objects/{key}") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
        _check_elf_header(head, size, limits, f"objects/{key}")


def load_bundle(path: Path, limits: Limits = DEFAULT_LIMITS, workdir: Path | None = None) -> GuestBundle:
    """Read and validate a bundle folder or tar (.tar, .tar.gz, .tar.xz, .tar.bz2).

    Tar bundles are extracted, with all checks, into `workdir` (must not exist yet) or a private
    temporary folder removed by GuestBundle.close().  Raises BundleError with one line.
    """
    path = Path(path)
    try:
        try:
            is_dir = path.is_dir()
        except OSError as e:
            raise BundleError(f"cannot read {path}: {e.strerror}") from None
        if not is_dir and not path.is_file():
            raise BundleError("no such bundle (expected a folder with bundle.json or a tar file)")
        if is_dir:
            return _load_folder(path, limits)
        return _load_tar(path, limits, workdir)
    except BundleError as e:
        raise BundleError(f"guest bundle {path}: {e}") from None


def _load_folder(path: Path, limits: Limits) -> GuestBundle:
    index_bytes, kallsyms = _read_dir(path, limits)
    index = parse_index(index_bytes, limits)
    keys = {check_object_name(m["object"]) for p in index["processes"] for m in p.get("maps") or []
            if m.get("object") is not None}
    objects = _check_dir_objects(path, keys, limits)
    _check_objects_are_elf(objects, limits)
    return _build(index, kallsyms, objects, path, path, limits)


def _load_tar(path: Path, limits: Limits, workdir: Path | None) -> GuestBundle:
    if workdir is None:
        work = Path(tempfile.mkdtemp(prefix="vmprof-bundle-"))
    else:
        work = Path(workdir)
        try:
            work.mkdir(mode=0o700, parents=False)
        except OSError as e:
            raise BundleError(f"cannot create the extraction folder {work}: {e.strerror}") from None
    cleanup = functools.partial(shutil.rmtree, work, ignore_errors=True)
    try:
        index_bytes, kallsyms, extracted = _extract_tar(path, work, limits)
        index = parse_index(index_bytes, limits)
        objects: dict[str, Path] = {}
        for p in index["processes"]:
            for m in p.get("maps") or []:
                if m.get("object") is not None:
                    key = check_object_name(m["object"])
                    if key not in extracted:
                        raise BundleError(f"{m['object']} is referenced but not in the archive")
                    objects[key] = extracted[key]
        _check_objects_are_elf(objects, limits)
        bundle = _build(index, kallsyms, objects, path, work, limits)
    except BaseException:
        cleanup()
        raise
    bundle._cleanup = weakref.finalize(bundle, cleanup)
    return bundle


def _build(index: dict, kallsyms: bytes | None, objects: dict[str, Path], source: Path, root: Path,
           limits: Limits) -> GuestBundle:
    kernel = None
    k = index.get("kernel")
    if k is not None:
        symbols = None
        if k.get("kallsyms"):
            if kallsyms is None:
                raise BundleError("kernel.kallsyms names a file the bundle does not hold")
            symbols = parse_kallsyms(kallsyms, limits)
        kernel = GuestKernel(release=_opt_text(k.get("release"), limits), build_id=k.get("build_id"),
                             symbols=symbols,
                             modules=[GuestModule(_safe_text(m["name"], 256), m["start"], m["size"])
                                      for m in k.get("modules") or []])
    processes = []
    for p in index["processes"]:
        maps = []
        for m in p.get("maps") or []:
            obj = m.get("object")
            maps.append(GuestMap(start=m["start"], end=m["end"], perms=m["perms"], offset=m["offset"],
                                 path=_safe_text(m.get("path") or "", limits.max_string),
                                 object_path=objects[check_object_name(obj)] if obj is not None else None,
                                 build_id=(m.get("build_id") or None) and m["build_id"].lower()))
        cr3 = []
        for v in p.get("cr3") or []:
            n = normalise_cr3(v)
            if n not in cr3:
                cr3.append(n)
        processes.append(GuestProcess(
            pid=p["pid"], tids=list(p.get("tids") or [p["pid"]]), name=_safe_text(p.get("name") or "?", 256),
            cmdline=[_safe_text(a, limits.max_string) for a in p.get("cmdline") or []],
            exe=_opt_text(p.get("exe"), limits), cr3=cr3, maps=maps, exited=p.get("exited") is True,
            kernel_thread=p.get("kernel_thread") is True))
    notes = [_safe_text(n, 1000) for n in index.get("notes") or [] if isinstance(n, str)]
    detail = index.get("cr3_detail") if isinstance(index.get("cr3_detail"), dict) else {}
    return GuestBundle(vm=_safe_text(index.get("vm") or source.stem, 256),
                       created_by=_safe_text(index.get("created_by") or "?", 256),
                       cr3_method=_safe_text(index.get("cr3_method") or "none", 64), kernel=kernel,
                       processes=processes, notes=notes, source=source, root=root, cr3_detail=detail)


def _opt_text(value: Any, limits: Limits) -> str | None:
    return _safe_text(value, limits.max_string) if isinstance(value, str) else None


# -- for report/top: which bundles, and loading many with per-guest failures ---------------------


def parse_bundle_arg(text: str) -> tuple[str, Path]:
    """`--guest-bundle VM=PATH` → (VM, PATH); ValueError with a usage message otherwise."""
    vm, sep, path = text.partition("=")
    if not sep or not vm or not path:
        raise ValueError(f"--guest-bundle expects VM=PATH, got {text!r}")
    return vm, Path(path)


def find_recording_bundles(recording: Path) -> dict[str, Path]:
    """Bundles stored with a recording: REC/guests/<vm>/ (a bundle folder) or REC/guests/<vm>.tar[.gz]."""
    guests = Path(recording) / "guests"
    found: dict[str, Path] = {}
    if not guests.is_dir():
        return found
    for entry in sorted(guests.iterdir()):
        if entry.is_dir() and (entry / INDEX).is_file():
            found[entry.name] = entry
        else:
            for suffix in (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2"):
                if entry.name.endswith(suffix) and entry.is_file():
                    found[entry.name[: -len(suffix)]] = entry
    return found
