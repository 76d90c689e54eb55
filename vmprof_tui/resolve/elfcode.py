"""Object files on disk for the block analysis: function symbols and code bytes, and a
resolver from runtime addresses to (object, vaddr, function).

Symbols and segments come from the same hardened reader as guest bundles
(:func:`vmprof_tui.resolve.elf.elf_symbols_from_bytes`), so block tables and profiles name
functions alike and a malformed object raises one :class:`ElfError` line (the caller
degrades that object's addresses to "unresolved").  Nothing is executed.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

import numpy as np

from vmprof_tui.lbr.model import ResolvedAddr
from vmprof_tui.resolve.elf import ElfError, Segment, elf_symbols_from_bytes
from vmprof_tui.resolve.untrusted import DEFAULT_LIMITS

PF_X = 1
EM_X86_64 = 62

__all__ = ["ElfError", "ElfImage", "ElfResolver", "ImageCache"]


class ElfImage:
    """Function symbols, loadable segments and the bytes of one x86-64 ELF file."""

    def __init__(self, path: str) -> None:
        self.path = path
        limit = DEFAULT_LIMITS.max_object_bytes
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise ElfError(f"{path}: {size} bytes is larger than the {limit} byte limit")
                self._data = f.read()
        except OSError as e:
            raise ElfError(f"{path}: {e.strerror or e}") from None
        self.symbols = elf_symbols_from_bytes(self._data, what=path)
        if int.from_bytes(self._data[18:20], "little") != EM_X86_64:  # the header was checked by the reader
            raise ElfError(f"{path}: not an x86-64 object")
        self.segments = self.symbols.segments
        self._by_name: dict[str, list[int]] = {}
        for i, n in enumerate(self.symbols.names.tolist()):
            self._by_name.setdefault(n, []).append(i)

    def segment_of(self, vaddr: int) -> Segment | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.memsz:
                return seg
        return None

    def function_at(self, vaddr: int) -> tuple[str, int, int] | None:
        i = int(self.symbols.lookup(np.array([vaddr], np.uint64))[0])
        if i < 0:
            return None
        return str(self.symbols.names[i]), int(self.symbols.starts[i]), int(self.symbols.ends[i])

    def functions_named(self, name: str) -> list[tuple[int, int]]:
        return [(int(self.symbols.starts[i]), int(self.symbols.ends[i])) for i in self._by_name.get(name, [])]

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
        return [(s.vaddr, s.vaddr + s.memsz) for s in self.segments if s.flags & PF_X]


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
class ImageRange:
    """Executable code of a loaded image at its runtime addresses (not a process's mapping: vmprof_tui.mapping)."""
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
        self._maps: list[ImageRange] = []
        self._starts: list[int] = []
        self.errors: list[str] = []

    def add(self, path: str, bias: int = 0) -> bool:
        try:
            img = self.cache.get(path)
        except ElfError as e:
            self.errors.append(str(e))
            return False
        for lo, hi in img.exec_ranges():
            self._insert(ImageRange(lo + bias, hi + bias, img, bias))
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
        self._insert(ImageRange(start, start + length, img, start - vaddr))
        return True

    def _insert(self, m: ImageRange) -> None:
        i = bisect.bisect(self._starts, m.start)
        self._starts.insert(i, m.start)
        self._maps.insert(i, m)

    def range_of(self, addr: int) -> ImageRange | None:
        i = bisect.bisect(self._starts, addr) - 1
        for j in range(i, max(i - 8, -1), -1):  # mappings rarely overlap; look at a few below
            m = self._maps[j]
            if m.start <= addr < m.end:
                return m
        return None

    def __call__(self, addr: int) -> ResolvedAddr | None:
        m = self.range_of(addr)
        if m is None:
            return None
        vaddr = addr - m.bias
        fn = m.image.function_at(vaddr)
        if fn is None:
            return None
        return ResolvedAddr(m.image.path, vaddr, fn[0], fn[1], fn[2])
