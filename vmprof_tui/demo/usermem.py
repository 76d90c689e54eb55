"""The user memory of a process run by the demo guest kernel: its pages, its break and its mmap areas.

Everything is mapped eagerly (no page faults to serve), and a virtual page once mapped keeps its
guest-physical page for the life of the process: `munmap` only marks the range free, and a later `mmap`
there zeroes the same pages.  The VMM writes the page tables behind the guest's back, so a changed
present entry could live on in the guest's TLB or in KVM's shadow page tables; a new entry cannot.
For the same reason protections are not enforced: brk and mmap pages are mapped read-write-execute once.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass

from vmprof_tui.demo.loader import PAGE, PageTable

MMAP_TOP = 0x7F0000000000  # mmap areas are placed top-down below this, far above any break
MMAP_FLOOR = 0x10000  # fixed mappings go between this and MMAP_TOP (below the stack, the doorbell and the kernel)
USER_TOP = 0x7FFFFFFFF000


class GuestFault(Exception):
    """A guest pointer that is not mapped user memory (the call fails with EFAULT)."""


class BadRange(ValueError):
    """A fixed mapping outside the mmap range (the call fails with EINVAL)."""


def page_down(va: int) -> int:
    return va & ~(PAGE - 1)


def page_up(va: int) -> int:
    return (va + PAGE - 1) & ~(PAGE - 1)


@dataclass(order=True)
class Area:
    start: int
    end: int
    prot: int = 3
    path: str = ""  # the guest path of a file mapping, "" for anonymous memory


class UserMemory:
    """Pages of one guest process: `pages` maps each virtual page to its guest-physical page (bit 0: writable)."""

    def __init__(self, pt: PageTable, pages: dict[int, int], brk_start: int) -> None:
        self.pt = pt
        self.memory = pt.memory
        self.pages = pages
        self.brk_start = self.brk = brk_start
        self.areas: list[Area] = []  # mmap areas, sorted by start

    # -- guest pointers --------------------------------------------------------
    def _chunks(self, va: int, length: int, write: bool) -> list[tuple[int, int]]:
        """The (guest-physical address, length) pieces of [va, va+length); GuestFault if any page is not
        mapped user memory (or not writable, for a write)."""
        if length < 0 or va < 0 or va + length > USER_TOP:
            raise GuestFault(f"{va:#x}+{length}")
        out = []
        while length > 0:
            page = page_down(va)
            entry = self.pages.get(page)
            if entry is None or (write and not entry & 1):
                raise GuestFault(f"{va:#x}")
            n = min(length, page + PAGE - va)
            out.append((entry - (entry & 1) + va - page, n))
            va, length = va + n, length - n
        return out

    def read(self, va: int, length: int) -> bytes:
        view = self.memory.map
        return b"".join(bytes(view[gpa:gpa + n]) for gpa, n in self._chunks(va, length, False))

    def write(self, va: int, data: bytes) -> None:
        pos = 0
        for gpa, n in self._chunks(va, len(data), True):
            self.memory.write(gpa, data[pos:pos + n])
            pos += n

    def read_string(self, va: int, limit: int = 4096) -> bytes:
        """A NUL-terminated string of at most `limit` bytes; GuestFault if unterminated within it."""
        out = b""
        while len(out) < limit:
            page_end = page_down(va + len(out)) + PAGE
            chunk = self.read(va + len(out), min(page_end - va - len(out), limit - len(out)))
            end = chunk.find(b"\0")
            if end >= 0:
                return out + chunk[:end]
            out += chunk
        raise GuestFault(f"string at {va:#x} longer than {limit} bytes")

    # -- mapping ---------------------------------------------------------------
    def map_zeroed(self, start: int, end: int) -> None:
        """Make [start, end) (page-aligned) zeroed read-write user memory: new pages are allocated (MemoryError
        when guest memory runs out), pages already mapped are zeroed."""
        if end - start > self.memory.size:  # before walking a huge range page by page
            raise MemoryError("larger than guest memory")
        va = start
        while va < end:
            if va in self.pages:
                self.memory.write(self.pages[va] & ~1, bytes(PAGE))
                va += PAGE
                continue
            run = va
            while run < end and run not in self.pages:
                run += PAGE
            count = (run - va) // PAGE
            gpa = self.pt.alloc.pages(count)  # fresh guest memory is zero
            self.pt.map_run(va, gpa, count, writable=True, executable=True)
            for i in range(count):
                self.pages[va + i * PAGE] = gpa + i * PAGE | 1
            va = run

    def set_brk(self, new: int) -> int:
        """brk(2): the new break, or the old one when it cannot move there."""
        if new < self.brk_start or new >= MMAP_TOP // 2:
            return self.brk
        if page_up(new) > page_up(self.brk):
            try:
                self.map_zeroed(page_up(self.brk), page_up(new))
            except MemoryError:
                return self.brk
        self.brk = new
        return new

    def _free_gap(self, size: int) -> int:
        """The highest free range of `size` bytes below MMAP_TOP and above the break."""
        top = MMAP_TOP
        for area in reversed(self.areas):
            if area.end <= top - size:
                return top - size
            top = min(top, area.start)
        if top - size < page_up(self.brk) + (1 << 30):
            raise MemoryError("no free virtual range")
        return top - size

    def add_area(self, start: int | None, length: int, prot: int, path: str = "") -> int:
        """Place an mmap area of `length` bytes (at `start` if given: MAP_FIXED), backed by zeroed pages unless
        PROT_NONE (a reservation, backed when made accessible).  Returns its start; MemoryError if it does not fit."""
        size = page_up(length)
        if start is None:
            start = self._free_gap(size)
        elif not MMAP_FLOOR <= start <= MMAP_TOP - size:  # nothing fixed over the stack, doorbell or kernel
            raise BadRange(f"{start:#x}+{size:#x}")
        self.remove_areas(start, start + size)
        if prot != 0:
            self.map_zeroed(start, start + size)
        insort(self.areas, Area(start, start + size, prot, path))
        return start

    def remove_areas(self, start: int, end: int) -> None:
        """munmap(2): [start, end) stops being an area (its pages stay mapped for reuse, see the module doc)."""
        kept: list[Area] = []
        for a in self.areas:
            if a.end <= start or a.start >= end:
                kept.append(a)
                continue
            if a.start < start:
                kept.append(Area(a.start, start, a.prot, a.path))
            if a.end > end:
                kept.append(Area(end, a.end, a.prot, a.path))
        self.areas = sorted(kept)

    def protect(self, start: int, end: int, prot: int) -> None:
        """mprotect(2) to an accessible protection: back what it makes accessible of a PROT_NONE reservation (and
        nothing outside the process's mmap areas)."""
        for area in self.areas:
            lo, hi = max(area.start, start), min(area.end, end)
            if lo >= hi:
                continue
            va = lo
            while va < hi:
                if va not in self.pages:
                    run = va
                    while run < hi and run not in self.pages:
                        run += PAGE
                    self.map_zeroed(va, run)
                    va = run
                va += PAGE
            if lo == area.start and hi == area.end:
                area.prot = prot
