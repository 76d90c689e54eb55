"""Every file and folder vmprof writes: private by default, never through a symlink another user planted.

Recordings, spools and the analysis store hold guest and host names, command lines and the host's kernel
addresses: they are created 0600 (folders 0700), as perf writes perf.data.  VMPROF_GROUP_READABLE=1 in the
environment (set by `--group-readable`) makes them 0640/0750 for a team that reads them through a group.

Output paths may be in a folder others can write to (/tmp): a file there is replaced, never written
through, unless it is a symlink the kernel's fs.protected_symlinks rule would let us follow (ours, or the
folder owner's, or in a folder that is not sticky and world-writable) or a device such as /dev/null.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

GROUP_READABLE_ENV = "VMPROF_GROUP_READABLE"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def file_mode() -> int:
    return 0o640 if os.environ.get(GROUP_READABLE_ENV) == "1" else 0o600


def dir_mode() -> int:
    return 0o750 if os.environ.get(GROUP_READABLE_ENV) == "1" else 0o700


def share_with_group() -> None:
    """Files and folders made from now on (here and in worker processes started after) are group-readable."""
    os.environ[GROUP_READABLE_ENV] = "1"


def make_dirs(path: Path) -> None:
    """`path` and its missing parents, each created with dir_mode() (folders already there keep theirs)."""
    missing = []
    p = Path(path)
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            d.mkdir()
            set_dir_mode(d)


def set_dir_mode(path: Path) -> None:
    """A folder's mode set to dir_mode(), exactly (whatever the umask); never through a link (ELOOP, ENOTDIR)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, dir_mode())
    finally:
        os.close(fd)


def create_new(path: Path, buffering: int = -1) -> BinaryIO:
    """A file that did not exist, opened for writing with file_mode() (EEXIST if anything is at `path`)."""
    fd = os.open(path, _CREATE, file_mode())
    os.fchmod(fd, file_mode())  # exactly that mode, whatever the umask
    return open(fd, "wb", buffering=buffering)  # noqa: SIM115 - the caller closes it


def _followable_link(path: Path, st: os.stat_result) -> bool:
    """fs.protected_symlinks: a link is followed when the folder is not sticky and world-writable, or the link
    is ours or the folder owner's."""
    d = os.stat(Path(path).parent)
    shared = d.st_mode & stat.S_ISVTX and d.st_mode & stat.S_IWOTH
    return not shared or st.st_uid in (os.geteuid(), d.st_uid)


def _existing(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _write_through(path: Path, st: os.stat_result | None) -> bool:
    """Whether `path` is written in place: a device or pipe (/dev/null, a FIFO), or a link we may follow."""
    if st is None:
        return False
    if stat.S_ISLNK(st.st_mode):
        return _followable_link(path, st)
    return not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)


def open_recording(path: Path, keep_old: bool = False) -> tuple[BinaryIO, Path | None, bool]:
    """The file a recorder appends to, unbuffered (written as it goes, so it is at `path` from the start), where
    an older one went, and whether the file is new.  A regular file or a planted link already there is removed,
    or with `keep_old` becomes PATH.old as perf does with perf.data (a link renamed, never followed); a device,
    a pipe or a link we may follow (-o /dev/stdout) is written to in place."""
    st = _existing(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if _write_through(path, st):
        return open(path, "wb", buffering=0), None, False  # noqa: SIM115 - the caller closes it
    old = None
    if st is not None and keep_old:
        old = Path(f"{path}.old")
        os.replace(path, old)
    elif st is not None:
        os.unlink(path)
    return create_new(path, buffering=0), old, True


def write_file(path: Path, data: bytes | str | Iterable[str]) -> None:
    """All of `data` (or of its parts, written as they come) at `path`, atomically: a temporary file in the same
    folder (created exclusively, never through a link) renamed over it; devices and links we may follow are
    written in place."""
    path = Path(path)
    parts = [data] if isinstance(data, (str, bytes)) else data

    def write(f: BinaryIO) -> None:
        for part in parts:
            f.write(part.encode() if isinstance(part, str) else part)

    if _write_through(path, _existing(path)):
        with open(path, "wb") as f:
            write(f)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), file_mode())
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_line(path: Path, line: str) -> None:
    """One line appended to a log (created with file_mode(), never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
    with open(fd, "a") as f:
        f.write(line + "\n")


def check_writable(path: Path) -> str | None:
    """None when a file can be written at `path`, else why not (checked before a long measurement)."""
    path = Path(path)
    folder = path.parent
    st = _existing(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return f"{path} is a folder"
    if _write_through(path, st):
        return None if os.access(path, os.W_OK) else f"{path} cannot be written"
    if not folder.is_dir():
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} cannot be written"
    return None
