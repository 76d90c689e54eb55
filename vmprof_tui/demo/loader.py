"""Guest address spaces for the demo VMM: ELF loading and 4-level page tables.

Each demo guest process gets its own page-table root (its own CR3) mapping its
ELF segments at their link addresses, a stack, and the doorbell page.  Two
copies of one program therefore share virtual addresses but not CR3 values,
exactly like two processes of a real guest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from vmprof_tui.demo.kvm import GuestMemory
from vmprof_tui.mapping import Mapping

PAGE = 4096
PTE_PRESENT, PTE_WRITE, PTE_USER, PTE_NX = 0x1, 0x2, 0x4, 1 << 63

# Contract with programs/guest_rt.h.
DOORBELL_VA = 0x7FE000000000
DOORBELL_GPA = 0xE0000000  # above guest RAM: stores there are MMIO exits
STACK_TOP = 0x7FF000000000
STACK_PAGES = 16
USER_LIMIT = 0x7FFFFFFFF000
MAX_PROGRAM_BYTES = 64 << 20


class BadProgram(ValueError):
    """The file is not a program the demo VMM can run (static x86-64 ELF executable)."""


@dataclass
class AddressSpace:
    cr3: int
    entry: int
    stack_top: int
    maps: list[Mapping] = field(default_factory=list)


class PhysAllocator:
    """Bump allocator of zeroed guest-physical pages (guest RAM is never freed)."""

    def __init__(self, memory: GuestMemory, start: int = 0x100000) -> None:
        self.memory = memory
        self.next = start

    def page(self) -> int:
        return self.pages(1)

    def pages(self, count: int) -> int:
        """`count` contiguous pages; MemoryError when guest memory is exhausted."""
        if count < 0 or self.next + count * PAGE > self.memory.size:
            raise MemoryError("demo VM ran out of guest memory; raise --mem-mb")
        gpa = self.next
        self.next += count * PAGE
        return gpa


class PageTable:
    """4-level page tables.  With `pti` the root is a pair of pages 8 KiB-aligned, the second a copy of the first:
    this host's kvm_pvm runs the user mode of a process that has a guest kernel on root + 4 KiB (as Linux's
    page-table isolation lays out its two roots)."""

    def __init__(self, memory: GuestMemory, alloc: PhysAllocator, pti: bool = False) -> None:
        self.memory = memory
        self.alloc = alloc
        if pti:
            alloc.pages(((alloc.next + 2 * PAGE - 1) & ~(2 * PAGE - 1)) // PAGE - alloc.next // PAGE)
            self.root = alloc.pages(2)
        else:
            self.root = alloc.page()
        self.pti = pti
        self._tables: dict[tuple[int, int], int] = {}

    def _leaf_table(self, va: int) -> int:
        table = self.root
        for shift in (39, 30, 21):
            index = (va >> shift) & 511
            child = self._tables.get((table, index))
            if child is None:
                child = self.alloc.page()
                self._tables[(table, index)] = child
                self.memory.write_u64(table + index * 8, child | PTE_PRESENT | PTE_WRITE | PTE_USER)
                if self.pti and table == self.root:
                    self.memory.write_u64(table + PAGE + index * 8, child | PTE_PRESENT | PTE_WRITE | PTE_USER)
            table = child
        return table

    def map(self, va: int, gpa: int, writable: bool, executable: bool) -> None:
        self.map_run(va, gpa, 1, writable, executable)

    def map_run(self, va: int, gpa: int, count: int, writable: bool, executable: bool) -> None:
        """Map `count` pages from `va` to contiguous guest-physical pages from `gpa`, one write per leaf table."""
        flags = PTE_PRESENT | PTE_USER | (PTE_WRITE if writable else 0) | (0 if executable else PTE_NX)
        while count > 0:
            index = (va >> 12) & 511
            n = min(count, 512 - index)
            entries = b"".join((gpa + i * PAGE | flags).to_bytes(8, "little") for i in range(n))
            self.memory.write(self._leaf_table(va) + index * 8, entries)
            va, gpa, count = va + n * PAGE, gpa + n * PAGE, count - n


def check_program(path: Path) -> ELFFile:
    """Open `path` and check it is a static, non-PIE x86-64 executable in user space."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise BadProgram(f"cannot read guest program {path}: {e.strerror}") from None
    if size > MAX_PROGRAM_BYTES:
        raise BadProgram(f"guest program {path} is {size} bytes; the limit is {MAX_PROGRAM_BYTES}")
    try:
        elf = ELFFile(open(path, "rb"))  # noqa: SIM115 - kept open with the ELFFile
        header = elf.header
        if elf.elfclass != 64 or header["e_machine"] != "EM_X86_64":
            raise BadProgram(f"{path} is not an x86-64 ELF file")
        segments = list(elf.iter_segments())
        if any(seg["p_type"] in ("PT_INTERP", "PT_DYNAMIC") for seg in segments):
            raise BadProgram(f"{path} is dynamically linked; build it with -static")
        if header["e_type"] != "ET_EXEC":
            raise BadProgram(f"{path} is not a non-PIE executable (e_type {header['e_type']}); "
                             "build it with -static -no-pie")
        loads = [seg for seg in segments if seg["p_type"] == "PT_LOAD"]
        if not loads:
            raise BadProgram(f"{path} has no loadable segment")
        for seg in loads:
            if seg["p_vaddr"] + seg["p_memsz"] > DOORBELL_VA or seg["p_filesz"] > seg["p_memsz"]:
                raise BadProgram(f"{path} has a segment outside the demo guest's user range")
    except ELFError as e:
        raise BadProgram(f"{path} is not a valid ELF file: {e}") from None
    return elf


