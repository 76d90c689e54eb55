"""What every reader of untrusted input in resolve/ shares: the bounds (`Limits`), the one-line error
(`BundleError`), text made safe for a terminal, and opening a file that must be a regular file.

Guest bundles, the ELF files in them (and on the host) and kallsyms texts all come through these, so
a hostile guest meets the same limits whichever reader it targets.  `BundleError` keeps its name for
all of them: callers catch one exception for "this input was rejected", and ELF and kallsyms errors
are rejections of (a part of) a bundle.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

U64_MAX = (1 << 64) - 1
PID_MAX = (1 << 31) - 1  # pids and tids: the kernel's are positive ints; the resolver keeps them as int32
MAX_NAME = 1024  # one symbol name (ELF or kallsyms)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one bundle may contain.  Defaults fit any real guest with room to spare."""

    max_index_bytes: int = 64 << 20  # bundle.json
    max_kallsyms_bytes: int = 64 << 20
    max_object_bytes: int = 512 << 20  # one object file
    max_total_bytes: int = 4 << 30  # everything in the bundle (decompressed)
    max_members: int = 100_000  # files in a tar or under objects/
    max_processes: int = 100_000
    max_maps_per_process: int = 100_000
    max_maps_total: int = 2_000_000
    max_symbols: int = 4_000_000  # kallsyms lines; symbols of one ELF file
    max_string: int = 4096  # one name, path or argument
    max_list: int = 100_000  # cmdline arguments, tids, modules, notes, cr3 values
    max_tar_header_bytes: int = 1 << 20  # one PAX or GNU long-name header
    max_elf_sections: int = 32_768
    max_elf_segments: int = 4_096


DEFAULT_LIMITS = Limits()


class BundleError(Exception):
    """A bundle (or one of its files) was rejected; str() is one line saying why."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def safe_text(value: str, limit: int) -> str:
    """Guest strings end up in terminals: no control characters, bounded length."""
    value = value[:limit]
    return value.translate(_CONTROL) if _CONTROL_RE.search(value) else value


_CONTROL = {i: "?" for i in [*range(32), 127]}
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


def open_regular(path: Path, limit: int, what: str) -> BinaryIO:
    """Open a file that must be a regular file (never through a final symlink) no larger than limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BundleError(f"{what} is a symbolic link; links are not followed") from None
        raise BundleError(f"{what}: cannot open: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BundleError(f"{what}: not a regular file")
    if st.st_size > limit:
        os.close(fd)
        raise BundleError(f"{what}: {st.st_size} bytes, over the limit of {limit}")
    return os.fdopen(fd, "rb")

