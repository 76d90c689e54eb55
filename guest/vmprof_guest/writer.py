"""Where a bundle goes: a folder, a tar file, or a tar stream on stdout."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import BinaryIO


class OutputError(RuntimeError):
    pass


class _Exactly(io.RawIOBase):
    """A file reader that yields exactly `size` bytes (zero-padded if the file shrank meanwhile)."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.left, self.short = f, size, False

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:
        n = min(len(buf), self.left)
        if n == 0:
            return 0
        data = self.f.read(n)
        if len(data) < n:
            self.short = True
            data += b"\0" * (n - len(data))
        buf[:n] = data
        self.left -= n
        return n


class Writer:
    def add_bytes(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def add_file(self, name: str, f: BinaryIO, size: int) -> bool:
        """Copy an open file; False if it changed size while being copied."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        self.close()


class DirWriter(Writer):
    """A bundle folder.  bundle.json is written last, atomically, so a reader never sees half a bundle."""

    def __init__(self, root: Path) -> None:
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise OutputError(f"{root} exists and is not an empty folder; choose a new path")
        (root / "objects").mkdir(parents=True, exist_ok=True)
        self.root = root

    def _target(self, name: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def add_bytes(self, name: str, data: bytes) -> None:
        target = self._target(name)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    def add_file(self, name: str, f: BinaryIO, size: int) -> bool:
        src = _Exactly(f, size)
        with open(self._target(name), "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        return not src.short

    def close(self) -> None:
        pass


class TarWriter(Writer):
    """A plain (uncompressed) tar, to a file or streamed to stdout (`-`)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.tmp: Path | None = None
        if target == "-":
            if sys.stdout.isatty():
                raise OutputError("refusing to write a tar archive to a terminal; redirect stdout or use -o PATH")
            self.tar = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        else:
            path = Path(target)
            if path.exists():
                raise OutputError(f"{path} exists; choose a new path")
            self.tmp = path.with_name(path.name + ".part")
            self.tar = tarfile.open(self.tmp, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self.now = int(time.time())

    def _info(self, name: str, size: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, self.now
        return info

    def add_bytes(self, name: str, data: bytes) -> None:
        self.tar.addfile(self._info(name, len(data)), io.BytesIO(data))

    def add_file(self, name: str, f: BinaryIO, size: int) -> bool:
        src = _Exactly(f, size)
        self.tar.addfile(self._info(name, size), io.BufferedReader(src))
        return not src.short

    def close(self) -> None:
        self.tar.close()
        if self.target == "-":
            sys.stdout.buffer.flush()
        elif self.tmp is not None:
            os.replace(self.tmp, self.target)

    def abort(self) -> None:
        try:
            self.tar.close()
        finally:
            if self.tmp is not None and self.tmp.exists():
                self.tmp.unlink()


def open_writer(target: str) -> Writer:
    if target == "-" or target.endswith(".tar"):
        return TarWriter(target)
    return DirWriter(Path(target))
