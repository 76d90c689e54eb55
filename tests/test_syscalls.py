"""The demo VMM's system-call server and its path confinement, without VMs (demo/syscalls.py, usermem.py)."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from vmprof_tui.demo import guestos
from vmprof_tui.demo.loader import PAGE, PageTable, PhysAllocator
from vmprof_tui.demo.syscalls import AT_FDCWD, SyscallServer, open_confined
from vmprof_tui.demo.usermem import UserMemory

MEM = 16 << 20
DATA = 0x600000  # a user data page the tests pass pointers into
BRK = 0x800000


class FakeMemory:
    """Guest-physical memory as a bytearray: what PageTable and UserMemory use of kvm.GuestMemory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.map = bytearray(size)

    def write(self, gpa: int, data: bytes) -> None:
        assert gpa >= 0 and gpa + len(data) <= self.size
        self.map[gpa:gpa + len(data)] = data

    def write_u64(self, gpa: int, value: int) -> None:
        self.write(gpa, value.to_bytes(8, "little"))


def server(root: Path | None = None) -> tuple[SyscallServer, list[tuple[int, bytes]], list[str]]:
    memory = FakeMemory(MEM)
    pt = PageTable(memory, PhysAllocator(memory), pti=True)  # type: ignore[arg-type]
    user = UserMemory(pt, {}, BRK)
    user.map_zeroed(DATA, DATA + 4 * PAGE)
    out: list[tuple[int, bytes]] = []
    notices: list[str] = []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY) if root else None
    s = SyscallServer(user, fd, 7, "vm1", lambda f, d: out.append((f, d)), notices.append)
    return s, out, notices


def put(s: SyscallServer, data: bytes, offset: int = 0) -> int:
    s.memory.write(DATA + offset, data)
    return DATA + offset


def call(s: SyscallServer, nr: int, *args: int) -> int:
    return s.serve(nr, (*args, 0, 0, 0, 0, 0, 0)[:6], 0x401000).ret


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("inside\n")
    (tmp_path / "secret").write_text("outside\n")
    os.symlink("/etc/passwd", root / "abs-link")
    os.symlink("../secret", root / "up-link")
    os.symlink("a.txt", root / "ok-link")
    return root


def read_via(root: Path, path: bytes) -> bytes:
    fd = open_confined(os.open(root, os.O_RDONLY | os.O_DIRECTORY), path, os.O_RDONLY)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def test_confined_open_keeps_absolute_paths_and_dotdot_inside(jail: Path) -> None:
    assert read_via(jail, b"/a.txt") == b"inside\n"
    assert read_via(jail, b"sub/../a.txt") == b"inside\n"
    assert read_via(jail, b"/../../../a.txt") == b"inside\n"  # .. at the top stays at the top, as at /
    for escape in (b"../secret", b"/../secret", b"sub/../../secret", b"/etc/passwd"):
        with pytest.raises(FileNotFoundError):
            read_via(jail, escape)


def test_confined_open_follows_no_symlink_out(jail: Path) -> None:
    assert read_via(jail, b"ok-link") == b"inside\n"
    for link in (b"abs-link", b"up-link"):  # resolved inside the directory, where their targets do not exist
        with pytest.raises(FileNotFoundError):
            read_via(jail, link)


def test_confined_open_refuses_bad_paths(jail: Path) -> None:
    for bad in (b"", b"a\0b", b"x" * 5000):
        with pytest.raises(OSError):
            read_via(jail, bad)