def load_program(path: Path, memory: GuestMemory, alloc: PhysAllocator) -> AddressSpace:
    """Build a new address space with `path` loaded at its link address."""
    elf = check_program(path)
    pt = PageTable(memory, alloc)
    space = AddressSpace(cr3=pt.root, entry=elf.header["e_entry"], stack_top=STACK_TOP)
    load_segments(elf, pt, space, str(path))
    for page_va in range(STACK_TOP - STACK_PAGES * PAGE, STACK_TOP, PAGE):
        pt.map(page_va, alloc.page(), writable=True, executable=False)
    space.maps.append(Mapping(STACK_TOP - STACK_PAGES * PAGE, STACK_TOP, 0, "[stack]", perms="rw-p"))
    pt.map(DOORBELL_VA, DOORBELL_GPA, writable=True, executable=False)
    elf.stream.close()
    return space


def load_segments(elf: ELFFile, pt: PageTable, space: AddressSpace, path: str) -> dict[int, int]:
    """Copy the PT_LOAD segments of `elf` into fresh pages mapped at their link addresses (recorded in
    space.maps as from `path`).  Returns the guest-physical page behind each virtual page."""
    memory, alloc = pt.memory, pt.alloc
    pages: dict[int, int] = {}
    page_flags: dict[int, int] = {}
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD":
            continue
        vaddr, memsz, flags = seg["p_vaddr"], seg["p_memsz"], seg["p_flags"]
        data = seg.data()
        start, end = vaddr & ~(PAGE - 1), (vaddr + memsz + PAGE - 1) & ~(PAGE - 1)
        for page_va in range(start, end, PAGE):
            gpa = pages.get(page_va)  # segments may share a page (a static glibc program's do): the union of rights
            if gpa is None:
                gpa = pages[page_va] = alloc.page()
            page_flags[page_va] = page_flags.get(page_va, 0) | flags
            pt.map(page_va, gpa, writable=bool(page_flags[page_va] & 2), executable=bool(page_flags[page_va] & 1))
            lo, hi = max(page_va, vaddr), min(page_va + PAGE, vaddr + len(data))
            if lo < hi:
                memory.write(gpa + lo - page_va, data[lo - vaddr:hi - vaddr])
        perms = ("r" if flags & 4 else "-") + ("w" if flags & 2 else "-") + ("x" if flags & 1 else "-") + "p"
        space.maps.append(Mapping(start, end, seg["p_offset"] - (vaddr - start), path, perms=perms))
    return pages
