"""Real programs in the demo VMs: the demo guest kernel (demo/kernel/) and the processes it runs.

The kernel is built with gcc on first use, like the demo programs, and every kernel-hosted process gets
its own copy of it (so its mailbox, stack and descriptor tables are its own) mapped at KERNEL_BASE in its
address space.  The process starts at CPL 0 in `kentry`, which registers this host's virtual-IF area
and enters the program with SYSRET; each SYSCALL then reaches `syscall_entry`, which hands the call to
the VMM through the mailbox (syscalls.py serves it).  docs/demo.md describes the layout.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from vmprof_tui.demo import builds
from vmprof_tui.demo.kvm import KvmRegs, KvmSegment, KvmSregs
from vmprof_tui.demo.loader import (
    DOORBELL_GPA,
    DOORBELL_VA,
    PAGE,
    STACK_TOP,
    AddressSpace,
    PageTable,
    PhysAllocator,
    check_program,
    load_segments,
)
from vmprof_tui.demo.syscalls import Reply, SyscallServer
from vmprof_tui.demo.usermem import UserMemory, page_up
from vmprof_tui.mapping import Mapping

KERNEL_BASE = 0xFFFFFFFF80000000
KFLAGS = ["-O2", "-Wall", "-Werror", "-ffreestanding", "-nostdlib", "-static", "-no-pie", "-fno-pic",
          "-mcmodel=kernel", "-mno-red-zone", "-mgeneral-regs-only", "-fno-stack-protector", "-fcf-protection=none",
          "-fno-asynchronous-unwind-tables", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer",
          "-g",  # .debug_frame: its call-frame information, in the VM's bundle (docs/stacks.md)
          "-Wl,--build-id=none"]
USER_STACK_BYTES = 8 << 20
MAILBOX = struct.Struct("<Q6QQQQQQQQ")  # kernel.h struct mailbox: nr, args, ret, rip, rsp, vector, error, cr2, fs_base
RET_OFFSET, FS_BASE_OFFSET = 56, 104
PORT_SYSCALL, PORT_FAULT = 0x30, 0x31
STAR = 0x0023001000000000  # SYSCALL: CS 0x10, SS 0x18; SYSRET: CS 0x33, SS 0x2b
SFMASK = 0x47700  # TF DF IF IOPL AC NT cleared on SYSCALL
MSR_STAR, MSR_LSTAR, MSR_SFMASK = 0xC0000081, 0xC0000082, 0xC0000084
AT = {"PHDR": 3, "PHENT": 4, "PHNUM": 5, "PAGESZ": 6, "BASE": 7, "FLAGS": 8, "ENTRY": 9, "UID": 11, "EUID": 12,
      "GID": 13, "EGID": 14, "PLATFORM": 15, "HWCAP": 16, "CLKTCK": 17, "SECURE": 23, "RANDOM": 25, "EXECFN": 31}
MAX_ARGS_BYTES = 256 << 10


def _kernel_dir() -> Path:
    return Path(str(resources.files("vmprof_tui.demo") / "kernel"))


def kernel_path() -> Path:
    """The built guest kernel (an ELF file linked at KERNEL_BASE), building it if needed."""
    src = _kernel_dir()
    return builds.compiled(src / "entry.S", [*KFLAGS, f"-Wl,-T,{src / 'kernel.ld'}"], "vmprof-kernel",
                             "the demo guest kernel", headers=(src / "kernel.h", src / "kernel.ld"),
                             more_sources=(src / "kernel.c",))


@dataclass
class KernelImage:
    """The kernel's loadable bytes and symbols, read once per VM."""
    segments: list[tuple[int, bytes, int]]  # (virtual address, file bytes, memory size)
    symbols: dict[str, int]
    kallsyms: str  # its code symbols as a guest's /proc/kallsyms (for the VM's bundle)
    size: int  # bytes from KERNEL_BASE to the end of the image
    path: Path  # its ELF file (the VM's bundle carries it)

    @classmethod
    def load(cls, path: Path) -> KernelImage:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            segments = [(s["p_vaddr"], s.data(), s["p_memsz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            symtab = elf.get_section_by_name(".symtab")
            text = elf.get_section_by_name(".text")
            lo, hi = text["sh_addr"], text["sh_addr"] + text["sh_size"]
            symbols: dict[str, int] = {}
            code: list[tuple[int, str]] = []
            assert isinstance(symtab, SymbolTableSection)
            for sym in symtab.iter_symbols():
                if sym.name and sym["st_info"]["type"] in ("STT_FUNC", "STT_NOTYPE", "STT_OBJECT"):
                    symbols[sym.name] = sym["st_value"]
                    if lo <= sym["st_value"] < hi:
                        code.append((sym["st_value"], sym.name))
        kallsyms = "".join(f"{a:016x} {'T'} {n}\n" for a, n in sorted(code))
        size = page_up(max(v + m for v, _, m in segments) - KERNEL_BASE)
        return cls(segments, symbols, kallsyms, size, path)


@dataclass
class KernelProcess:
    """What the VMM keeps of a kernel-hosted process besides its address space."""
    memory: UserMemory
    kernel_gpa: int  # guest-physical address of its kernel copy's first page
    image: KernelImage
    regs: KvmRegs  # its first registers: CPL 0 at kentry
    sregs_cr3: int

    def gpa(self, symbol: str) -> int:
        return self.kernel_gpa + self.image.symbols[symbol] - KERNEL_BASE


def load_process(path: Path, argv: list[bytes], envp: list[bytes], pt_memory, alloc: PhysAllocator,  # noqa: ANN001
                 image: KernelImage) -> tuple[AddressSpace, KernelProcess]:
    """A new address space with the program `path`, an 8 MiB stack holding argv, envp and the auxiliary
    vector, the doorbell page and a copy of the guest kernel; BadProgram for what is not a static x86-64
    executable, MemoryError when guest memory is too small."""
    elf = check_program(path)
    try:
        pt = PageTable(pt_memory, alloc, pti=True)
        space = AddressSpace(cr3=pt.root, entry=elf.header["e_entry"], stack_top=STACK_TOP)
        pages = load_segments(elf, pt, space, str(path))
        phdr = _phdr_address(elf)
        phnum, entry = elf.header["e_phnum"], elf.header["e_entry"]
    finally:
        elf.stream.close()
    brk = page_up(max(m.end for m in space.maps))
    writable = {va for m in space.maps if "w" in m.perms for va in range(m.start, m.end, PAGE)}
    user = UserMemory(pt, {va: gpa | (va in writable) for va, gpa in pages.items()}, brk)  # bit 0: writable
    user.map_zeroed(STACK_TOP - USER_STACK_BYTES, STACK_TOP)
    space.maps.append(Mapping(STACK_TOP - USER_STACK_BYTES, STACK_TOP, 0, "[stack]", perms="rw-p"))
    pt.map(DOORBELL_VA, DOORBELL_GPA, writable=True, executable=False)
    rsp = _initial_stack(user, argv, envp, {"PHDR": phdr, "PHENT": 56, "PHNUM": phnum, "PAGESZ": PAGE,
                                            "ENTRY": entry, "CLKTCK": 100})
    kgpa = alloc.pages(image.size // PAGE)
    # the fork runs CPL-0 code natively only from user-accessible pages (docs/demo.md: isolation)
    pt.map_run(KERNEL_BASE, kgpa, image.size // PAGE, writable=True, executable=True)
    for vaddr, data, _ in image.segments:
        pt_memory.write(kgpa + vaddr - KERNEL_BASE, data)
    kp = KernelProcess(user, kgpa, image, KvmRegs(), pt.root)
    _fill_tables(kp, pt_memory)
    sym = image.symbols
    kp.regs = KvmRegs(rip=sym["kentry"], rsp=sym["kstack_top"], rflags=0x2, rdi=entry, rsi=rsp,
                      rdx=kp.gpa("vif_area"))
    return space, kp


def _phdr_address(elf: ELFFile) -> int:
    """Where the program headers are in memory (AT_PHDR): PT_PHDR, else inside the first segment holding them."""
    off = elf.header["e_phoff"]
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_PHDR":
            return seg["p_vaddr"]
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_offset"] <= off < seg["p_offset"] + seg["p_filesz"]:
            return seg["p_vaddr"] + off - seg["p_offset"]
    return 0


def _initial_stack(user: UserMemory, argv: list[bytes], envp: list[bytes], aux: dict[str, int]) -> int:
    """Write the System V initial stack below STACK_TOP; returns the user RSP (pointing at argc)."""
    strings = b""
    offsets = []
    for s in [*argv, *envp, b"x86_64"]:
        offsets.append(len(strings))
        strings += s + b"\0"
    if len(strings) > MAX_ARGS_BYTES:
        raise MemoryError(f"arguments and environment exceed {MAX_ARGS_BYTES} bytes")
    random_at = (STACK_TOP - 16) & ~15
    strings_at = (random_at - len(strings)) & ~15
    user.write(random_at, os.urandom(16))
    user.write(strings_at, strings)
    ptr = [strings_at + o for o in offsets]
    aux = {**aux, "RANDOM": random_at, "PLATFORM": ptr[-1], "EXECFN": ptr[0] if argv else 0,
           "UID": 0, "EUID": 0, "GID": 0, "EGID": 0, "SECURE": 0, "HWCAP": 0}
    words = [len(argv), *ptr[:len(argv)], 0, *ptr[len(argv):-1], 0]
    for name, value in aux.items():
        words += [AT[name], value]
    words += [0, 0]
    rsp = (strings_at - 8 * len(words)) & ~15
    user.write(rsp, struct.pack(f"<{len(words)}Q", *words))
    return rsp


def _fill_tables(kp: KernelProcess, memory) -> None:  # noqa: ANN001
    """The kernel's GDT (Linux's layout), TSS (its stack for exceptions) and IDT (the exception stubs)."""
    sym = kp.image.symbols
    tss = sym["tss"]
    gdt = [0, 0, 0x00AF9B000000FFFF, 0x00CF93000000FFFF, 0x00CFFB000000FFFF, 0x00CFF3000000FFFF,
           0x00AFFB000000FFFF, 0,
           0x67 | (tss & 0xFFFFFF) << 16 | 0x89 << 40 | ((tss >> 24) & 0xFF) << 56, tss >> 32]
    memory.write(kp.gpa("gdt"), struct.pack(f"<{len(gdt)}Q", *gdt))
    memory.write(kp.gpa("tss") + 4, struct.pack("<Q", sym["kstack_top"]))
    memory.write(kp.gpa("tss") + 102, struct.pack("<H", 104))  # no I/O bitmap
    idt = b""
    for v in range(32):
        h = sym["idt_stubs"] + 16 * v
        idt += struct.pack("<QQ", (h & 0xFFFF) | 0x10 << 16 | 0x8E << 40 | ((h >> 16) & 0xFFFF) << 48, h >> 32)
    memory.write(kp.gpa("idt"), idt)


def kernel_sregs(sregs: KvmSregs, image: KernelImage, cr3: int) -> KvmSregs:
    """`sregs` set for kentry: CPL 0 in long mode with the kernel's descriptor tables and `cr3`."""
    def seg(selector: int, code: bool) -> KvmSegment:
        return KvmSegment(base=0, limit=0xFFFFFFFF, selector=selector, type=11 if code else 3, present=1, dpl=0,
                          db=0 if code else 1, s=1, l=1 if code else 0, g=1)

    sym = image.symbols
    sregs.cs = seg(0x10, True)
    for name in ("ds", "es", "fs", "gs", "ss"):
        setattr(sregs, name, seg(0x18, False))
    sregs.tr = KvmSegment(base=sym["tss"], limit=0x67, selector=0x40, type=11, present=1)
    sregs.ldt = KvmSegment(type=2, unusable=1)
    sregs.gdt.base, sregs.gdt.limit = sym["gdt"], 16 * 8 - 1
    sregs.idt.base, sregs.idt.limit = sym["idt"], 32 * 16 - 1
    sregs.cr0, sregs.cr4, sregs.efer, sregs.cr3 = 0x80050033, 0x620, 0xD01, cr3
    return sregs


def syscall_msrs(image: KernelImage) -> dict[int, int]:
    return {MSR_STAR: STAR, MSR_LSTAR: image.symbols["syscall_entry"], MSR_SFMASK: SFMASK}


def serve_mailbox(memory, kp: KernelProcess, server: SyscallServer, port: int) -> tuple[Reply, str]:  # noqa: ANN001
    """Serve what the kernel of `kp` put in its mailbox before ringing `port`: a system call (its reply is
    written back for the kernel), or an exception it cannot serve: then the text says what happened and the
    reply's `nr` holds the faulting user RIP."""
    box = MAILBOX.unpack_from(memory.map, kp.gpa("mailbox"))
    nr, args, rip = box[0], box[1:7], box[8]
    if port == PORT_FAULT:
        vector, error, cr2 = box[10], box[11], box[12]
        what = f"exception {vector} ({EXCEPTIONS.get(vector, 'reserved')}, error code {error:#x}"
        return Reply(-1, nr=rip), what + (f", address {cr2:#x})" if vector == 14 else ")")
    reply = server.serve(nr, args, rip)
    reply.nr = nr
    memory.write(kp.gpa("mailbox") + RET_OFFSET, struct.pack("<Q", reply.ret & (1 << 64) - 1))
    if reply.fs_base is not None:
        memory.write(kp.gpa("mailbox") + FS_BASE_OFFSET, struct.pack("<Q", reply.fs_base & (1 << 64) - 1))
    return reply, ""


EXCEPTIONS = {0: "divide error", 1: "debug", 3: "breakpoint", 4: "overflow", 5: "bound range", 6: "invalid opcode",
              7: "device not available", 8: "double fault", 10: "invalid TSS", 11: "segment not present",
              12: "stack fault", 13: "general protection", 14: "page fault", 16: "x87 error", 17: "alignment check",
              18: "machine check", 19: "SIMD error"}
