"""What /proc and /sys say about the guest: processes, memory maps, kernel symbols."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from vmprof_guest.elfnote import build_id_from_notes

PF_KTHREAD = 0x00200000
_MAPS_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The bundle format bounds one argument at 4096 characters (docs/bundle.md); longer ones
# (seen: CI runners passing whole scripts with -c) are cut so the bundle stays valid.
MAX_ARG_CHARS = 4096
MAX_ARGS = 1024


@dataclass
class MapEntry:
    start: int
    end: int
    perms: str
    offset: int
    dev_major: int
    dev_minor: int
    inode: int
    path: str

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def deleted(self) -> bool:
        return self.path.endswith(" (deleted)")

    @property
    def clean_path(self) -> str:
        return self.path[: -len(" (deleted)")] if self.deleted else self.path


@dataclass
class ProcInfo:
    pid: int
    name: str
    tids: list[int] = field(default_factory=list)
    cmdline: list[str] = field(default_factory=list)
    exe: str | None = None
    ppid: int = 0
    kernel_thread: bool = False
    start_ticks: int = 0  # /proc/PID/stat field 22: clock ticks after boot
    maps: list[MapEntry] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return self.start_ticks * 1_000_000_000 // CLK_TCK


def parse_maps(text: str) -> list[MapEntry]:
    out = []
    for line in text.splitlines():
        m = _MAPS_RE.match(line)
        if not m:
            continue
        out.append(MapEntry(start=int(m[1], 16), end=int(m[2], 16), perms=m[3], offset=int(m[4], 16),
                            dev_major=int(m[5], 16), dev_minor=int(m[6], 16), inode=int(m[7]), path=m[8]))
    return out


def parse_stat(text: str) -> tuple[str, int, int, int]:
    """(comm, ppid, flags, starttime) from /proc/PID/stat (comm may contain spaces and parentheses)."""
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); ppid is field 4, flags field 9, starttime field 22.
    return comm, int(rest[1]), int(rest[6]), int(rest[19])


def _read_text(path: str, limit: int = 64 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def list_pids(proc: str = "/proc") -> list[int]:
    return sorted(int(d) for d in os.listdir(proc) if d.isdigit())


def read_process(pid: int, with_maps: bool = True, proc: str = "/proc") -> ProcInfo | None:
    """Everything about one process, or None when it is gone (or was never there)."""
    base = f"{proc}/{pid}"
    try:
        comm, ppid, flags, start = parse_stat(_read_text(f"{base}/stat"))
    except (OSError, ValueError, IndexError):
        return None
    info = ProcInfo(pid=pid, name=comm, ppid=ppid, kernel_thread=bool(flags & PF_KTHREAD), start_ticks=start)
    try:
        info.tids = sorted(int(t) for t in os.listdir(f"{base}/task") if t.isdigit())
    except OSError:
        info.tids = [pid]
    try:
        raw = _read_text(f"{base}/cmdline", 1 << 20)
        args = raw.split("\0")[:-1] if raw.endswith("\0") else ([raw] if raw else [])
        info.cmdline = [a if len(a) <= MAX_ARG_CHARS else a[: MAX_ARG_CHARS - 3] + "..." for a in args[:MAX_ARGS]]
    except OSError:
        pass
    try:
        info.exe = os.readlink(f"{base}/exe")
    except OSError:
        info.exe = None
    if with_maps and not info.kernel_thread:
        try:
            info.maps = parse_maps(_read_text(f"{base}/maps"))
        except OSError:
            info.maps = []
    return info


def snapshot(with_maps: bool = True, proc: str = "/proc") -> list[ProcInfo]:
    out = []
    for pid in list_pids(proc):
        info = read_process(pid, with_maps, proc)
        if info is not None:
            out.append(info)
    return out


def in_initial_pid_namespace() -> bool:
    """BPF sees global pids; /proc shows the pids of our namespace.  They agree only in the initial one."""
    try:
        for line in _read_text("/proc/self/status").splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) == 2
    except OSError:
        pass
    return True


# -- the kernel ------------------------------------------------------------------


def kernel_build_id(notes: str = "/sys/kernel/notes") -> str | None:
    try:
        with open(notes, "rb") as f:
            return build_id_from_notes(f.read(1 << 16))
    except OSError:
        return None


def read_kallsyms(path: str = "/proc/kallsyms") -> tuple[bytes, bool]:
    """The kallsyms text and whether its addresses are real (kptr_restrict hides them from non-root)."""
    with open(path, "rb") as f:
        data = f.read()
    real = any(not line.startswith(b"0000000000000000 ") for line in data.splitlines()[:64])
    return data, real


def kallsyms_lookup(data: bytes, names: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in data.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2].decode(errors="replace") in names:
            found.setdefault(parts[2].decode(), int(parts[0], 16))
    return found


def read_modules(path: str = "/proc/modules") -> list[dict]:
    """Loaded modules as {name, start, size}; [] when the kernel has no module support."""
    out = []
    try:
        text = _read_text(path)
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6:
            try:
                out.append({"name": parts[0], "start": int(parts[5], 16), "size": int(parts[1])})
            except ValueError:
                continue
    return out


@dataclass
class IomemRange:
    start: int
    end: int
    name: str
    depth: int


def read_iomem(path: str = "/proc/iomem") -> list[IomemRange]:
    out = []
    try:
        text = _read_text(path)
    except OSError:
        return out
    for line in text.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        span, _, name = line.strip().partition(" : ")
        lo, _, hi = span.partition("-")
        try:
            out.append(IomemRange(int(lo, 16), int(hi, 16), name, depth))
        except ValueError:
            continue
    return out


def max_ram_address(ranges: list[IomemRange]) -> int | None:
    """One past the highest byte of System RAM, or None when /proc/iomem hides addresses (non-root)."""
    ends = [r.end + 1 for r in ranges if r.name == "System RAM" and r.end]
    return max(ends) if ends else None


def meltdown_pti() -> bool:
    """True when the kernel uses page-table isolation (then each process has a user and a kernel root)."""
    try:
        text = Path("/sys/devices/system/cpu/vulnerabilities/meltdown").read_text()
    except OSError:
        return False
    return "PTI" in text
