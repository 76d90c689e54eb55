"""Page-table roots (CR3 values) of guest processes, as the host sees them.

The host samples a vCPU's CR3.  Inside the guest that value is the physical
address of the process's top-level page table, `mm->pgd`, which the kernel
keeps as a *direct-map* virtual address.  So

    CR3 root = mm->pgd - page_offset_base        (the direct-map base)

with PCID bits (11:0) and the no-flush bit (63) cleared.  With page-table
isolation (PTI) each process has two roots, kernel and user, 4 KiB apart
(bit 12): both are listed.

Two things are needed from the running kernel and neither is visible from user
space: each process's `mm->pgd`, and `page_offset_base`.  This module tries a
chain of methods for each and says which one worked, or exactly what is
missing (docs/guest-agent.md):

  mm->pgd            bpf-iter      BPF task iterator (BPF_PROG_TYPE_TRACING)
                     bpf-tasklist  raw tracepoint walking the task list (tail calls)
                     bpf-sched     raw tracepoint on sched_switch for a short window
  page_offset_base   kcore         /proc/kcore program headers (RAM segments: vaddr - paddr)
                     kallsyms      the page_offset_base symbol (CONFIG_KALLSYMS_ALL), read with BPF
                     system-map    System.map + the KASLR offset from kallsyms, read with BPF
                     pagemap-probe a random cookie in a locked page, its physical address from
                                   /proc/self/pagemap, 1 GiB-aligned candidates checked with BPF
                     iomem-text    the same candidates, checked by reading the kernel image through
                                   the direct map at its physical address ("Kernel code" in /proc/iomem)
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import secrets
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vmprof_guest import procfs

if TYPE_CHECKING:
    from vmprof_guest.bpf import Session

PAGE = 4096
GIB = 1 << 30
CR3_ADDR_MASK = 0x000F_FFFF_FFFF_F000  # bits 51:12; PCID (11:0), LAM (62:61), no-flush (63) cleared
CR3_NOFLUSH = 1 << 63
PTI_USER_BIT = 1 << 12  # PTI_USER_PGTABLE_BIT (PAGE_SHIFT): the user half of an 8 KiB pgd pair
START_KERNEL_MAP = 0xFFFF_FFFF_8000_0000
DIRECT_MAP_FLOOR_L4 = 0xFFFF_8880_0000_0000  # __PAGE_OFFSET_BASE_L4 (KASLR only moves it up)
DIRECT_MAP_FLOOR_L5 = 0xFF11_0000_0000_0000  # __PAGE_OFFSET_BASE_L5
MAX_CANDIDATES = 1024


class Cr3Error(RuntimeError):
    pass


# -- arithmetic (pure, tested on known values) -------------------------------------


def normalise_cr3(value: int) -> int:
    """The page-table root in a CR3 value: PCID bits, the no-flush bit and LAM bits cleared."""
    return value & CR3_ADDR_MASK


def pti_roots(root: int, pti: bool) -> list[int]:
    """Roots a process can have in CR3: kernel and user with PTI, else just the one."""
    root = normalise_cr3(root)
    if not pti:
        return [root]
    kernel = root & ~PTI_USER_BIT
    return [kernel, kernel | PTI_USER_BIT]


def cr3_from_pgd(pgd: int, page_offset_base: int, max_phys: int | None = None) -> int:
    """Physical address of a pgd given as a direct-map virtual address."""
    phys = pgd - page_offset_base
    if phys < 0 or pgd % PAGE:
        raise Cr3Error(f"pgd {pgd:#x} is not a page in the direct map at {page_offset_base:#x}")
    if max_phys is not None and phys >= max_phys:
        raise Cr3Error(f"pgd {pgd:#x} lies beyond RAM ({phys:#x} >= {max_phys:#x})")
    return phys


def direct_map_candidates(pointer: int, max_phys: int, floor: int = DIRECT_MAP_FLOOR_L4,
                          align: int = GIB) -> list[int]:
    """Possible direct-map bases, given one pointer known to be in the direct map.

    KASLR places the direct map at a 1 GiB-aligned base at or above `floor`;
    the pointer's physical address is below `max_phys`.  Highest first.
    """
    top = pointer & ~(align - 1)
    lowest = max(floor, pointer - max_phys + 1)
    out = []
    base = top
    while base >= lowest and len(out) < MAX_CANDIDATES:
        out.append(base)
        base -= align
    return out


def kaslr_offset(runtime_text: int, link_text: int) -> int:
    """KASLR slide of the kernel image: _text in kallsyms minus _text in System.map."""
    return runtime_text - link_text


def direct_map_floor(pointer: int) -> int:
    return DIRECT_MAP_FLOOR_L5 if pointer < DIRECT_MAP_FLOOR_L4 else DIRECT_MAP_FLOOR_L4


# -- page_offset_base from /proc/kcore and System.map -------------------------------


def kcore_ram_segments(header: bytes) -> list[tuple[int, int, int]]:
    """(vaddr, paddr, memsz) of the PT_LOAD segments of a /proc/kcore ELF header."""
    if header[:4] != b"\x7fELF" or header[4] != 2 or len(header) < 64:
        raise Cr3Error("/proc/kcore does not start with a 64-bit ELF header")
    phoff, = struct.unpack_from("<Q", header, 32)
    phentsize, phnum = struct.unpack_from("<HH", header, 54)
    out = []
    for i in range(min(phnum, 4096)):
        pos = phoff + i * phentsize
        if pos + 56 > len(header):
            break
        p_type, _f, _off, vaddr, paddr, _filesz, memsz, _align = struct.unpack_from("<IIQQQQQQ", header, pos)
        if p_type == 1:
            out.append((vaddr, paddr, memsz))
    return out


def page_offset_base_from_kcore(segments: list[tuple[int, int, int]]) -> int:
    """The direct-map base: for RAM segments vaddr - paddr is the same value."""
    bases = set()
    for vaddr, paddr, _size in segments:
        if paddr == 0xFFFF_FFFF_FFFF_FFFF or vaddr >= START_KERNEL_MAP or vaddr < DIRECT_MAP_FLOOR_L5:
            continue  # kernel text, vmalloc, modules, vmemmap: not the direct map
        base = vaddr - paddr
        if base % GIB == 0:
            bases.add(base)
    if len(bases) != 1:
        raise Cr3Error(f"/proc/kcore RAM segments give {len(bases)} direct-map bases, expected 1")
    return bases.pop()


def read_kcore_header(path: str = "/proc/kcore") -> bytes:
    with open(path, "rb") as f:
        return f.read(64 * 1024)


def system_map_paths(release: str) -> list[str]:
    return [f"/boot/System.map-{release}", f"/lib/modules/{release}/System.map", "/boot/System.map"]


def read_system_map(path: str, names: set[str]) -> dict[str, int]:
    with open(path, "rb") as f:  # the same "ADDRESS TYPE NAME" lines as kallsyms
        return procfs.kallsyms_lookup(f.read(), names)


# -- the physical address of one of our own pages (for the pagemap probe) ---------------


class CookiePage:
    """A locked anonymous page holding 32 random bytes, and its physical address."""

    def __init__(self) -> None:
        self.cookie = secrets.token_bytes(32)
        self.page = mmap.mmap(-1, PAGE)
        self.page.write(self.cookie)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mlock(ctypes.c_void_p(self.addr), ctypes.c_size_t(PAGE))  # best effort; pagemap re-checked
        self.phys = physical_address(self.addr)

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.page.close()


def physical_address(vaddr: int) -> int:
    """Physical address of a mapped page of this process via /proc/self/pagemap (needs CAP_SYS_ADMIN)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(vaddr // PAGE * 8)
        entry, = struct.unpack("<Q", f.read(8))
    if not entry >> 63 & 1:
        raise Cr3Error("our cookie page is not present in /proc/self/pagemap")
    pfn = entry & ((1 << 55) - 1)
    if pfn == 0:
        raise Cr3Error("/proc/self/pagemap hides page frame numbers (needs CAP_SYS_ADMIN)")
    return pfn * PAGE + vaddr % PAGE


# -- the chain ---------------------------------------------------------------------------


@dataclass
class Cr3Result:
    method: str = "none"  # what gave mm->pgd: bpf-iter | bpf-tasklist | bpf-sched | none
    direct_map: str | None = None  # what gave page_offset_base
    page_offset_base: int | None = None
    pti: bool = False
    max_phys: int | None = None
    pgds: dict[int, tuple[int, str]] = field(default_factory=dict)  # tgid -> (mm->pgd, comm)
    tried: list[dict] = field(default_factory=list)  # [{"method": ..., "result": ...}]
    missing: str | None = None

    def note(self, method: str, result: str) -> None:
        self.tried.append({"method": method, "result": result})

    def roots_for(self, pgd: int) -> list[int]:
        if self.page_offset_base is None:
            return []
        try:
            return pti_roots(cr3_from_pgd(pgd, self.page_offset_base, self.max_phys), self.pti)
        except Cr3Error:
            return []

    def roots(self, tgid: int, comm: str | None = None) -> list[int]:
        entry = self.pgds.get(tgid)
        if entry is None or (comm is not None and entry[1] and not comm.startswith(entry[1][:15])
                             and not entry[1].startswith(comm[:15])):
            return []
        return self.roots_for(entry[0])

    def detail(self) -> dict:
        return {"pgd_source": self.method, "direct_map": self.direct_map,
                "page_offset_base": self.page_offset_base, "pti": self.pti,
                "tried": self.tried, "missing": self.missing}


PGD_METHODS = ("bpf-iter", "bpf-tasklist", "bpf-sched")


def collect(use_bpf: bool = True, sched_window_s: float = 0.5, release: str | None = None,
            kallsyms: bytes | None = None, session: Session | None = None,
            pgd_methods: tuple[str, ...] = PGD_METHODS) -> Cr3Result:
    """Run the method chain.  `session` may be an open bpf.Session to reuse (watch mode);
    `pgd_methods` chooses and orders the mm->pgd methods to try."""
    res = Cr3Result(pti=procfs.meltdown_pti(), max_phys=procfs.max_ram_address(procfs.read_iomem()))
    release = release or os.uname().release
    if not procfs.in_initial_pid_namespace():
        res.missing = ("the agent runs in a child pid namespace; BPF reports global pids: "
                       "run vmprof-guest in the guest's initial namespace (e.g. through qemu-ga)")
        return res
    if not use_bpf:
        res.missing = "BPF disabled (--no-bpf): mm->pgd can only be read with BPF"
        res.note("bpf", "disabled")
        return res
    own_session = session is None
    if session is None:
        from vmprof_guest import bpf

        try:
            session = bpf.Session.open()
        except bpf.BpfUnavailable as e:
            res.missing = str(e)
            res.note("bpf", str(e))
            return res
    try:
        _run_chain(session, res, sched_window_s, release, kallsyms, pgd_methods)
    finally:
        if own_session:
            session.close()
    return res


def _run_chain(session: Session, res: Cr3Result, sched_window_s: float, release: str,
               kallsyms: bytes | None, pgd_methods: tuple[str, ...]) -> None:
    _collect_pgds(session, res, sched_window_s, pgd_methods)
    if not res.pgds:
        res.missing = res.missing or "no method yielded mm->pgd: " + "; ".join(
            f"{t['method']}: {t['result']}" for t in res.tried)
        return
    _find_direct_map(session, res, release, kallsyms)
    if res.page_offset_base is None:
        res.missing = "no method yielded the direct-map base (page_offset_base): " + "; ".join(
            f"{t['method']}: {t['result']}" for t in res.tried if t["method"] in _DIRECT_MAP_METHODS)


_DIRECT_MAP_METHODS = ("kcore", "kallsyms", "system-map", "pagemap-probe", "iomem-text")


def _user_tgids() -> set[int]:
    return {p.pid for p in procfs.snapshot(with_maps=False) if not p.kernel_thread}


def _collect_pgds(session: Session, res: Cr3Result, sched_window_s: float,
                  pgd_methods: tuple[str, ...]) -> None:
    """The first method that works gives mm->pgd; if it skipped processes that /proc shows
    (a task iterator may skip some), the next whole-list method fills in only those."""
    from vmprof_guest import bpf

    for i, method in enumerate(pgd_methods):
        try:
            if method == "bpf-sched":
                res.pgds = session.sched_window(sched_window_s)
                res.method = method
                res.note(method, f"ok: {len(res.pgds)} processes ran during {sched_window_s:.2f} s "
                                 "(processes that slept throughout have no CR3)")
                return
            pgds = session.leader_pgds(method)
        except bpf.BpfUnavailable as e:
            res.note(method, str(e))
            continue
        res.pgds = pgds
        res.method = method
        res.note(method, f"ok: {len(res.pgds)} processes with an mm")
        skipped = _user_tgids() - set(res.pgds)
        for other in pgd_methods[i + 1:]:
            if not skipped or other == "bpf-sched":
                break
            try:
                more = session.leader_pgds(other)
            except bpf.BpfUnavailable as e:
                res.note(other, str(e))
                continue
            filled = {tgid: v for tgid, v in more.items() if tgid in skipped}
            res.pgds.update(filled)
            res.note(other, f"ok: filled in {len(filled)} of {len(skipped)} processes {method} did not visit")
            skipped -= set(filled)
        return


def _find_direct_map(session: Session, res: Cr3Result, release: str, kallsyms: bytes | None) -> None:
    from vmprof_guest import bpf

    # 1. /proc/kcore: RAM segments carry vaddr (direct map) and paddr.
    try:
        res.page_offset_base = page_offset_base_from_kcore(kcore_ram_segments(read_kcore_header()))
        res.direct_map = "kcore"
        res.note("kcore", f"ok: page_offset_base {res.page_offset_base:#x}")
        return
    except OSError as e:
        res.note("kcore", f"/proc/kcore: {e.strerror} (needs CONFIG_PROC_KCORE)")
    except Cr3Error as e:
        res.note("kcore", str(e))
    # 2. kallsyms lists page_offset_base itself (CONFIG_KALLSYMS_ALL=y).
    if kallsyms is None:
        try:
            kallsyms, _real = procfs.read_kallsyms()
        except OSError:
            kallsyms = b""
    syms = procfs.kallsyms_lookup(kallsyms, {"page_offset_base", "_text"})
    if "page_offset_base" in syms:
        if _accept_symbol_value(session, res, "kallsyms", syms["page_offset_base"]):
            return
    else:
        res.note("kallsyms", "page_offset_base is not in /proc/kallsyms (needs CONFIG_KALLSYMS_ALL=y)")
    # 3. System.map gives its link-time address; kallsyms' _text gives the KASLR slide.
    for path in system_map_paths(release):
        try:
            smap = read_system_map(path, {"page_offset_base", "_text"})
        except OSError:
            continue
        if "page_offset_base" not in smap or "_text" not in smap or "_text" not in syms:
            res.note("system-map", f"{path} or kallsyms lacks page_offset_base/_text")
            break
        addr = smap["page_offset_base"] + kaslr_offset(syms["_text"], smap["_text"])
        if _accept_symbol_value(session, res, "system-map", addr):
            return
        break
    else:
        res.note("system-map", f"no System.map for {release} in /boot or /lib/modules")
    # 4. The pagemap probe; 5. the kernel image seen through the direct map.
    for method, probe in (("pagemap-probe", _pagemap_probe), ("iomem-text", _iomem_text_probe)):
        try:
            base = probe(session, res, syms)
        except (OSError, Cr3Error, bpf.BpfUnavailable) as e:
            res.note(method, str(e))
            continue
        res.page_offset_base, res.direct_map = base, method
        res.note(method, f"ok: page_offset_base {base:#x}")
        return


def _accept_symbol_value(session: Session, res: Cr3Result, method: str, addr: int) -> bool:
    from vmprof_guest import bpf

    try:
        data = session.kread([addr])[0]
    except bpf.BpfUnavailable as e:
        res.note(method, str(e))
        return False
    if data is None:
        res.note(method, f"reading page_offset_base at {addr:#x} failed")
        return False
    value = struct.unpack_from("<Q", data)[0]
    if value % GIB or value < DIRECT_MAP_FLOOR_L5:
        res.note(method, f"page_offset_base read as {value:#x}, not a direct-map base")
        return False
    res.page_offset_base, res.direct_map = value, method
    res.note(method, f"ok: page_offset_base {value:#x}")
    return True


def _candidates(res: Cr3Result) -> list[int]:
    pointer = next(iter(res.pgds.values()))[0]
    cands = direct_map_candidates(pointer, res.max_phys or 1 << 46, direct_map_floor(pointer))
    if not cands:
        raise Cr3Error(f"no direct-map candidates below {pointer:#x}")
    return cands


def _iomem_text_probe(session: Session, res: Cr3Result, syms: dict[str, int]) -> int:
    """The kernel image is also mapped in the direct map at its physical address ("Kernel code" in
    /proc/iomem): the candidate where 32 bytes at _text read the same is the base."""
    code = [r for r in procfs.read_iomem() if r.name == "Kernel code" and r.start]
    if not code:
        raise Cr3Error("/proc/iomem shows no 'Kernel code' address (needs root)")
    if "_text" not in syms:
        raise Cr3Error("_text is not in /proc/kallsyms")
    want = session.kread([syms["_text"]])[0]
    if want is None:
        raise Cr3Error("cannot read the kernel text")
    cands = _candidates(res)
    # kread batches by itself; every candidate is checked (one match, not the first, is the answer)
    matches = [b for b, data in zip(cands, session.kread([b + code[0].start for b in cands]), strict=True)
               if data == want]
    if len(matches) != 1:
        raise Cr3Error(f"the kernel text matched at {len(matches)} of {len(cands)} direct-map candidates")
    return matches[0]


def _pagemap_probe(session: Session, res: Cr3Result, _syms: dict[str, int]) -> int:
    if os.geteuid() != 0:
        raise Cr3Error("needs root: /proc/self/pagemap hides frame numbers from other users")
    cands = _candidates(res)
    page = CookiePage()
    try:
        for _attempt in range(3):
            phys = physical_address(page.addr)  # re-read: an unlocked page could have moved
            for i in range(0, len(cands), session.KREAD_BATCH):
                batch = cands[i:i + session.KREAD_BATCH]
                for base, data in zip(batch, session.kread([b + phys for b in batch])):
                    if data == page.cookie:
                        return base
            time.sleep(0.01)
    finally:
        page.close()
    raise Cr3Error(f"the cookie page was not found through any of {len(cands)} direct-map candidates")