def test_openat_read_fstat_lseek_close_inside_the_directory(jail: Path) -> None:
    s, _, _ = server(jail)
    path = put(s, b"/sub/../a.txt\0")
    fd = call(s, 257, AT_FDCWD & 0xFFFFFFFF, path, os.O_RDONLY)
    assert fd == 3
    assert call(s, 0, fd, DATA + 100, 100) == 7 and s.memory.read(DATA + 100, 7) == b"inside\n"
    assert call(s, 8, fd, 1, os.SEEK_SET) == 1
    assert call(s, 17, fd, DATA + 200, 3, 2) == 3 and s.memory.read(DATA + 200, 3) == b"sid"
    assert call(s, 5, fd, DATA + 300) == 0
    assert struct.unpack_from("<q", s.memory.read(DATA + 300 + 48, 8))[0] == 7  # st_size
    assert call(s, 3, fd) == 0 and call(s, 3, fd) == -errno.EBADF
    assert call(s, 257, AT_FDCWD & 0xFFFFFFFF, put(s, b"../secret\0"), os.O_RDONLY) == -errno.ENOENT
    assert call(s, 262, AT_FDCWD & 0xFFFFFFFF, put(s, b"up-link\0"), DATA + 300, 0) == -errno.ENOENT


def test_stdout_is_captured_and_ioctl_is_enotty() -> None:
    s, out, _ = server()
    put(s, b"hello ")
    put(s, b"world\n", 64)
    put(s, struct.pack("<QQQQ", DATA, 6, DATA + 64, 6), 128)
    assert call(s, 1, 1, DATA, 6) == 6
    assert call(s, 20, 2, DATA + 128, 2) == 12
    assert out == [(1, b"hello "), (2, b"hello world\n")]
    assert call(s, 16, 1, 0x5401, DATA) == -errno.ENOTTY
    assert call(s, 0, 0, DATA, 10) == 0  # stdin is empty
    assert call(s, 257, AT_FDCWD & 0xFFFFFFFF, put(s, b"/x\0"), 0) == -errno.ENOENT  # no directory given


def test_guest_pointer_outside_guest_memory_is_efault_with_one_line() -> None:
    s, out, notices = server()
    for bad in (0xDEAD0000, 0xFFFFFFFF80000000, DATA + 4 * PAGE - 2, (1 << 64) - 1):
        assert call(s, 1, 1, bad, 10) == -errno.EFAULT
        assert call(s, 228, 1, bad) == -errno.EFAULT
    assert call(s, 257, AT_FDCWD & 0xFFFFFFFF, 0x1000, 0) == -errno.EFAULT
    assert out == []
    assert all("\n" not in n and "EFAULT" in n for n in notices) and len(notices) == 9


def test_unterminated_path_is_efault() -> None:
    s, _, _ = server()
    s.memory.write(DATA, b"x" * 4 * PAGE)
    assert call(s, 257, AT_FDCWD & 0xFFFFFFFF, DATA, 0) == -errno.EFAULT


def test_huge_brk_and_mmap_fail_cleanly() -> None:
    s, _, notices = server()
    assert call(s, 12, 0) == BRK
    assert call(s, 12, BRK + (1 << 40)) == BRK  # the break does not move
    assert call(s, 12, BRK + MEM) == BRK  # more than guest memory
    assert call(s, 12, BRK + 3 * PAGE) == BRK + 3 * PAGE
    assert s.memory.read(BRK, 3 * PAGE) == bytes(3 * PAGE)
    assert call(s, 9, 0, 1 << 40, 3, 0x22, (1 << 64) - 1, 0) == -errno.ENOMEM
    assert call(s, 9, 0, MEM - PAGE, 3, 0x22, (1 << 64) - 1, 0) == -errno.ENOMEM  # fits the check, not the memory
    assert call(s, 9, 0, 0, 3, 0x22, (1 << 64) - 1, 0) == -errno.EINVAL
    assert notices == [f"{n} at rip 0x401000 asked for more than the VM's free guest memory: it fails (raise --mem)"
                       for n in ("brk", "mmap")]  # one line per call, however often it is retried


def test_mmap_reuses_unmapped_pages_zeroed_and_backs_reservations() -> None:
    s, _, _ = server()
    a = call(s, 9, 0, 2 * PAGE, 3, 0x22, (1 << 64) - 1, 0)
    s.memory.write(a, b"dirty")
    assert call(s, 11, a, 2 * PAGE) == 0
    b = call(s, 9, 0, 2 * PAGE, 3, 0x22, (1 << 64) - 1, 0)
    assert b == a and s.memory.read(b, 5) == bytes(5)
    r = call(s, 9, 0, 16 * PAGE, 0, 0x22, (1 << 64) - 1, 0)  # PROT_NONE: a reservation, no pages yet
    assert r + 16 * PAGE <= a and r not in s.memory.pages
    assert call(s, 10, r, PAGE, 3) == 0 and r in s.memory.pages


