"""Object files on disk: function symbols and code bytes (pyelftools), and a resolver
from runtime addresses to (object, vaddr, function) for the block analysis.

Object files may come from guests and are then untrusted: every parse error becomes
:class:`ElfError` (the caller degrades that object's addresses to "unresolved"), sizes
are bounded, nothing is executed.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from vmprof_tui.lbr.model import ResolvedAddr

MAX_OBJECT_BYTES = 1 << 30
MAX_SYMBOLS = 2_000_000
PF_X = 1


class ElfError(Exception):
    """An object file that cannot be used (missing, not ELF, corrupt)."""


@dataclass(frozen=True)
class Segment:
    vaddr: int
    memsz: int
    offset: int
    filesz: int
    executable: bool


class ElfImage:
    """Function symbols and loadable segments of one ELF file."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            size = os.path.getsize(path)
            if size > MAX_OBJECT_BYTES:
                raise ElfError(f"{path}: {size} bytes is larger than the {MAX_OBJECT_BYTES} byte limit")
            with open(path, "rb") as f:
                self._data = f.read()
            import io

            elf = ELFFile(io.BytesIO(self._data))
            self.is_pie = elf.header["e_type"] == "ET_DYN"
            if elf.header["e_machine"] != "EM_X86_64":
                raise ElfError(f"{path}: not an x86-64 object ({elf.header['e_machine']})")
            self.segments = [
                Segment(int(s["p_vaddr"]), int(s["p_memsz"]), int(s["p_offset"]), int(s["p_filesz"]),
                        bool(s["p_flags"] & PF_X))
                for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            self._load_symbols(elf)
        except ELFError as e:
            raise ElfError(f"{path}: not a usable ELF file: {e}") from e
        except OSError as e:
            raise ElfError(f"{path}: {e.strerror or e}") from e
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            raise ElfError(f"{path}: corrupt ELF file: {e}") from e

    def _load_symbols(self, elf: ELFFile) -> None:
        found: dict[int, tuple[int, int, str]] = {}  # start -> (size, rank, name)
        count = 0
        for secname in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(secname)
            if sec is None or not hasattr(sec, "iter_symbols"):
                continue
            for sym in sec.iter_symbols():
                count += 1
                if count > MAX_SYMBOLS:
                    raise ElfError(f"{self.path}: more than {MAX_SYMBOLS} symbols")
                if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                start, size, name = int(sym["st_value"]), int(sym["st_size"]), sym.name
                if not name:
                    continue
                rank = 0 if sym["st_info"]["bind"] == "STB_GLOBAL" else 1
                old = found.get(start)
                if old is None or (rank, -size, name) < (old[1], -old[0], old[2]):
                    found[start] = (size, rank, name)
        starts = sorted(found)
        ends: list[int] = []
        for i, s in enumerate(starts):
            size = found[s][0]
            if size == 0:  # no size recorded: up to the next symbol or the end of the segment
                seg = self.segment_of(s)
                limit = seg.vaddr + seg.memsz if seg else s + 1
                size = (min(starts[i + 1], limit) if i + 1 < len(starts) else limit) - s
            ends.append(s + max(size, 1))
        self.func_starts = np.array(starts, dtype=np.uint64)
        self.func_ends = np.array(ends, dtype=np.uint64)
        self.func_names = [found[s][2] for s in starts]
        self._by_name: dict[str, list[int]] = {}
        for i, n in enumerate(self.func_names):
            self._by_name.setdefault(n, []).append(i)

    def segment_of(self, vaddr: int) -> Segment | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.memsz:
                return seg
        return None

    def function_at(self, vaddr: int) -> tuple[str, int, int] | None:
        i = int(np.searchsorted(self.func_starts, np.uint64(vaddr), side="right")) - 1
        if i < 0 or vaddr >= int(self.func_ends[i]):
            return None
        return self.func_names[i], int(self.func_starts[i]), int(self.func_ends[i])

    def functions_named(self, name: str) -> list[tuple[int, int]]:
        return [(int(self.func_starts[i]), int(self.func_ends[i])) for i in self._by_name.get(name, [])]

    def read(self, vaddr: int, size: int) -> bytes:
        """Bytes of the file image at [vaddr, vaddr+size), cut at the end of the segment's file data."""
        seg = self.segment_of(vaddr)
        if seg is None:
            return b""
        off = vaddr - seg.vaddr
        n = max(0, min(size, seg.filesz - off))
        return self._data[seg.offset + off: seg.offset + off + n]

    def vaddr_of_offset(self, file_offset: int) -> int | None:
        for seg in self.segments:
            if seg.offset <= file_offset < seg.offset + max(seg.filesz, 1):
                return seg.vaddr + (file_offset - seg.offset)
        return None

    def exec_ranges(self) -> list[tuple[int, int]]:
        return [(s.vaddr, s.vaddr + s.memsz) for s in self.segments if s.executable]


class ImageCache:
    """ElfImage per path, loaded once; remembers files that failed."""

    def __init__(self) -> None:
        self._images: dict[str, ElfImage | ElfError] = {}

    def get(self, path: str) -> ElfImage:
        img = self._images.get(path)
        if img is None:
            try:
                img = ElfImage(path)
            except ElfError as e:
                img = e
            self._images[path] = img
        if isinstance(img, ElfError):
            raise img
        return img

    def read_code(self, path: str, vaddr: int, size: int) -> bytes:
        """A :data:`~vmprof_tui.lbr.model.CodeReader`: code bytes from the file on disk."""
        try:
            return self.get(path).read(vaddr, size)
        except ElfError:
            return b""

    __call__ = read_code


@dataclass
class Mapping:
    start: int  # runtime address range [start, end)
    end: int
    image: ElfImage
    bias: int  # runtime address - vaddr in the file


class ElfResolver:
    """Runtime address -> :class:`ResolvedAddr` over a set of mapped ELF files.

    ``add(path, bias)``: the object is mapped with runtime = vaddr + bias (0 for a non-PIE
    executable).  Only executable segments are mapped.  Callable: ``resolver(addr)``.
    """

    def __init__(self, cache: ImageCache | None = None) -> None:
        self.cache = cache or ImageCache()
        self._maps: list[Mapping] = []
        self._starts: list[int] = []
        self.errors: list[str] = []

    def add(self, path: str, bias: int = 0) -> bool:
        try:
            img = self.cache.get(path)
        except ElfError as e:
            self.errors.append(str(e))
            return False
        for lo, hi in img.exec_ranges():
            self._insert(Mapping(lo + bias, hi + bias, img, bias))
        return True

    def add_mmap(self, path: str, start: int, length: int, pgoff: int) -> bool:
        """An mmap of `path` at runtime [start, start+length) from file offset pgoff."""
        try:
            img = self.cache.get(path)
        except ElfError as e:
            self.errors.append(str(e))
            return False
        vaddr = img.vaddr_of_offset(pgoff)
        if vaddr is None:
            self.errors.append(f"{path}: mmap offset {pgoff:#x} is outside every loadable segment")
            return False
        self._insert(Mapping(start, start + length, img, start - vaddr))
        return True

    def _insert(self, m: Mapping) -> None:
        i = bisect.bisect(self._starts, m.start)
        self._starts.insert(i, m.start)
        self._maps.insert(i, m)

    def mapping_of(self, addr: int) -> Mapping | None:
        i = bisect.bisect(self._starts, addr) - 1
        for j in range(i, max(i - 8, -1), -1):  # mappings rarely overlap; look at a few below
            m = self._maps[j]
            if m.start <= addr < m.end:
                return m
        return None

    def __call__(self, addr: int) -> ResolvedAddr | None:
        m = self.mapping_of(addr)
        if m is None:
            return None
        vaddr = addr - m.bias
        fn = m.image.function_at(vaddr)
        if fn is None:
            return None
        return ResolvedAddr(m.image.path, vaddr, fn[0], fn[1], fn[2])

    def images(self) -> list[ElfImage]:
        seen: dict[str, ElfImage] = {}
        for m in self._maps:
            seen.setdefault(m.image.path, m.image)
        return list(seen.values())
