"""The Linux system calls of a demo guest process, served by the demo VMM (docs/demo.md lists them).

The guest kernel (demo/kernel/) hands each call over with its six arguments; `SyscallServer.serve`
returns what the call returns (a negative errno on failure) and what the VMM must do besides
(end the process, put it to sleep, load FS.base).  Guest pointers go through `UserMemory`, which
only reaches mapped user pages; guest paths only through `open_confined`, which keeps them inside the
VM's host directory.  Everything the guest passes is hostile: sizes are capped, nothing is trusted.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import posixpath
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vmprof_tui.demo.usermem import USER_TOP, BadRange, GuestFault, UserMemory, page_up
from vmprof_tui.libc import LIBC

MAX_IO = 16 << 20  # bytes one read or write moves at most (a short count, as Linux may return)
MAX_IOV = 1024
MAX_FDS = 256
MAX_PATH = 4096
OUTPUT_LIMIT = 1 << 20  # bytes of stdout and stderr a process may send to the VMM's output

# openat2(2): resolve every component inside the directory, symlinks and ".." included
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10
OPEN_FLAGS = (os.O_ACCMODE | os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_DIRECTORY
              | os.O_NOFOLLOW | os.O_PATH)
AT_FDCWD, AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH = -100, 0x100, 0x1000
TCGETS = 0x5401
ARCH_SET_FS, ARCH_GET_FS = 0x1002, 0x1003
MAP_SHARED, MAP_FIXED, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x01, 0x10, 0x20, 0x100000
PROT_WRITE = 2
TIMER_ABSTIME = 1
RLIM_INFINITY = (1 << 64) - 1
STAT = struct.Struct("<QQQIIIiQqqqqqqqqq24x")  # struct stat on x86-64


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


LIBC.syscall.restype = ctypes.c_long


def open_confined(root_fd: int, path: bytes, flags: int, mode: int = 0) -> int:
    """Open `path` as the guest names it inside the directory `root_fd`: the kernel resolves absolute paths,
    `..` and every symlink as if that directory were `/` (openat2 RESOLVE_IN_ROOT), so nothing leads out of it.
    Only the open flags in OPEN_FLAGS pass; the host descriptor is close-on-exec.  Raises OSError."""
    if not path or b"\0" in path or len(path) >= MAX_PATH:
        raise OSError(errno.ENOENT if not path else errno.EINVAL, "bad path")
    how = _OpenHow(flags=(flags & OPEN_FLAGS) | os.O_CLOEXEC, mode=mode & 0o777 if flags & os.O_CREAT else 0,
                   resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = LIBC.syscall(SYS_OPENAT2, root_fd, ctypes.c_char_p(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


@dataclass
class Reply:
    """What a served call returns, and what the VMM does besides."""
    ret: int
    exit_status: int | None = None  # the process ends with this status
    sleep_ns: int | None = None  # the process sleeps this long (the vCPU halts if nothing else runs)
    fs_base: int | None = None  # the guest kernel loads FS.base with this
    nr: int = -1  # the call's number


@dataclass
class OpenFile:
    fd: int | None  # host descriptor; None for the console (0, 1, 2)
    path: bytes  # the guest's path of it
    console: int = -1  # 0 stdin, 1 stdout, 2 stderr


@dataclass
class SyscallServer:
    memory: UserMemory
    root_fd: int | None  # the VM's host directory (None: no files)
    pid: int
    hostname: str
    output: Callable[[int, bytes], None]  # the VMM's capture of stdout (1) and stderr (2)
    notice: Callable[[str], None]  # one line about a call not served or a bad guest pointer
    files: dict[int, OpenFile] = field(default_factory=dict)
    calls: dict[str, list[int]] = field(default_factory=dict)  # name -> [count, ns in the VMM, bytes moved]
    unserved: dict[int, int] = field(default_factory=dict)
    output_bytes: int = 0
    dropped_output: int = 0
    fs_base: int = 0
    short_of_memory: set[str] = field(default_factory=set)  # calls already noticed failing for lack of memory

    def __post_init__(self) -> None:
        for i in range(3):
            self.files[i] = OpenFile(None, b"/dev/console", console=i)

    def close_all(self) -> None:
        for f in self.files.values():
            if f.fd is not None:
                os.close(f.fd)
        self.files.clear()

    def serve(self, nr: int, args: tuple[int, ...], rip: int) -> Reply:
        """Serve one call; never raises for anything the guest passes."""
        entry = HANDLERS.get(nr)
        if entry is None:
            if nr not in self.unserved:
                self.notice(f"system call {nr} at rip {rip:#x} is not served: it returns ENOSYS")
            self.unserved[nr] = self.unserved.get(nr, 0) + 1
            return Reply(-errno.ENOSYS)
        name, handler = entry
        try:
            reply = handler(self, *args[:handler.__code__.co_argcount - 1])
        except GuestFault as e:
            self.notice(f"{name} at rip {rip:#x}: guest pointer {e} is not mapped user memory: it returns EFAULT")
            reply = Reply(-errno.EFAULT)
        except MemoryError:
            self._memory_notice(name, rip)
            reply = Reply(self.memory.brk if name == "brk" else -errno.ENOMEM)
        except OSError as e:
            reply = Reply(-(e.errno or errno.EIO))
        except (OverflowError, ValueError, BadRange):  # a number the host call (or the address space) cannot take
            reply = Reply(-errno.EINVAL)
        return reply if isinstance(reply, Reply) else Reply(reply)

    def _memory_notice(self, name: str, rip: int) -> None:
        if name not in self.short_of_memory:  # once per call: a libc may retry smaller
            self.short_of_memory.add(name)
            self.notice(f"{name} at rip {rip:#x} asked for more than the VM's free guest memory: it fails "
                        "(raise --mem)")

    def account(self, nr: int, ns: int, ret: int = 0) -> None:
        """One served call: its count, the VMM's time and, for read- and write-like calls, the bytes it moved
        (what `vmprof predict measure --vm` charges per byte)."""
        name = HANDLERS[nr][0] if nr in HANDLERS else f"syscall_{nr}"
        c = self.calls.setdefault(name, [0, 0, 0])
        c[0] += 1
        c[1] += ns
        if name in BYTE_MOVING and ret > 0:
            c[2] += ret

    # -- helpers -----------------------------------------------------------------
    def _file(self, fd: int) -> OpenFile:
        f = self.files.get(_signed32(fd))
        if f is None:
            raise OSError(errno.EBADF, "bad fd")
        return f

    def _host(self, fd: int) -> int:
        f = self._file(fd)
        if f.fd is None:
            raise OSError(errno.EINVAL if f.console else errno.EBADF, "console")
        return f.fd

    def _path(self, dirfd: int, ptr: int) -> bytes:
        path = self.memory.read_string(ptr, MAX_PATH)
        dirfd = _signed32(dirfd)
        if path.startswith(b"/") or dirfd == AT_FDCWD:
            return path
        return posixpath.join(self._file(dirfd).path, path)

    def _open(self, path: bytes, flags: int, mode: int = 0) -> int:
        if self.root_fd is None:
            raise OSError(errno.ENOENT, "no directory")
        return open_confined(self.root_fd, path, flags, mode)

    def _stat(self, st: os.stat_result) -> bytes:
        return STAT.pack(st.st_dev, st.st_ino, st.st_nlink, st.st_mode, 0, 0, 0, st.st_rdev, st.st_size,
                         st.st_blksize, st.st_blocks, int(st.st_atime), st.st_atime_ns % 10**9,
                         int(st.st_mtime), st.st_mtime_ns % 10**9, int(st.st_ctime), st.st_ctime_ns % 10**9)

    def _console_stat(self) -> bytes:
        return STAT.pack(0x16, 3, 1, 0o20620, 0, 0, 0, 0x8801, 0, 1024, 0, 0, 0, 0, 0, 0, 0)

    def _emit(self, fd: int, data: bytes) -> None:
        room = max(OUTPUT_LIMIT - self.output_bytes, 0)
        if data[:room]:
            self.output(fd, data[:room])
        self.output_bytes += min(len(data), room)
        self.dropped_output += len(data) - min(len(data), room)

    def _write_to(self, f: OpenFile, data: bytes) -> int:
        if f.fd is None:
            if f.console == 0:
                raise OSError(errno.EBADF, "stdin")
            self._emit(f.console, data)
            return len(data)
        return os.write(f.fd, data)

    # -- files -------------------------------------------------------------------
    def sys_read(self, fd: int, buf: int, count: int) -> int:
        f = self._file(fd)
        if f.fd is None:
            if f.console != 0:
                raise OSError(errno.EBADF, "not readable")
            return 0  # stdin is empty
        data = os.read(f.fd, min(count, MAX_IO))
        self.memory.write(buf, data)
        return len(data)

    def sys_pread64(self, fd: int, buf: int, count: int, offset: int) -> int:
        data = os.pread(self._host(fd), min(count, MAX_IO), offset)
        self.memory.write(buf, data)
        return len(data)

    def sys_write(self, fd: int, buf: int, count: int) -> int:
        return self._write_to(self._file(fd), self.memory.read(buf, min(count, MAX_IO)))

    def sys_pwrite64(self, fd: int, buf: int, count: int, offset: int) -> int:
        return os.pwrite(self._host(fd), self.memory.read(buf, min(count, MAX_IO)), offset)

    def sys_writev(self, fd: int, iov: int, iovcnt: int) -> int:
        f = self._file(fd)
        if iovcnt > MAX_IOV:
            return -errno.EINVAL
        data = b""
        for i in range(iovcnt):
            base, length = struct.unpack("<QQ", self.memory.read(iov + 16 * i, 16))
            data += self.memory.read(base, min(length, MAX_IO - len(data)))
        return self._write_to(f, data)

    def sys_readv(self, fd: int, iov: int, iovcnt: int) -> int:
        if iovcnt > MAX_IOV:
            return -errno.EINVAL
        total = 0
        for i in range(iovcnt):
            base, length = struct.unpack("<QQ", self.memory.read(iov + 16 * i, 16))
            n = self.sys_read(fd, base, length)
            total += n
            if n < length:
                break
        return total

    def sys_openat(self, dirfd: int, path_ptr: int, flags: int, mode: int) -> int:
        path = self._path(dirfd, path_ptr)
        free = next((i for i in range(MAX_FDS) if i not in self.files), None)
        if free is None:
            return -errno.EMFILE
        host = self._open(path, flags, mode)
        self.files[free] = OpenFile(host, posixpath.normpath(path))
        return free

    def sys_open(self, path_ptr: int, flags: int, mode: int) -> int:
        return self.sys_openat(AT_FDCWD & 0xFFFFFFFF, path_ptr, flags, mode)

    def sys_dup(self, fd: int) -> int:
        f = self._file(fd)
        free = next((i for i in range(MAX_FDS) if i not in self.files), None)
        if free is None:
            return -errno.EMFILE
        self.files[free] = OpenFile(None if f.fd is None else os.dup(f.fd), f.path, f.console)
        return free

    def sys_close(self, fd: int) -> int:
        f = self._file(fd)
        del self.files[_signed32(fd)]
        if f.fd is not None:
            os.close(f.fd)
        return 0

    def sys_lseek(self, fd: int, offset: int, whence: int) -> int:
        return os.lseek(self._host(fd), _signed64(offset), whence)

    def sys_fstat(self, fd: int, buf: int) -> int:
        f = self._file(fd)
        self.memory.write(buf, self._console_stat() if f.fd is None else self._stat(os.fstat(f.fd)))
        return 0

    def sys_newfstatat(self, dirfd: int, path_ptr: int, buf: int, flags: int) -> int:
        if flags & AT_EMPTY_PATH and self.memory.read_string(path_ptr, MAX_PATH) == b"":
            return self.sys_fstat(dirfd, buf)
        path = self._path(dirfd, path_ptr)
        fd = self._open(path, os.O_PATH | (os.O_NOFOLLOW if flags & AT_SYMLINK_NOFOLLOW else 0))
        try:
            self.memory.write(buf, self._stat(os.fstat(fd)))
        finally:
            os.close(fd)
        return 0

    def sys_stat(self, path_ptr: int, buf: int) -> int:
        return self.sys_newfstatat(AT_FDCWD & 0xFFFFFFFF, path_ptr, buf, 0)

    def sys_lstat(self, path_ptr: int, buf: int) -> int:
        return self.sys_newfstatat(AT_FDCWD & 0xFFFFFFFF, path_ptr, buf, AT_SYMLINK_NOFOLLOW)

    def sys_faccessat(self, dirfd: int, path_ptr: int, mode: int, flags: int = 0) -> int:
        os.close(self._open(self._path(dirfd, path_ptr), os.O_PATH))
        return 0

    def sys_access(self, path_ptr: int, mode: int) -> int:
        return self.sys_faccessat(AT_FDCWD & 0xFFFFFFFF, path_ptr, mode)

    def sys_readlinkat(self, dirfd: int, path_ptr: int, buf: int, size: int) -> int:
        if self.memory.read_string(path_ptr, MAX_PATH).startswith(b"/proc/"):
            return -errno.ENOENT  # no /proc (glibc asks for /proc/self/exe and does without)
        fd = self._open(self._path(dirfd, path_ptr), os.O_PATH | os.O_NOFOLLOW)
        try:
            target = os.readlink("", dir_fd=fd).encode()  # the link itself, as the guest sees it
        finally:
            os.close(fd)
        self.memory.write(buf, target[:min(size, MAX_PATH)])
        return min(len(target), size)

    def sys_readlink(self, path_ptr: int, buf: int, size: int) -> int:
        return self.sys_readlinkat(AT_FDCWD & 0xFFFFFFFF, path_ptr, buf, size)

    def sys_ioctl(self, fd: int, request: int, arg: int) -> int:
        self._file(fd)
        return -errno.ENOTTY  # no terminals: TCGETS and the rest

    def sys_fcntl(self, fd: int, cmd: int, arg: int) -> int:
        f = self._file(fd)
        if cmd == 3:  # F_GETFL
            return os.O_RDWR if f.fd is None else fcntl.fcntl(f.fd, fcntl.F_GETFL) & os.O_ACCMODE
        if cmd == 5:  # F_GETLK: nobody holds a lock (one process per VM directory)
            self.memory.write(arg, struct.pack("<h", fcntl.F_UNLCK))
        # F_GETFD F_SETFD F_SETFL; F_SETLK and F_SETLKW always succeed
        return 0 if cmd in (1, 2, 4, 5, 6, 7) else -errno.EINVAL

    def sys_fsync(self, fd: int) -> int:
        f = self._file(fd)
        if f.fd is not None:
            os.fsync(f.fd)
        return 0

    def sys_ftruncate(self, fd: int, length: int) -> int:
        os.ftruncate(self._host(fd), _signed64(length))
        return 0

    def sys_unlinkat(self, dirfd: int, path_ptr: int, flags: int) -> int:
        """The parent directory is opened confined; the last component must be a plain name."""
        parent, name = posixpath.split(posixpath.normpath(self._path(dirfd, path_ptr)))
        if name in (b"", b".", b"..") or b"/" in name:
            return -errno.EINVAL
        fd = self._open(parent or b"/", os.O_PATH | os.O_DIRECTORY)
        try:
            if flags & 0x200:  # AT_REMOVEDIR
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        return 0

    def sys_unlink(self, path_ptr: int) -> int:
        return self.sys_unlinkat(AT_FDCWD & 0xFFFFFFFF, path_ptr, 0)

    def sys_getcwd(self, buf: int, size: int) -> int:
        if size < 2:
            return -errno.ERANGE
        self.memory.write(buf, b"/\0")
        return 2

    # -- memory ------------------------------------------------------------------
    def sys_brk(self, addr: int) -> int:
        new = self.memory.set_brk(addr)
        if addr > new:
            raise MemoryError  # the break did not move: brk(2) then returns the old break, as here
        return new

    def sys_mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        if length == 0 or addr & 0xFFF or offset & 0xFFF:
            return -errno.EINVAL
        if page_up(length) > self.memory.memory.size:
            raise MemoryError
        fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)
        host = None
        if not flags & MAP_ANONYMOUS:
            host = self._host(fd)
            if flags & MAP_SHARED and prot & PROT_WRITE:
                return -errno.EACCES  # shared writable file mappings are not served
        start = self.memory.add_area(addr if fixed else None, length, prot)
        if host is not None:
            data = os.pread(host, min(length, MAX_IO * 16), offset)
            self.memory.write(start, data)
        return start

    def sys_munmap(self, addr: int, length: int) -> int:
        if addr & 0xFFF or length == 0:
            return -errno.EINVAL
        self.memory.remove_areas(addr, addr + page_up(length))
        return 0

    def sys_mprotect(self, addr: int, length: int, prot: int) -> int:
        if addr & 0xFFF:
            return -errno.EINVAL
        if prot and length:
            self.memory.protect(addr, addr + page_up(min(length, USER_TOP)), prot)
        return 0

    def sys_arch_prctl(self, code: int, addr: int) -> Reply | int:
        if code == ARCH_SET_FS:
            self.fs_base = addr
            return Reply(0, fs_base=addr)
        if code == ARCH_GET_FS:
            self.memory.write(addr, struct.pack("<Q", self.fs_base))
            return 0
        return -errno.EINVAL

    # -- process and time ----------------------------------------------------------
    def sys_exit(self, status: int) -> Reply:
        return Reply(0, exit_status=status & 0xFF)

    def sys_getpid(self) -> int:
        return self.pid

    def sys_zero(self, *_: int) -> int:
        return 0

    def sys_nosys(self, *_: int) -> int:
        return -errno.ENOSYS  # known and not needed (glibc falls back): no notice

    def sys_prlimit64(self, pid: int, resource: int, new: int, old: int) -> int:
        if old:
            limits = {3: (8 << 20, RLIM_INFINITY), 7: (MAX_FDS, MAX_FDS)}  # RLIMIT_STACK, RLIMIT_NOFILE
            self.memory.write(old, struct.pack("<QQ", *limits.get(resource, (RLIM_INFINITY, RLIM_INFINITY))))
        return 0

    def sys_getrlimit(self, resource: int, old: int) -> int:
        return self.sys_prlimit64(0, resource, 0, old)

    def sys_uname(self, buf: int) -> int:
        fields = (b"Linux", self.hostname.encode()[:64], b"6.1.0-vmprof-demo", b"#1 vmprof demo guest kernel",
                  b"x86_64", b"(none)")
        self.memory.write(buf, b"".join(f.ljust(65, b"\0") for f in fields))
        return 0

    def sys_getrandom(self, buf: int, length: int, flags: int) -> int:
        data = os.urandom(min(length, 1 << 20))
        self.memory.write(buf, data)
        return len(data)

    def sys_clock_gettime(self, clock: int, tp: int) -> int:
        ns = _clock_ns(clock)
        if ns is None:
            return -errno.EINVAL
        self.memory.write(tp, struct.pack("<qq", ns // 10**9, ns % 10**9))
        return 0

    def sys_gettimeofday(self, tv: int, tz: int) -> int:
        ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if tv:
            self.memory.write(tv, struct.pack("<qq", ns // 10**9, ns % 10**9 // 1000))
        return 0

    def sys_time(self, tloc: int) -> int:
        now = time.time_ns() // 10**9
        if tloc:
            self.memory.write(tloc, struct.pack("<q", now))
        return now

    def sys_nanosleep(self, req: int, rem: int) -> Reply | int:
        return self.sys_clock_nanosleep(time.CLOCK_MONOTONIC, 0, req, rem)

    def sys_clock_nanosleep(self, clock: int, flags: int, req: int, rem: int) -> Reply | int:
        sec, nsec = struct.unpack("<qq", self.memory.read(req, 16))
        now = _clock_ns(clock)
        if sec < 0 or not 0 <= nsec < 10**9 or now is None:
            return -errno.EINVAL
        ns = sec * 10**9 + nsec - (now if flags & TIMER_ABSTIME else 0)
        return Reply(0, sleep_ns=max(ns, 0))


def _clock_ns(clock: int) -> int | None:
    if clock in (2, 3):  # the process's and thread's CPU time: the vCPU thread's
        return time.thread_time_ns()
    if clock in (0, 1, 4, 5, 6, 7):
        return time.clock_gettime_ns(clock)
    return None


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


S = SyscallServer
BYTE_MOVING = frozenset({"read", "write", "pread64", "pwrite64", "readv", "writev"})
HANDLERS: dict[int, tuple[str, Callable[..., Reply | int]]] = {
    0: ("read", S.sys_read), 1: ("write", S.sys_write), 2: ("open", S.sys_open), 3: ("close", S.sys_close),
    4: ("stat", S.sys_stat), 5: ("fstat", S.sys_fstat), 6: ("lstat", S.sys_lstat), 8: ("lseek", S.sys_lseek),
    9: ("mmap", S.sys_mmap), 10: ("mprotect", S.sys_mprotect), 11: ("munmap", S.sys_munmap),
    12: ("brk", S.sys_brk), 13: ("rt_sigaction", S.sys_zero), 14: ("rt_sigprocmask", S.sys_zero),
    16: ("ioctl", S.sys_ioctl), 32: ("dup", S.sys_dup), 17: ("pread64", S.sys_pread64),
    18: ("pwrite64", S.sys_pwrite64),
    19: ("readv", S.sys_readv), 20: ("writev", S.sys_writev), 21: ("access", S.sys_access),
    24: ("sched_yield", S.sys_zero), 28: ("madvise", S.sys_zero), 35: ("nanosleep", S.sys_nanosleep),
    39: ("getpid", S.sys_getpid), 60: ("exit", S.sys_exit), 63: ("uname", S.sys_uname),
    72: ("fcntl", S.sys_fcntl), 89: ("readlink", S.sys_readlink), 267: ("readlinkat", S.sys_readlinkat),
    79: ("getcwd", S.sys_getcwd), 96: ("gettimeofday", S.sys_gettimeofday),
    97: ("getrlimit", S.sys_getrlimit), 102: ("getuid", S.sys_zero), 104: ("getgid", S.sys_zero),
    107: ("geteuid", S.sys_zero), 108: ("getegid", S.sys_zero), 110: ("getppid", S.sys_zero),
    157: ("prctl", S.sys_zero), 158: ("arch_prctl", S.sys_arch_prctl), 186: ("gettid", S.sys_getpid),
    25: ("mremap", S.sys_nosys), 93: ("fchown", S.sys_zero), 201: ("time", S.sys_time),
    74: ("fsync", S.sys_fsync), 75: ("fdatasync", S.sys_fsync),
    77: ("ftruncate", S.sys_ftruncate), 87: ("unlink", S.sys_unlink), 263: ("unlinkat", S.sys_unlinkat),
    218: ("set_tid_address", S.sys_getpid), 228: ("clock_gettime", S.sys_clock_gettime),
    230: ("clock_nanosleep", S.sys_clock_nanosleep), 231: ("exit_group", S.sys_exit),
    257: ("openat", S.sys_openat), 262: ("newfstatat", S.sys_newfstatat), 269: ("faccessat", S.sys_faccessat),
    273: ("set_robust_list", S.sys_zero), 302: ("prlimit64", S.sys_prlimit64), 318: ("getrandom", S.sys_getrandom),
    332: ("statx", S.sys_nosys), 334: ("rseq", S.sys_nosys), 439: ("faccessat2", S.sys_faccessat),
}