def test_unserved_call_returns_enosys_with_one_line() -> None:
    s, _, notices = server()
    assert call(s, 56, 0) == -errno.ENOSYS  # clone
    assert call(s, 56, 0) == -errno.ENOSYS
    assert s.unserved == {56: 2}
    assert notices == ["system call 56 at rip 0x401000 is not served: it returns ENOSYS"]
    assert call(s, 334, 0) == -errno.ENOSYS and len(notices) == 1  # rseq: known, quiet


def test_exit_sleep_and_thread_pointer_replies() -> None:
    s, _, _ = server()
    assert s.serve(231, (300, 0, 0, 0, 0, 0), 0).exit_status == 300 & 0xFF
    put(s, struct.pack("<qq", 0, 2_000_000))
    assert s.serve(35, (DATA, 0, 0, 0, 0, 0), 0).sleep_ns == 2_000_000
    put(s, struct.pack("<qq", 0, 10**9))
    assert call(s, 35, DATA, 0) == -errno.EINVAL
    assert s.serve(158, (0x1002, 0x7000, 0, 0, 0, 0), 0).fs_base == 0x7000
    assert call(s, 158, 0x1003, DATA) == 0 and s.memory.read(DATA, 8) == struct.pack("<Q", 0x7000)
    assert call(s, 39) == 7 and call(s, 218, DATA) == 7
    assert call(s, 63, DATA) == 0 and s.memory.read(DATA, 5) == b"Linux"
    assert call(s, 318, DATA, 32, 0) == 32


def test_initial_stack_holds_argv_envp_and_auxv() -> None:
    s, _, _ = server()
    s.memory.map_zeroed(guestos.STACK_TOP - 4 * PAGE, guestos.STACK_TOP)
    rsp = guestos._initial_stack(s.memory, [b"prog", b"x"], [b"A=1"], {"PHDR": 0x400040, "PHNUM": 9,
                                                                      "PAGESZ": PAGE, "ENTRY": 0x401000})
    assert rsp % 16 == 0
    n = min(64, (guestos.STACK_TOP - rsp) // 8)
    words = struct.unpack(f"<{n}Q", s.memory.read(rsp, 8 * n))
    assert words[0] == 2
    assert s.memory.read_string(words[1]) == b"prog" and s.memory.read_string(words[2]) == b"x" and words[3] == 0
    assert s.memory.read_string(words[4]) == b"A=1" and words[5] == 0
    aux = dict(zip(words[6::2], words[7::2], strict=False))
    assert aux[3] == 0x400040 and aux[5] == 9 and aux[6] == PAGE and aux[9] == 0x401000
    assert len(s.memory.read(aux[25], 16)) == 16  # AT_RANDOM


def test_fixed_mappings_and_mprotect_stay_in_user_memory() -> None:
    s, _, _ = server()
    kernel = guestos.KERNEL_BASE
    for addr in (kernel, guestos.STACK_TOP - PAGE, 0, 0x7FE000000000):  # the kernel, the stack, page 0, the doorbell
        assert call(s, 9, addr, PAGE, 3, 0x32, (1 << 64) - 1, 0) == -errno.EINVAL  # MAP_FIXED|MAP_ANONYMOUS|PRIVATE
    before = dict(s.memory.pages)
    assert call(s, 10, kernel, 16 * PAGE, 7) == 0 and call(s, 10, 0x1000000, 16 * PAGE, 3) == 0
    assert s.memory.pages == before  # nothing mapped outside the process's mmap areas
    a = call(s, 9, 0x10000000, 2 * PAGE, 3, 0x32, (1 << 64) - 1, 0)
    assert a == 0x10000000 and s.memory.read(a, 8) == bytes(8)
